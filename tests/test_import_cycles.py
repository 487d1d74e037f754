"""No module of gpuanat imports another in a cycle: data flows one way, from low rooms to high ones.

The import graph is read statically with `ast` from every module under gpuanat/, imports at the top and inside
functions alike: a lazy import inside a function hides a cycle from Python at import time, not from this test.
An import names the module it reads (`from gpuanat.core.vocabulary import config` is
gpuanat.core.vocabulary.config; `from gpuanat.core.vocabulary.config import RunConfig` is that module too); a
package's `__init__` counts only where it is named itself. An import under `if TYPE_CHECKING:` never runs: it makes
no cycle (a helper may name the screen that owns it in its annotations), but it is an arrow between rooms all the same.

Beyond modules, `core/`'s folders stand in floors (`CORE_FLOORS`): a folder imports only from floors below its own,
so no arrow runs back up between them, and two rooms of one floor never import each other.
"""

from __future__ import annotations

import ast
from collections.abc import Collection
from pathlib import Path

import gpuanat

PACKAGE = Path(gpuanat.__file__).parent


def module_files() -> dict[str, Path]:
    """Every module of gpuanat by its dotted name, found on disk, so a new one cannot be left out."""
    modules = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def imported_modules(node: ast.Import | ast.ImportFrom, package: str, modules: Collection[str]) -> set[str]:
    """The modules of gpuanat one import statement reads, relative imports resolved against `package`."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            parent = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*parent, base] if base else parent)
        # `from a.b import c`: the module a.b.c where c is one, else a.b, which holds the name c
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    found = set()
    for name in names:
        while name and name not in modules:  # outside gpuanat: nothing left
            name = name.rpartition(".")[0]
        if name:
            found.add(name)
    return found


def type_checking_only(tree: ast.Module) -> set[int]:
    """The ids of the nodes under `if TYPE_CHECKING:` (or `typing.TYPE_CHECKING`) anywhere in `tree`."""
    inside: set[int] = set()
    for node in ast.walk(tree):
        test = node.test if isinstance(node, ast.If) else None
        if (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
            isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
        ):
            inside.update(id(child) for statement in node.body for child in ast.walk(statement))
    return inside


def import_graph(*, type_checking: bool = True) -> dict[str, set[str]]:
    """Each module of gpuanat and the modules of gpuanat it imports, anywhere in its code; without the imports made
    for annotations only when `type_checking` is False."""
    modules = module_files()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        skipped = set() if type_checking else type_checking_only(tree)
        graph[name] = {
            imported
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in skipped
            for imported in imported_modules(node, package, modules)
        } - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): each holds a cycle."""
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in sorted(graph[module]):
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            component = stack[stack.index(module) :]
            del stack[stack.index(module) :]
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(graph):
        if module not in order:
            visit(module)
    return found


def test_the_graph_holds_top_level_and_lazy_imports():
    graph = import_graph()
    assert "gpuanat.core.vocabulary.config" in graph["gpuanat.core.measure.gpus"]  # at the top
    assert "gpuanat.core.run.tune.search" in graph["gpuanat.cli.tune"]  # inside a function
    assert "gpuanat.core.measure.gpus" in graph["gpuanat.core.run.session"]


def test_the_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_an_import_for_annotations_only_is_found_and_told_apart():
    tree = ast.parse(
        "from typing import TYPE_CHECKING\nimport typing\nimport a\nif TYPE_CHECKING:\n    import b\n"
        "if typing.TYPE_CHECKING:\n    from c import d\nelse:\n    import e\n"
    )
    names = {
        alias.name if isinstance(node, ast.Import) else node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom) and id(node) in type_checking_only(tree)
        for alias in node.names
    }
    assert names == {"b", "c"}
    graph = import_graph()
    assert "gpuanat.tui.screens.launch" in graph["gpuanat.tui.run_keys"]  # the screen its keys belong to
    assert "gpuanat.tui.screens.launch" not in import_graph(type_checking=False)["gpuanat.tui.run_keys"]


def test_no_module_imports_another_in_a_cycle():
    assert cycles(import_graph(type_checking=False)) == []


CORE_FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"vocabulary", "printable", "percent", "thread_names", "heap"}),
    frozenset({"operations", "memory"}),
    frozenset({"measure"}),
    frozenset({"store"}),
    frozenset({"watch", "export"}),
    frozenset({"run"}),
)
"""`core/`'s rooms from the ground up: the run's vocabulary (and the root's plain helpers); the memory model and the
operations' classes; measuring; the history; the watch and the exporters; orchestration (runner, session, fit,
tune). A room is a folder of `core/` or a module at its root."""


def core_room(module: str) -> str | None:
    """The room of `core/` a module stands in (`gpuanat.core.measure.samples` → measure), None outside `core/`."""
    parts = module.split(".")
    return parts[2] if parts[:2] == ["gpuanat", "core"] and len(parts) > 2 else None


def arrows_against_the_floors(graph: dict[str, set[str]], floors: tuple[frozenset[str], ...]) -> list[str]:
    """Each import between rooms of `core/` that does not run down to a lower floor, as `module -> module`."""
    floor_of = {room: level for level, rooms in enumerate(floors) for room in rooms}
    wrong = []
    for module, imported in sorted(graph.items()):
        room = core_room(module)
        for target in sorted(imported):
            target_room = core_room(target)
            if room is None or target_room is None or target_room == room:
                continue
            if floor_of[target_room] >= floor_of[room]:
                wrong.append(f"{module} -> {target}")
    return wrong


def test_every_room_of_core_has_a_floor():
    rooms = {room for module in import_graph() if (room := core_room(module))}
    assert rooms == set().union(*CORE_FLOORS)


def test_the_floor_check_finds_an_arrow_up_and_one_sideways():
    floors = (frozenset({"vocabulary"}), frozenset({"memory", "operations"}), frozenset({"run"}))
    graph = {
        "gpuanat.core.vocabulary.config": {"gpuanat.core.run.session"},
        "gpuanat.core.memory.predict": {"gpuanat.core.operations.anatomy", "gpuanat.core.vocabulary.config"},
        "gpuanat.core.run.session": {"gpuanat.core.memory.predict", "gpuanat.core.run.runner"},
    }
    assert arrows_against_the_floors(graph, floors) == [
        "gpuanat.core.memory.predict -> gpuanat.core.operations.anatomy",
        "gpuanat.core.vocabulary.config -> gpuanat.core.run.session",
    ]


def test_no_import_runs_back_up_between_the_folders_of_core():
    assert arrows_against_the_floors(import_graph(), CORE_FLOORS) == []
