"""A yes/no question, dismissed with True or False; and the quit question, which the quit key answers yes."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label

from gpuanat.core.printable import printable


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [
        Binding("y", "answer(True)", "Yes", id="confirm.yes"),
        Binding("n,escape", "answer(False)", "No", id="confirm.no"),
    ]
    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: auto; max-width: 70; height: auto; border: thick $warning; padding: 1 2;
                               background: $surface; }
    """

    def __init__(self, question: str, details: list[str] | None = None) -> None:
        """`details`: lines under the question (what it is about: the runs a delete deletes), each shown printable."""
        super().__init__()
        self._question = question
        self._details = details or []

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(Text(printable(self._question)))  # Text, not markup: it may name a model path
            for line in self._details:
                yield Label(Text(printable(line)), classes="confirm-detail")
            yield Label(Text.assemble(("y", "bold"), " yes · ", ("n", "bold"), " no"))

    def action_answer(self, answer: bool) -> None:
        self.dismiss(answer)


class QuitQuestion(ConfirmScreen):
    """ "Stop it and quit?": the quit key pressed again answers yes. Its binding has the dashboard's quit binding's id,
    so a remapped quit key answers it too (ctrl+c, a priority binding of the app, reaches the app's quit anyway)."""

    BINDINGS = [Binding("q", "answer(True)", "Yes, quit", id="quit")]
