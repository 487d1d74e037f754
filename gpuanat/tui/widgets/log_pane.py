"""The child's stdout/stderr, read from its log file: ANSI colours kept (every other escape shown as text),
tqdm's carriage returns folded."""

from __future__ import annotations

import codecs
from pathlib import Path
from typing import BinaryIO

from rich.text import Text
from textual.widgets import RichLog

from gpuanat.core.printable import printable, printable_keeping_colours


def complete_lines(chunk: str) -> tuple[list[str], str]:
    """Split new log text into finished lines and the unfinished rest. A line redrawn with carriage
    returns (tqdm) keeps only its last state, also while unfinished, so the rest never grows."""
    *lines, rest = chunk.split("\n")
    return [line.rsplit("\r", 1)[-1] for line in lines], rest.rsplit("\r", 1)[-1]


class LogPane(RichLog):
    """Follows a log file; the app calls `poll` at its paint tick (reads are small and non-blocking)."""

    COMPONENT_CLASSES = {"log-pane--note"}
    DEFAULT_CSS = """
    LogPane { border: round $primary; height: 1fr; }
    LogPane > .log-pane--note { color: $text-muted; text-style: italic; }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id, max_lines=2000, wrap=False, markup=False, highlight=False)
        self.border_title = "Log"
        self._path: Path | None = None
        self._file: BinaryIO | None = None
        self._partial = ""
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def follow(self, path: Path) -> None:
        self.clear()
        self._close()
        self._path, self._partial = path, ""
        self._decoder.reset()
        self.border_title = Text(f"Log · {printable(path.name)}")  # Text, not markup

    def note(self, text: str) -> None:
        """A line of gpuanat's own between the training process's lines (where the run's start-up is); escaped, as
        it may quote a string from outside (a cold start's reason quotes a process's output)."""
        self.write(Text(printable(text), style=self.get_component_rich_style("log-pane--note")))

    def _close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def on_unmount(self) -> None:
        self._close()

    def poll(self) -> None:
        """Read what the log gained since the last call (the file stays open between ticks)."""
        if self._path is None:
            return
        try:
            if self._file is None:
                self._file = open(self._path, "rb")  # noqa: SIM115 (kept open across paint ticks)
            data = self._file.read(256 * 1024)
        except OSError:
            return
        if not data:
            return
        # The incremental decoder keeps a UTF-8 character split across two reads whole.
        lines, self._partial = complete_lines(self._partial + self._decoder.decode(data))
        for line in lines:
            # Colours become styles; any other escape a child (or its user's input) wrote is shown, not sent.
            self.write(Text.from_ansi(printable_keeping_colours(line)))
