"""The training child's tie to its parent: when gpuanat goes, however it goes, the child goes too.

The parent keeps the write end of a pipe whose read end only the child has (`LIFELINE_FD_ENV` names it). It
never writes to it; the kernel closes it when the parent exits — SIGKILL included — and the child's read
then returns end-of-file. A thread started before anything heavy is imported waits for that and ends the
child's family — its process group (the child and its DataLoader workers) and every descendant in a session of
its own (torchrun starts ranks so): SIGTERM, which the worker turns into a clean stop, then SIGKILL after
`PARENT_GONE_GRACE_S`. A rank of a distributed run holds its lifeline the same way, on its connection to the
rank launcher (`hold_lifeline_fd`). A parent-death signal (prctl) would do the same only for the
thread that started the child, and the dashboard starts children from worker threads; the pipe has no such
catch, and needs no write to notice.

Plain Python, no torch: it runs first thing in `python -m gpuanat.worker` and `python -m gpuanat.worker.script`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time

from gpuanat.core.run.runner import LIFELINE_FD_ENV

PARENT_GONE_GRACE_S = 5.0
"""After the parent is gone, how long the child has to stop cleanly before its group is killed."""


def hold_lifeline() -> bool:
    """Start the thread that ends this process (group) once the parent is gone; False when the parent
    gave no lifeline (the worker was started by hand)."""
    fd = os.environ.pop(LIFELINE_FD_ENV, None)
    if fd is None or not fd.isdigit():
        return False
    hold_lifeline_fd(int(fd))
    return True


def hold_lifeline_fd(fd: int) -> None:
    """End this process's family once `fd` reads end-of-file (its other end, which nobody writes to, closed)."""
    threading.Thread(target=_wait_for_parent_exit, args=(fd,), name="gpuanat-lifeline", daemon=True).start()


def _wait_for_parent_exit(fd: int) -> None:
    with contextlib.suppress(OSError):
        while os.read(fd, 1):  # the parent never writes; a byte is not expected, end-of-file is
            pass
    end_family()


def _descendants() -> list[int]:
    import psutil

    with contextlib.suppress(psutil.Error):
        return [child.pid for child in psutil.Process().children(recursive=True)]
    return []


def end_family(grace_s: float = PARENT_GONE_GRACE_S) -> None:
    """SIGTERM, then SIGKILL after `grace_s`, to this process's descendants and to its group — this process
    included, last."""
    # Only a group this process leads (gpuanat starts it in a session of its own) is ended whole: never the
    # group of a shell that started the worker by hand. Descendants are read before the first signal: once
    # their parents die they are re-parented and no longer found.
    leads_group = os.getpgrp() == os.getpid()
    descendants = _descendants()
    for sig, then_wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 0.0)):
        for pid in [*descendants, *_descendants()]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        with contextlib.suppress(ProcessLookupError):
            if leads_group:
                os.killpg(os.getpgrp(), sig)
            else:
                os.kill(os.getpid(), sig)
        time.sleep(then_wait_s)
