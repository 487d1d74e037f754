"""What can go wrong with the history, as one typed line each: `HistoryError` (the history cannot be used: fix the
path or the file, exit 2, or a fault, exit 1) and `HistoryWriteError` (a write the history refused for now: busy,
full, failing I/O; nothing of it was stored and it can be retried, as `write_with_backoff` does).

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import errno
import sqlite3
import time
from collections.abc import Callable
from typing import TypeVar

BACKOFF_FIRST_DELAY_S = 0.1
BACKOFF_MAX_DELAY_S = 2.0
"""write_with_backoff waits 0.1 s after the first failure, doubling up to 2 s between attempts."""
EXIT_BAD_FILE = 2
"""HistoryError.exit_code when the user must fix the path or the file."""
EXIT_FAULT = 1
"""HistoryError.exit_code of a fault: busy, full, I/O."""
PATH_ERRNOS = {
    errno.ENOENT,
    errno.ENOTDIR,
    errno.EACCES,
    errno.EPERM,
    errno.ELOOP,
    errno.EISDIR,
    errno.ENAMETOOLONG,
    errno.EROFS,
}
"""OS errors the user fixes by choosing another path (exit code 2)."""


class HistoryError(Exception):
    """The history cannot be used: one line that says what to do. `exit_code` is EXIT_BAD_FILE (2) when the user
    must fix the path or the file, EXIT_FAULT (1) for a fault."""

    def __init__(self, message: str, exit_code: int = EXIT_FAULT) -> None:
        super().__init__(" ".join(message.split()))
        self.exit_code = exit_code


class HistoryWriteError(HistoryError):
    """A write that failed because the history was busy (locked), full or failing I/O. Nothing of it was stored
    and the store stays usable: the same write can be retried, by the next flush or `write_with_backoff`."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, EXIT_FAULT)
        self.reason = reason
        """"busy", "full", "io" or "read-only" (the file or its file system stopped accepting writes)."""


def sqlite_code(error: sqlite3.Error) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def fault_reason(error: BaseException) -> str | None:
    """busy / full / io / read-only for an error a retried write may get past, else None."""
    if isinstance(error, sqlite3.Error):
        return {
            sqlite3.SQLITE_BUSY: "busy",
            sqlite3.SQLITE_LOCKED: "busy",
            sqlite3.SQLITE_FULL: "full",
            sqlite3.SQLITE_IOERR: "io",
            sqlite3.SQLITE_READONLY: "read-only",
        }.get(sqlite_code(error) or -1)
    if isinstance(error, OSError):
        return {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EIO: "io"}.get(error.errno or -1)
    return None


T = TypeVar("T")


def write_with_backoff(
    write: Callable[[], T],
    *,
    deadline_s: float,
    first_delay_s: float = BACKOFF_FIRST_DELAY_S,
    max_delay_s: float = BACKOFF_MAX_DELAY_S,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """`write()`, retried while it raises HistoryWriteError, waiting `first_delay_s` then doubling up to
    `max_delay_s`, for `deadline_s` seconds from now; after that the last HistoryWriteError is raised. Any other
    error is raised at once. An attempt itself may wait WRITE_BUSY_TIMEOUT_S for a lock, so the last one can end up
    to that much after the deadline. For the final write of a run: `write_with_backoff(lambda:
    store.update_result(run_id, result, status=status), deadline_s=30)`."""
    give_up_at = clock() + deadline_s
    delay_s = first_delay_s
    while True:
        try:
            return write()
        except HistoryWriteError:
            left_s = give_up_at - clock()
            if left_s <= 0:
                raise
            sleep(min(delay_s, left_s))
            delay_s = min(delay_s * 2, max_delay_s)
