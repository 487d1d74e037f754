"""Strings an attacker on the same box controls, and the checks that none of them reaches a terminal raw.

What each payload would do if it were written to a terminal: set the window title (OSC 0/2), make a hyperlink
(OSC 8), write the clipboard (OSC 52), clear the screen or move the cursor (CSI), ring the bell, hide or reorder
text (NUL, DEL, bidi overrides), start a sequence in 8-bit form (C1), be bytes that are not UTF-8, be very long,
or be Rich/Textual markup that styles, links or runs an action.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

TITLE = "\x1b]2;PWNED\x07\x1b[5m"
"""The process name of the issue: 15 bytes, as `prctl(PR_SET_NAME)` takes it (the kernel keeps 15)."""

CONTROL_PAYLOADS = {
    "osc0": "\x1b]0;PWNED\x07",
    "osc2": "\x1b]2;PWNED\x07",
    "osc8": "\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\",
    "osc52": "\x1b]52;c;cm0gLXJmIH4K\x07",
    "clear": "\x1b[2J\x1b[H",
    "cursor": "\x1b[10A\x1b[5C",
    "blink": "\x1b[5m",
    "bel_nul_del": "a\x07b\x00c\x7fd",
    "c1": "\x9b31m\x9d0;PWNED\x9c",
    "bidi": "abc\u202edcba\u2066x\u2069",
    "not_utf8": "name\udcff\udcfe",
    "newline": "one\ntwo\rthree",
}
MARKUP_PAYLOADS = {
    "close": "[/]",
    "open": "[bold",
    "bold": "[bold]B[/]",
    "link": "[link=https://evil.example/]L[/link]",
    "click": "[@click=app.quit]Q[/]",
}
LONG_NAME = "x" * 10_000 + TITLE
"""10,000 characters, then an escape sequence where a cut would leave it."""

EVIL_NAME = "evil\x1b]0;PWNED\x07\x1b[2J[bold]B[/]"
"""The run name of the issue: a title, a clear and markup together."""

ALL_PAYLOADS = {**CONTROL_PAYLOADS, **MARKUP_PAYLOADS}

SGR = re.compile(r"\x1b\[[0-9;:]*m")
CURSOR_TO = re.compile(r"\x1b\[[0-9]+;[0-9]+H")
TEXTUAL_OWN = re.compile(r"\x1b\[\?[0-9;]*[hl]")
"""Textual's own modes (cursor visibility, synchronized output): the sequences a dashboard frame may hold."""
RAW = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")
"""Controls (C0 but tab and newline, DEL, C1), bidi marks and overrides, and lone surrogates."""


def raw_in_terminal_output(output: str) -> list[str]:
    """What in `output` (what a terminal would be sent) is not the program's own styling or cursor moves: every
    control left once SGR colours, cursor positioning and Textual's mode switches are taken out, with its context."""
    rest = TEXTUAL_OWN.sub("", CURSOR_TO.sub("", SGR.sub("", output)))
    return [repr(rest[max(0, match.start() - 12) : match.end() + 12]) for match in RAW.finditer(rest)]


def raw_in_text(text: str) -> list[str]:
    """Every control, escape, bidi character or lone surrogate in plain `text` (no styling expected), in context."""
    return [repr(text[max(0, match.start() - 12) : match.end() + 12]) for match in RAW.finditer(text)]


HOSTILE_ARGV = [
    CONTROL_PAYLOADS["osc0"],
    CONTROL_PAYLOADS["osc52"],
    CONTROL_PAYLOADS["clear"],
    MARKUP_PAYLOADS["bold"],
    MARKUP_PAYLOADS["click"],
    CONTROL_PAYLOADS["bidi"],
]
"""What the hostile process's command line carries after its script."""
SET_NAME_AND_WAIT = (
    "import ctypes, sys, time\n"
    "ctypes.CDLL(None, use_errno=True).prctl(15, sys.argv[1].encode('utf-8', 'surrogateescape'), 0, 0, 0)\n"
    "b = b'x' * (16 * 1024 * 1024)\n"
    "while True: time.sleep(0.05)\n"
)


@contextlib.contextmanager
def hostile_process(name: str = TITLE) -> Iterator[subprocess.Popen[bytes]]:
    """A real process that names itself `name` with prctl(PR_SET_NAME), as any user may, and carries
    HOSTILE_ARGV on its command line; yielded once /proc shows the name (so a check of it can fail)."""
    child = subprocess.Popen([sys.executable, "-c", SET_NAME_AND_WAIT, name, *HOSTILE_ARGV], start_new_session=True)
    try:
        comm = Path(f"/proc/{child.pid}/comm")
        deadline = time.monotonic() + 30
        while comm.read_bytes().rstrip(b"\n") != name.encode("utf-8", "surrogateescape")[:15]:
            assert time.monotonic() < deadline, f"the child never took the name {name!r}: {comm.read_bytes()!r}"
            time.sleep(0.02)
        yield child
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signal.SIGKILL)
        child.wait()
