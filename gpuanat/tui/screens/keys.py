"""gpuanat's own key page (`?`): every key of the dashboard in use now — remapped ones as remapped — grouped, each
technique with what it does in one line. Scrolls, so it reads whole at 80×24; `?`, `escape` or `q` close it."""

from __future__ import annotations

import re
from typing import Any

from rich.table import Table
from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from gpuanat.core.printable import printable
from gpuanat.core.vocabulary.techniques import TECHNIQUES_BY_FIELD

TECHNIQUE_ACTION = re.compile(r"^(?:toggle_technique|step)\('(\w+)'")
"""The technique a binding's action changes: toggle_technique('precision'), step('batch_size', 1)."""
CYCLING_ACTIONS = {"cycle_gpus": "gpus", "cycle_distributed": "distributed", "choose_data": "data"}
"""Actions that change a technique their own way (several GPUs, the data typed in a box)."""
GROUPS = ("Runs", "Techniques of the next run", "Views")
REMAP_HELP = (
    "Keys can be remapped in $XDG_CONFIG_HOME/gpuanat/config.toml (~/.config/gpuanat/config.toml): a [keymap] "
    'table of binding ids and their keys, one a line, e.g. run = "f5" or batch_up = "u,plus". The ids: a '
    "technique's field (grad_checkpointing, precision, optim, attn, compile, …), batch_up/batch_down, "
    "accum_up/accum_down, samples_up/samples_down, run, stop, fit, tune, history, compare, help, quit."
)
"""How to remap keys, on the key page itself."""
VIEW_ACTIONS = {
    "history",
    "modules",
    "compare",
    "pause",
    "redraw",
    "help",
    "quit",
    "command_palette",
    "save",
    "toggle_timeline",
    "why_unavailable",
}


def key_rows(app: App[Any]) -> dict[str, list[tuple[str, str]]]:
    """(keys, what they do) of every binding of `app` in use now, by group."""
    by_action: dict[str, tuple[list[str], Binding]] = {}
    for key, active in app.active_bindings.items():
        binding = active.binding
        if binding.id is None and binding.action != "command_palette":
            continue  # Textual's own (scrolling, focus, copying): not gpuanat's keys
        keys, _ = by_action.setdefault(binding.action, ([], binding))
        shown = (
            binding.key_display
            if binding.key_display and key == binding.key.split(",")[0]
            else app.get_key_display(Binding(key, binding.action))
        )
        keys.append(shown)
    groups: dict[str, list[tuple[str, str]]] = {group: [] for group in GROUPS}
    for action, (keys, binding) in by_action.items():
        technique = TECHNIQUE_ACTION.match(action)
        field = technique.group(1) if technique else CYCLING_ACTIONS.get(action)
        what = binding.description
        if field is not None:
            info = TECHNIQUES_BY_FIELD.get(field)
            what = f"{binding.description} — {info.help}" if info else binding.description
            group = "Techniques of the next run"
        elif action.split("(")[0] in VIEW_ACTIONS or action.startswith("app."):
            group = "Views"
        else:
            group = "Runs"
        groups[group].append((" ".join(dict.fromkeys(keys)), what))
    return groups


class KeysScreen(ModalScreen[None]):
    """Every key, grouped (`key_rows` of the dashboard, read before this page covers it); scrolls. Notifications wait
    while it is open: they show again on the dashboard, if still due."""

    BINDINGS = [Binding("question_mark,escape,q", "dismiss_keys", "Close", id="keys.close")]
    DEFAULT_CSS = """
    KeysScreen { align: center middle; }
    KeysScreen > VerticalScroll { width: 100; max-width: 100%; height: auto; max-height: 100%;
                                  border: round $primary; background: $surface; padding: 0 1; }
    KeysScreen Toast { display: none; }  /* a notification would cover the lines being read */
    """

    def __init__(self, rows: dict[str, list[tuple[str, str]]]) -> None:
        super().__init__()
        self._rows = rows

    @property
    def rows(self) -> dict[str, list[tuple[str, str]]]:
        return self._rows

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(self._page())

    def _page(self) -> Table:
        page = Table.grid(padding=(0, 1))
        page.add_column(justify="right", no_wrap=True, style="bold")
        page.add_column()
        for group, rows in self._rows.items():
            if not rows:
                continue
            page.add_row("", Text(group, style="bold underline"))
            for keys, what in rows:  # Text, not markup: "pip install 'gpuanat[llm]'" keeps its brackets
                page.add_row(Text(printable(keys)), Text(printable(what)))
        page.add_row("", Text("? esc or q closes this page", style="dim"))
        # The remapping said here in full: a pip install has no docs/ to point at (issue #48).
        page.add_row("", Text(REMAP_HELP, style="dim"))
        return page

    def action_dismiss_keys(self) -> None:
        self.dismiss()
