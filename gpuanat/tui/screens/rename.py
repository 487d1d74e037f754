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


class LinePromptScreen(ModalScreen[str | None]):
    """A box of one line to type in over the history: a title, the line, a hint; enter dismisses with what was typed,
    escape with None. Subclasses give `prompt` and `BINDINGS` (their escape, under an id of their own)."""

    DEFAULT_CSS = """
    LinePromptScreen { align: center middle; }
    LinePromptScreen > Vertical { width: 70; max-width: 100%; height: auto; border: thick $primary; padding: 1 2;
                                  background: $surface; }
    LinePromptScreen .prompt-hint { color: $text-muted; }
    """
    NAME = "prompt"
    """The input's id is NAME-input, the hint's NAME-hint."""

    def prompt(self) -> tuple[str, str, str, str]:
        """The title, the input's value and placeholder, the hint."""
        raise NotImplementedError

    def compose(self) -> ComposeResult:
        title, value, placeholder, hint = self.prompt()
        with Vertical():
            yield Label(Text(title))  # Text, not markup: names are data
            yield Input(value=value, placeholder=placeholder, id=f"{self.NAME}-input")
            yield Label(Text(hint), id=f"{self.NAME}-hint", classes="prompt-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class RenameScreen(LinePromptScreen):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="rename.cancel")]
    NAME = "rename"

    def __init__(self, run_id: int, name: str | None) -> None:
        super().__init__()
        self._run_id = run_id
        self._name = name

    def prompt(self) -> tuple[str, str, str, str]:
        shown = "no name" if self._name is None else f"now “{printable(self._name)}”"
        editable = self._name if self._name is not None and printable(self._name) == self._name else ""
        return (
            f"Name of run {self._run_id} ({shown})",
            editable,
            "no name",
            "enter saves (empty: no name) · escape cancels",
        )


class TagScreen(LinePromptScreen):
    """Dismisses with the tag typed, or None when cancelled."""

    BINDINGS = [Binding("escape", "cancel", "Cancel", id="tag.cancel")]
    NAME = "tag"

    def __init__(self, run_ids: list[int]) -> None:
        super().__init__()
        self._run_ids = run_ids

    def prompt(self) -> tuple[str, str, str, str]:
        listed = ", ".join(map(str, self._run_ids))
        return (
            f"Tag run{'s' if len(self._run_ids) > 1 else ''} {listed}",
            "",
            "tag",
            "enter tags them · escape cancels",
        )
