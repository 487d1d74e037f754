"""SIGINT, SIGTERM and SIGHUP end a headless command the way Ctrl-C does: the run stops and is recorded.

A run polls `requested` (execute_run's `stop_requested`), so a signal never interrupts the recording of
what the run produced: inside `polled()` the handler only sets the event. Outside it, the first signal
raises KeyboardInterrupt where the program is (nothing is being recorded there: the history is opened, the
machine probed). Later signals are noted and ignored, so a second Ctrl-C or a systemd stop that repeats
SIGTERM cannot cut the recording of a stopping run short.

SIGHUP means the terminal has gone (an SSH drop): the standard streams that were that terminal are
pointed at /dev/null, so writing the summary cannot fail; a pipe or a file stays where it was, and still
gets the result (`--json`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def detach_from_terminal() -> None:
    """Point stdin, stdout and stderr at /dev/null where they are a terminal (it hung up)."""
    devnull = os.open(os.devnull, os.O_RDWR)
    try:
        for fd in (0, 1, 2):
            with contextlib.suppress(OSError):
                if os.isatty(fd):
                    os.dup2(devnull, fd)
    finally:
        os.close(devnull)


class StopSignals:
    """Installs handlers for STOP_SIGNALS on the main thread; `requested` is set by the first of them."""

    def __init__(self) -> None:
        self.requested = threading.Event()
        self.signal_number: int | None = None
        """The first stop signal received."""
        self._polled = 0
        self._installed = False

    @property
    def exit_code(self) -> int | None:
        """128 + the signal's number, as a shell reports a command that a signal ended; None without one."""
        return None if self.signal_number is None else 128 + self.signal_number

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            detach_from_terminal()
        if self.requested.is_set():
            return
        self.signal_number = signum
        self.requested.set()
        if not self._polled:
            raise KeyboardInterrupt

    def install(self) -> StopSignals:
        """Handle STOP_SIGNALS from now on, for the rest of the process (a command's whole life)."""
        for sig in STOP_SIGNALS:
            signal.signal(sig, self._handle)
        self._installed = True
        return self

    def ignore_from_now(self) -> None:
        """The command has ended: what it wrote is flushed and stop signals are ignored, so one that comes while
        Python shuts down cannot change the exit status. Python puts its own handlers back to the default early in
        its shutdown (an ignored signal it leaves ignored), so a second Ctrl-C or a repeated SIGTERM arriving then
        would end the process by that signal instead of with the exit code the command returned."""
        if not self._installed:
            return
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for sig in STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)

    @contextlib.contextmanager
    def polled(self) -> Iterator[threading.Event]:
        """Within: a signal only sets the returned event, which the code inside polls."""
        self._polled += 1
        try:
            yield self.requested
        finally:
            self._polled -= 1
