"""The history's rename box (`n`): one line to type a run's name in; enter saves it, escape leaves it as it was. And
its tag box (`t`): one line to type a tag in for the runs chosen.

Dismisses with the name typed ("" when the box was emptied: the run then has no name), or None when cancelled. A
current name that a terminal could act on (controls, escapes) is not put in the box, where it would be drawn raw:
the box starts empty and the line above shows that name escaped."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from gpuanat.core.printable import printable


class RenameScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="rename.cancel")]
    DEFAULT_CSS = """
    RenameScreen { align: center middle; }
    RenameScreen > Vertical { width: 70; max-width: 100%; height: auto; border: thick $primary; padding: 1 2;
                              background: $surface; }
    RenameScreen #rename-hint { color: $text-muted; }
    """

    def __init__(self, run_id: int, name: str | None) -> None:
        super().__init__()
        self._run_id = run_id
        self._name = name

    def compose(self) -> ComposeResult:
        shown = "no name" if self._name is None else f"now “{printable(self._name)}”"
        editable = self._name if self._name is not None and printable(self._name) == self._name else ""
        with Vertical():
            yield Label(Text(f"Name of run {self._run_id} ({shown})"))  # Text, not markup: the name is data
            yield Input(value=editable, placeholder="no name", id="rename-input")
            yield Label(Text("enter saves (empty: no name) · escape cancels"), id="rename-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class TagScreen(ModalScreen[str | None]):
    """Dismisses with the tag typed, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="tag.cancel")]
    DEFAULT_CSS = """
    TagScreen { align: center middle; }
    TagScreen > Vertical { width: 70; max-width: 100%; height: auto; border: thick $primary; padding: 1 2;
                           background: $surface; }
    TagScreen #tag-hint { color: $text-muted; }
    """

    def __init__(self, run_ids: list[int]) -> None:
        super().__init__()
        self._run_ids = run_ids

    def compose(self) -> ComposeResult:
        listed = ", ".join(map(str, self._run_ids))
        with Vertical():
            yield Label(Text(f"Tag run{'s' if len(self._run_ids) > 1 else ''} {listed}"))
            yield Input(placeholder="tag", id="tag-input")
            yield Label(Text("enter tags them · escape cancels"), id="tag-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)
