"""The data box (`d`): the next runs' --data and --tokenizer, typed; enter keeps them, escape leaves them as they were.

Dismisses with the (data, tokenizer) typed — an empty data box means the docs' random token ids, an empty tokenizer
box the model's own — or None when cancelled. What the box holds is checked when the run starts: a path that cannot
be read fails that run with one line naming the flag (docs/data.md). A current value a terminal could act on
(controls, escapes) is not put in a box, where it would be drawn raw: the box starts empty and the line above shows
it escaped."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label

from gpuanat.core.printable import printable


def _editable(value: str | None) -> str:
    return value if value is not None and printable(value) == value else ""


class DataScreen(ModalScreen[tuple[str | None, str | None] | None]):
    BINDINGS = [Binding("escape", "cancel", "Cancel", id="data.cancel")]
    DEFAULT_CSS = """
    DataScreen { align: center middle; }
    DataScreen > Vertical { width: 90; max-width: 100%; height: auto; border: thick $primary; padding: 1 2;
                            background: $surface; }
    DataScreen .data-hint { color: $text-muted; }
    """

    def __init__(self, data: str | None, tokenizer: str | None) -> None:
        super().__init__()
        self._data = data
        self._tokenizer = tokenizer

    def compose(self) -> ComposeResult:
        now = "random token ids" if self._data is None else f"now “{printable(self._data)}”"
        with Vertical():
            yield Label(Text(f"Data of the next runs ({now})"))  # Text, not markup: the path is data
            yield Input(
                value=_editable(self._data),
                placeholder="file (.jsonl .json .csv .parquet .arrow), saved dataset directory or cached Hub name",
                id="data-input",
            )
            tokenizer = "the model's" if self._tokenizer is None else f"now “{printable(self._tokenizer)}”"
            yield Label(Text(f"Tokenizer ({tokenizer}; a preset has none)"))
            yield Input(
                value=_editable(self._tokenizer),
                placeholder="tokenizer directory or cached Hub name",
                id="tokenizer-input",
            )
            yield Label(Text("enter keeps both (empty data: random token ids) · escape cancels"), classes="data-hint")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        data = self.query_one("#data-input", Input).value.strip()
        tokenizer = self.query_one("#tokenizer-input", Input).value.strip()
        self.dismiss((data or None, tokenizer or None))

    def action_cancel(self) -> None:
        self.dismiss(None)
