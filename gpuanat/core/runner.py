"""Spawn, stream and stop a training child in its own process group.

The child gets a dedicated pipe for protocol events (its stdout/stderr go to a log file, the human
log). A reader thread decodes event lines into a queue; the caller drains it with `next_event`.
Stopping asks politely (SIGINT to the child, which records a clean "stopped"), then ends the whole
process group — DataLoader workers included — with SIGTERM and SIGKILL.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuanat.core.config import Capabilities
from gpuanat.core.protocol import Event, Malformed, decode


@dataclass(frozen=True)
class ChildExited:
    """Put on the event queue after the events pipe closed: the child has gone."""

    returncode: int | None


def probe_capabilities() -> Capabilities:
    """Ask a subprocess what this machine can train with (keeps torch and CUDA out of this process).

    Raises RuntimeError with the probe's last error line when the training environment is broken.
    """
    completed = subprocess.run([sys.executable, "-m", "gpuanat.worker.capabilities"], capture_output=True,
                               text=True, check=False, stdin=subprocess.DEVNULL)
    if completed.returncode != 0:
        last_line = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"cannot start the training environment (python -m gpuanat.worker.capabilities): "
                           f"{last_line}")
    return Capabilities.from_json(json.loads(completed.stdout))


def worker_command(config_json: str, events_fd: int) -> list[str]:
    """The command line of gpuanat's own training child."""
    return [sys.executable, "-m", "gpuanat.worker", "--events-fd", str(events_fd), "--config", config_json]


class ChildProcess:
    """One training child: a process group, an events pipe, a log file."""

    def __init__(self, make_command, *, log_path: Path, env: Mapping[str, str] | None = None) -> None:  # type: ignore[no-untyped-def]
        """`make_command(events_fd)` returns the argv; the fd is inherited by the child."""
        self._make_command = make_command
        self.log_path = log_path
        self._env = dict(os.environ if env is None else env)
        self._events: queue.Queue[Event | Malformed | ChildExited] = queue.Queue()
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self) -> None:
        read_fd, write_fd = os.pipe()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = {**self._env, "PYTHONUNBUFFERED": "1", "GPUANAT_EVENTS_FD": str(write_fd)}
        with open(self.log_path, "ab") as log:
            try:
                self._process = subprocess.Popen(
                    self._make_command(write_fd), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    pass_fds=(write_fd,), env=env, start_new_session=True,
                )
            finally:
                os.close(write_fd)
        self._reader = threading.Thread(target=self._read_events, args=(read_fd,), name="gpuanat-events",
                                        daemon=True)
        self._reader.start()

    def _read_events(self, read_fd: int) -> None:
        with os.fdopen(read_fd, "rb") as pipe:
            for line in pipe:
                if line.strip():
                    self._events.put(decode(line))
        assert self._process is not None
        self._events.put(ChildExited(self._process.wait()))

    def next_event(self, timeout_s: float) -> Event | Malformed | ChildExited | None:
        """The next event, or None when none arrived within `timeout_s`."""
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            return None

    def poll(self) -> int | None:
        return self._process.poll() if self._process else None

    def group_pids(self) -> list[int]:
        """PIDs still alive in the child's process group (the child and e.g. DataLoader workers)."""
        if self._process is None:
            return []
        pgid = self._process.pid
        alive = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, ProcessLookupError):
                    if os.getpgid(int(entry.name)) == pgid:
                        alive.append(int(entry.name))
        return alive

    def stop(self, grace_s: float = 10.0) -> int | None:
        """Stop the child: SIGINT, wait `grace_s`, then SIGTERM and SIGKILL to the whole group."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGINT)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=grace_s)
        self.kill_group()
        return process.wait()

    def kill_group(self, term_grace_s: float = 2.0) -> None:
        """End whatever is left of the process group (workers outlive a crashed child otherwise)."""
        if self._process is None:
            return
        pgid = self._process.pid
        for sig, wait_s in ((signal.SIGTERM, term_grace_s), (signal.SIGKILL, 0.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and self.group_pids():
                time.sleep(0.05)
        self._process.wait()

    def wait(self, timeout_s: float | None = None) -> int:
        assert self._process is not None
        return self._process.wait(timeout=timeout_s)
