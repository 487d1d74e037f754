"""The process a watch follows, as it was when the watch began.

`resolve_target` reads the PID once with psutil and refuses, with a one-line `WatchError`, a process that does not
exist, cannot be read or has already exited; the `WatchTarget` it returns keeps the process's start time, which
tells it apart from a later process given the same PID.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil


class WatchError(Exception):
    """The PID cannot be watched; the message says why, in one line."""


@dataclass(frozen=True)
class WatchTarget:
    """The watched process as it was when the watch began."""

    pid: int
    name: str
    command: str
    """Its command line ("" when it cannot be read)."""
    create_time_s: float
    """Unix time it started (psutil), which tells it apart from a later process with the same PID."""
    username: str | None
    arguments: tuple[str, ...] = ()
    """Its command line, argument by argument (empty when it cannot be read)."""
    cwd: str | None = None
    """Its working directory, against which the command line's relative paths are read (None: not readable)."""


def resolve_target(pid: int) -> WatchTarget:
    """The process to watch; WatchError when it does not exist or cannot be read."""
    if pid <= 0:
        raise WatchError(f"PID must be a positive integer (got {pid})")
    try:
        process = psutil.Process(pid)
        with process.oneshot():
            name = process.name()
            create_time_s = process.create_time()
            status = process.status()
            process.memory_info()
            process.cpu_times()
    except psutil.NoSuchProcess:
        raise WatchError(f"no process with PID {pid}") from None
    except psutil.AccessDenied:
        raise WatchError(f"PID {pid} exists but cannot be read (access denied: another user's process?)") from None
    if status == psutil.STATUS_ZOMBIE:
        raise WatchError(f"PID {pid} has already exited (a zombie its parent has not reaped)")
    try:
        arguments = tuple(process.cmdline())
    except psutil.Error:
        arguments = ()
    command = " ".join(arguments)
    try:
        cwd: str | None = process.cwd()
    except psutil.Error:
        cwd = None
    try:
        username: str | None = process.username()
    except psutil.Error:
        username = None
    return WatchTarget(
        pid=pid,
        name=name,
        command=command,
        create_time_s=create_time_s,
        username=username,
        arguments=arguments,
        cwd=cwd,
    )
