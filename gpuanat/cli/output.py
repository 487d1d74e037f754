"""What the headless commands write goes through `printable`: no string from outside reaches the terminal raw.

`main` wraps stdout and stderr for the whole command, so every line a command prints — a summary naming the
user's model, an error quoting a child's message, argparse's usage — is made printable on its way out, by the
same helper the dashboards use. gpuanat's own lines hold no controls, so they pass unchanged; JSON output is
ASCII (its encoder escapes controls), so it passes byte for byte. Newlines, and CSV's CRLF line ends, are the
output's layout and are kept; a lone carriage return (which would draw over the line) is escaped.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import TextIO

from gpuanat.core.printable import printable


class PrintableStream(io.TextIOBase):
    """A text stream that writes `printable(text)` to the stream it wraps."""

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self.unguarded = stream
        """The wrapped stream, for a writer that escapes its values itself and adds its own styles (Rich)."""

    def write(self, text: str) -> int:
        self.unguarded.write("\r\n".join(printable(line, keep="\n") for line in text.split("\r\n")))
        return len(text)

    def flush(self) -> None:
        self.unguarded.flush()

    def isatty(self) -> bool:
        return self.unguarded.isatty()

    def fileno(self) -> int:
        return self.unguarded.fileno()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.unguarded, "encoding", "utf-8")


def unguarded(stream: TextIO) -> TextIO:
    """The stream under a PrintableStream (the stream itself otherwise)."""
    return stream.unguarded if isinstance(stream, PrintableStream) else stream


@contextlib.contextmanager
def printable_output() -> Iterator[None]:
    """sys.stdout and sys.stderr made printable while a command runs (restored after, also on an error)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = PrintableStream(sys.stdout), PrintableStream(sys.stderr)
    try:
        yield
    finally:
        for guarded in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                guarded.flush()
        sys.stdout, sys.stderr = saved
