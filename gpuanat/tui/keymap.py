"""User key remapping: `[keymap]` in $XDG_CONFIG_HOME/gpuanat/config.toml maps binding ids to keys.

    [keymap]
    run = "f5"            # r -> F5
    batch_up = "ctrl+up,plus"

Binding ids are those of the apps the file configures (the dashboard's GpuAnatApp and the watch dashboard's
WatchApp). A key is written as Textual names the keys it reads from a terminal: a named key (`f5`, `up`,
`enter`, `space`), one printable character (`u`, `A`, `+`) or that character's name (`plus`,
`question_mark`), after any of the modifiers `alt+ ctrl+ hyper+ meta+ shift+ super+`, in that order;
several keys for one binding are separated by commas.

Textual takes any keymap silently: a key it never reports leaves the action without a key, and a key given
to two actions runs only one of them. Both are refused here, before an app starts, with one line that says
where and why.
"""

from __future__ import annotations

import difflib
import os
import tomllib
import unicodedata
from collections.abc import Iterable, Mapping
from pathlib import Path

from textual.binding import Binding
from textual.dom import DOMNode
from textual.keys import KEY_TO_UNICODE_NAME, REPLACED_KEYS, Keys
from textual.screen import Screen

# The named keys terminals report through the kitty keyboard protocol (media keys, f25-f35, ...) and Textual's name
# for a typed character come from Textual's private modules, quarantined there; the legacy sequences report the
# names in `Keys`.
from gpuanat.tui.textual_internals import FUNCTIONAL_KEY_NAMES, character_to_key

MODIFIERS = ("alt", "ctrl", "hyper", "meta", "shift", "super")
"""Textual names a key with its modifiers sorted, so `ctrl+shift+up` is reported and `shift+ctrl+up` never."""
NAMED_KEYS = frozenset(
    {key.value.rpartition("+")[2] for key in Keys if not key.value.startswith("<") and "-" not in key.value}
    | FUNCTIONAL_KEY_NAMES
)
"""Keys with a name rather than a character (`Keys`' `<any>`-style markers are no keys a user presses)."""


class KeymapError(ValueError):
    """The config file cannot be used; the message says where and why, in one line."""


def default_config_path() -> Path:
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "gpuanat" / "config.toml"


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _named_character(name: str) -> str | None:
    """The printable character whose Unicode name `name` spells (`plus_sign`, `question_mark`), also in
    Textual's short forms (`plus`, `minus`, `at`), or None."""
    original = REPLACED_KEYS.get(name, name)
    try:
        character = unicodedata.lookup(KEY_TO_UNICODE_NAME.get(original, original.replace("_", " ").upper()))
    except KeyError:
        return None
    return character if character.isprintable() else None


def textual_key(key: str) -> str:
    """`key` as Textual names it (a single character becomes its name: "+" -> "plus"); ValueError saying
    why when Textual never reports such a key."""
    *modifiers, base = key.split("+") if len(key) > 1 else [key]
    if not base:
        raise ValueError(
            "a key name is empty (write '+' as 'plus')"
            if modifiers
            else "a key name is empty (keys are separated by commas: write ',' as 'comma')"
        )
    unknown = [modifier for modifier in modifiers if modifier not in MODIFIERS]
    if unknown:
        raise ValueError(f"{unknown[0]!r} is not a modifier (they are {', '.join(MODIFIERS)})")
    if len(set(modifiers)) != len(modifiers) or modifiers != sorted(modifiers):
        raise ValueError(
            f"Textual reports modifiers once each and in the order {'+'.join(MODIFIERS)}: "
            f"write {'+'.join([*sorted(set(modifiers)), base])!r}"
        )
    if len(base) == 1:
        if not base.isprintable():
            raise ValueError(f"{base!r} is not a printable character")
        if modifiers == ["shift"] and not base.isspace():
            raise ValueError(
                "Textual reports shift and a character as the character typed"
                + (f": write {base.upper()!r}" if base.isalpha() else "")
            )
        if modifiers and base.isupper():
            raise ValueError(
                "after a modifier Textual reports a letter in lower case: write "
                f"{'+'.join([*sorted({*modifiers, 'shift'}), base.lower()])!r}"
            )
        base = character_to_key(base)
    elif base not in NAMED_KEYS:
        character = _named_character(base)
        if character is not None and character_to_key(character) != base:
            raise ValueError(f"Textual names that key {character_to_key(character)!r}, not {base!r}")
        if character is None:
            close = difflib.get_close_matches(base.lower(), sorted(NAMED_KEYS), n=1)
            raise ValueError(f"Textual has no key named {base!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    return "+".join([*modifiers, base])


def app_bindings(app_class: type[DOMNode], *focusable: type[DOMNode]) -> list[Binding]:
    """The key bindings in force on an app's default screen, one per key and node, merged as Textual merges
    them: the BINDINGS of the app's classes (Textual's App included; a subclass's binding of a key replaces
    its base's; the command palette's key), of the Screen and of the widgets in `focusable`, those that can
    hold the focus there (the focused widget and the screen are asked before the app)."""
    bindings: list[Binding] = []
    node_classes: tuple[type[DOMNode], ...] = (app_class, Screen, *focusable)
    for node_class in node_classes:
        by_key: dict[str, list[Binding]] = {}
        for base in reversed(node_class.__mro__):
            if issubclass(base, DOMNode) and "BINDINGS" in base.__dict__:
                of_class: dict[str, list[Binding]] = {}
                for binding in Binding.make_bindings(base.__dict__["BINDINGS"]):
                    of_class.setdefault(binding.key, []).append(binding)
                by_key.update(of_class)
        bindings.extend(binding for key_bindings in by_key.values() for binding in key_bindings)
    if getattr(app_class, "ENABLE_COMMAND_PALETTE", False) and not any(
        binding.action in ("command_palette", "app.command_palette") for binding in bindings
    ):
        # added by App.__init__, not in any BINDINGS
        bindings.append(Binding(app_class.COMMAND_PALETTE_BINDING, "command_palette", priority=True))  # type: ignore[attr-defined]
    return bindings


def gpuanat_apps() -> dict[str, list[Binding]]:
    """The apps the config file's [keymap] configures, by the name a message gives them, with their
    bindings (`app_bindings`; the dashboard's log pane is the one widget of either that takes the focus)."""
    from gpuanat.tui.app import GpuAnatApp
    from gpuanat.tui.watch_app import WatchApp
    from gpuanat.tui.widgets.log_pane import LogPane

    return {"dashboard": app_bindings(GpuAnatApp, LogPane), "watch dashboard": app_bindings(WatchApp)}


def _read_table(path: Path) -> dict[str, object] | None:
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise KeymapError(f"{path}: cannot read the file: {error.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise KeymapError(
            f"{path}: not UTF-8 text (byte 0x{raw[error.start]:02x} on line {line}); a TOML file is UTF-8"
        ) from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise KeymapError(_one_line(f"{path}: not valid TOML: {error}")) from None


def load_keymap(path: Path, apps: Mapping[str, Iterable[Binding]]) -> dict[str, str]:
    """The [keymap] table of `path`, each key in Textual's form (empty when the file does not exist).

    `apps` names each app the file configures with its bindings (`gpuanat_apps`): a binding id must belong
    to one of them, and within each app no key may be left with two actions (a remapped key against another
    binding's key, default or remapped). KeymapError, one line, for anything else.
    """
    data = _read_table(path)
    if data is None:
        return {}
    table = data.get("keymap", {})
    if not isinstance(table, dict) or not all(isinstance(value, str) for value in table.values()):
        raise KeymapError(f'{path}: [keymap] must map binding ids to key strings, e.g. run = "f5"')
    app_bindings_by_name = {name: list(bindings) for name, bindings in apps.items()}
    known_ids = {binding.id for bindings in app_bindings_by_name.values() for binding in bindings if binding.id}
    unknown = sorted(set(table) - known_ids)
    if unknown:
        raise KeymapError(
            _one_line(f"{path}: unknown binding id {unknown[0]!r} in [keymap]; known: {', '.join(sorted(known_ids))}")
        )
    keymap: dict[str, list[str]] = {}
    for binding_id, keys in table.items():
        assert isinstance(keys, str)
        try:
            keymap[binding_id] = list(dict.fromkeys(textual_key(key.strip()) for key in keys.split(",")))
        except ValueError as error:
            raise KeymapError(_one_line(f"{path}: [keymap] {binding_id} = {keys!r}: {error}")) from None
    for app_name, bindings in app_bindings_by_name.items():
        _refuse_conflicts(path, app_name, bindings, keymap)
    return {binding_id: ",".join(keys) for binding_id, keys in keymap.items()}


def _refuse_conflicts(path: Path, app_name: str, bindings: list[Binding], keymap: dict[str, list[str]]) -> None:
    """KeymapError when, with `keymap` applied to `bindings` as Textual applies it (a remapped binding leaves
    its default keys), a remapped key would have two different actions."""
    ids = {binding.id for binding in bindings if binding.id}
    actions_by_key: dict[str, dict[str, str]] = {}
    """key -> {action: the binding id, or the action where the binding has none}"""
    for binding in bindings:
        if binding.id not in keymap:
            actions_by_key.setdefault(binding.key, {}).setdefault(binding.action, binding.id or binding.action)
    remapped = {binding.id: binding.action for binding in bindings if binding.id in keymap}
    for binding_id, keys in keymap.items():
        if binding_id not in ids:
            continue
        for key in keys:
            others = {
                action: name for action, name in actions_by_key.get(key, {}).items() if action != remapped[binding_id]
            }
            if others:
                other = next(iter(others.values()))
                raise KeymapError(
                    f"{path}: [keymap] key {key!r} would run both {binding_id!r} and {other!r} "
                    f"in the {app_name}; give one of them another key"
                )
            actions_by_key.setdefault(key, {})[remapped[binding_id]] = binding_id
