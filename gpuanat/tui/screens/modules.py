"""Memory by module (`b`): what each module of the model holds — the activations its forward pass saved for backward,
its own parameters, their gradients and their optimizer state — largest first, with "(the rest)" (the modules past
the probe's top ones) and "(no module)" last, and a row of the columns' sums, which are the bands.

Of the run in progress (its latest measured bands: steps 1-3, then every 50th), else of the last run (its result's
`modules`), or of the run under the history's cursor; in `gpuanat watch`, of the watched run's latest bands. After an
out-of-memory failure they are the failing allocation's, and the view says what failed. It follows the dashboard
while open. Scrolls, so it reads whole at 80×24; `b`, `escape` or `q` close it. Module paths come from the user's
model: shown through `printable`, as text.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console, ConsoleOptions, Group, RenderResult
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from gpuanat.core.measure.failure import modules_json, out_of_memory_json
from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.printable import printable
from gpuanat.core.store.report import MIB, format_bytes
from gpuanat.core.vocabulary.protocol import MODULES_REST, NO_MODULE
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.tui.widgets.failure_line import largest_tensor_sentence, out_of_memory_sentence

COLUMNS = (
    ("activations_bytes", "activations"),
    ("parameters_bytes", "parameters"),
    ("gradients_bytes", "gradients"),
    ("optimizer_state_bytes", "optimizer state"),
)
"""A module row's figures (`protocol.ModuleMemory`) and their headers, then the total."""
LAST_ROWS = (MODULES_REST, NO_MODULE)
"""Rows that are no module of their own: after the modules, in this order."""
MODEL_ROW = "(the model)"
"""How the model itself (its path "") is named."""
NOT_FOLLOWED = "its probe did not follow modules (a compiled model, or a probe older than memory by module)"
MEASURED_WHEN = "the probe measures memory by module at steps 1-3, then every 50th"


@dataclass(frozen=True)
class ModulesShown:
    """What the view shows: whose modules, at which moment, and why there are none."""

    title: str
    """Whose and when: "run 3 in progress, at step 2's peak (its forward pass's end)"."""
    modules: Sequence[Mapping[str, Any]] | None = None
    """Rows as a result's `modules` has them; None: none to show (`why_none` says why)."""
    failure: Mapping[str, Any] | None = None
    """An out-of-memory failure (a result's `out_of_memory`): the rows are then of its failing allocation."""
    why_none: str = ""


def shown_of_live(live: LiveRun) -> ModulesShown:
    """The run in progress: rank 0's latest measured bands, or its failure's."""
    who = f"run {live.run_id}" if live.run_id is not None else "the run"
    state = live.rank(0)
    bands = state.probe_bands
    failed = state.failure_shown
    if failed is not None:
        return ModulesShown(
            f"{who}, at the failing allocation",
            modules_json(bands),
            out_of_memory_json(failed, 0),
            f"{who}: {NOT_FOLLOWED}",
        )
    if bands is None:
        return ModulesShown(f"{who} in progress", why_none=f"{who} has not measured a step yet: {MEASURED_WHEN}")
    return ModulesShown(
        f"{who} in progress, at step {bands.measured_at_step}'s peak (its forward pass's end)",
        modules_json(bands),
        why_none=f"{who}: {NOT_FOLLOWED}",
    )


def shown_of_result(result: RunResult, run_id: int | None = None) -> ModulesShown:
    """A finished (or recorded) run: its result's `modules`, at its last measured step or its failure."""
    run_id = result.run_id if run_id is None else run_id
    who = f"run {run_id}" if run_id is not None else "the run"
    failure = result.out_of_memory
    moment = "at the failing allocation" if failure else "at its last measured step's peak"
    why = (
        NOT_FOLLOWED
        if result.status == "ok"
        else f"it ended ({printable(result.status)}) before its probe measured a step, or {NOT_FOLLOWED}"
    )
    return ModulesShown(
        f"{who} ({printable(result.status)}), {moment}", result.modules, failure, f"{who} recorded none: {why}"
    )


def module_rows(modules: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The rows with their totals, largest first; "(the rest)" and "(no module)" last."""
    rows = [{**row, "total_bytes": sum(row.get(key) or 0 for key, _ in COLUMNS)} for row in modules]
    named = [row for row in rows if row.get("module") not in LAST_ROWS]
    last = [row for row in rows if row.get("module") in LAST_ROWS]
    return sorted(named, key=lambda row: (-row["total_bytes"], row["module"])) + sorted(
        last, key=lambda row: LAST_ROWS.index(row["module"])
    )


def short_bytes(value: int | None) -> str:
    """Bytes as the bar writes them from a MiB on, and in KiB or B below (a tiny model's modules)."""
    if value is None:
        return "—"
    if value == 0:
        return "0"
    if abs(value) >= MIB:
        return format_bytes(value)
    return f"{value / 1024:.0f} KiB" if abs(value) >= 1024 else f"{value} B"


def wrapped_path(path: str, width: int) -> str:
    """A module path on lines of at most `width` cells, broken after its dots (a part longer than a line is folded
    by the table)."""
    lines = [""]
    for part in path.split("."):
        piece = part if lines[-1] == "" else "." + part
        if lines[-1] and len(lines[-1]) + len(piece) > width:
            room_for_the_dot = len(lines[-1]) < width
            lines[-1] += "." if room_for_the_dot else ""
            lines.append(part if room_for_the_dot else piece)
        else:
            lines[-1] += piece
    return "\n".join(lines)


class ModulesTable:
    """The rows as a table laid out for the width it is drawn at: the module paths take what the figures leave."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self._rows = rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        keys = [key for key, _ in COLUMNS] + ["total_bytes"]
        titles = [title for _, title in COLUMNS] + ["total"]
        totals = {key: sum(row.get(key) or 0 for row in self._rows) for key in keys}
        cells = [[short_bytes(row.get(key)) for key in keys] for row in [*self._rows, totals]]
        widths = [
            max(len(title) if " " not in title else 9, *(len(row[index]) for row in cells))
            for index, title in enumerate(titles)
        ]
        module_width = max(12, options.max_width - sum(width + 1 for width in widths))  # a space before each
        table = Table(box=box.SIMPLE_HEAD, padding=0, pad_edge=False, show_edge=False, expand=False)
        table.add_column("module", width=module_width, overflow="fold")
        for title, width in zip(titles, widths, strict=True):
            table.add_column(title.replace(" ", "\n"), justify="right", width=width, no_wrap=True)
        for index, (row, figures) in enumerate(zip(self._rows, cells, strict=False)):
            module = row.get("module") or MODEL_ROW
            style = "dim" if module in LAST_ROWS else ""
            table.add_row(
                Text(wrapped_path(printable(module), module_width), style=style),
                *(Text(figure, style=style) for figure in figures),
                end_section=index == len(self._rows) - 1,
            )
        table.add_row(Text("all: the bands"), *(Text(figure) for figure in cells[-1]), style="bold")
        yield table


class ModulesScreen(ModalScreen[None]):
    """Memory by module of one run (`ModulesShown`); `show` brings it up to date while the view follows the
    dashboard. Notifications wait while it is open, as on the key page."""

    BINDINGS = [Binding("b,escape,q", "close", "Close", id="modules.close")]
    DEFAULT_CSS = """
    ModulesScreen { align: center middle; }
    ModulesScreen > VerticalScroll { width: 110; max-width: 100%; height: auto; max-height: 100%;
                                     border: round $primary; background: $surface; padding: 0 0 0 1;
                                     scrollbar-size-vertical: 1; }
    ModulesScreen #modules-failure { color: $error; text-style: bold; }
    ModulesScreen .-muted { color: $text-muted; }
    ModulesScreen Toast { display: none; }
    """

    def __init__(self, shown: ModulesShown, *, follows_dashboard: bool) -> None:
        """`follows_dashboard`: the view shows the dashboard's run and takes its updates (not a run of the
        history)."""
        super().__init__()
        self._shown = shown
        self.follows_dashboard = follows_dashboard

    @property
    def shown(self) -> ModulesShown:
        return self._shown

    @property
    def rows(self) -> list[dict[str, Any]]:
        """The rows shown, in their order (each with its `total_bytes`)."""
        return module_rows(self._shown.modules or [])

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(id="modules-title")
            yield Static(id="modules-failure")
            yield Static(id="modules-largest", classes="-muted")
            yield Static(id="modules-table")
            yield Static("b, esc or q closes this view", classes="-muted")

    def on_mount(self) -> None:
        self._paint()

    def show(self, shown: ModulesShown) -> None:
        """Show `shown` (the dashboard's run, newly measured); the same again costs nothing."""
        if shown != self._shown:
            self._shown = shown
            self._paint()

    def _paint(self) -> None:
        shown = self._shown
        self.query_one("#modules-title", Static).update(
            Text.assemble(("Memory by module", "bold"), " — ", printable(shown.title))
        )
        failure = self.query_one("#modules-failure", Static)
        largest = self.query_one("#modules-largest", Static)
        failure.display = largest.display = shown.failure is not None
        if shown.failure is not None:
            failure.update(Text(printable(out_of_memory_sentence(shown.failure))))
            largest.update(Text(printable(largest_tensor_sentence(shown.failure) or "")))
        self.query_one("#modules-table", Static).update(self._table(shown))

    @staticmethod
    def _table(shown: ModulesShown) -> Any:
        if shown.modules is None:
            return Text(printable(shown.why_none), style="italic")
        return Group(
            Text(
                "activations: what a module's forward pass saved for backward; parameters: its own; each column sums "
                "to its band",
                style="dim",
            ),
            ModulesTable(module_rows(shown.modules)),
        )

    def action_close(self) -> None:
        self.dismiss()
