"""Spawn, stream and stop a training child in its own process group.

The child gets a dedicated pipe for protocol events; its stdout and stderr, the human log, go through a
second pipe that a thread copies into the log file. A reader thread decodes event lines into a queue; the
caller drains it with `next_event`. A log file that cannot be written (a full disk) costs the log, never
the run: the copier keeps draining the child's output and `log_error` says what was lost.
Stopping asks politely (SIGINT to the child, which records a clean "stopped"), then ends the child's whole
family — its process group, DataLoader workers included, and every descendant seen in a session of its own (the
ranks torchrun starts) — with SIGTERM and SIGKILL.

The child also holds the read end of a lifeline pipe whose write end only this process has: when this
process exits in any way, SIGKILL included, the child sees end-of-file and ends its own group
(`gpuanat.worker.lifeline`). No child outlives its parent, not even during its start-up.
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from gpuanat.core.run.python_command import python_module_command
from gpuanat.core.thread_names import name_native_thread
from gpuanat.core.vocabulary.config import Capabilities
from gpuanat.core.vocabulary.protocol import Event, EventLines, Malformed, Ranked

PIPE_READ_BYTES = 1 << 16
LIFELINE_FD_ENV = "GPUANAT_LIFELINE_FD"
"""The child's end of the lifeline pipe (see gpuanat.worker.lifeline)."""
EARLY_OUTPUT_MAX_BYTES = 1 << 20
"""What is kept of a child's output before its log file is named (a prepared worker's import warnings)."""
PIPE_CLOSE_GRACE_S = 3.0
"""After the child has exited, how long the events pipe may stay open (a process the child started holds it)
before its group is ended and the child is reported gone anyway."""


@dataclass(frozen=True)
class ChildExited:
    """Put on the event queue after the events pipe closed: the child has gone."""

    returncode: int | None


CAPABILITIES_CACHE_S = 24 * 3600
"""How long a probe's answer is reused for an unchanged environment (`capabilities_key`)."""
CAPABILITIES_PACKAGES = ("torch", "bitsandbytes", "peft", "liger_kernel", "deepspeed", "triton", "transformers")
NO_CAPABILITIES_CACHE_ENV = "GPUANAT_NO_CAPABILITIES_CACHE"


def capabilities_key(environ: Mapping[str, str] | None = None) -> str:
    """What the probe's answer depends on, hashed: this Python, where each package it reports on is installed and
    when that file last changed (a package installed, removed or upgraded changes it), the variables that choose
    packages and GPUs, the NVIDIA driver's version, and the GPU device files. Locating a package does not import
    it."""
    import hashlib
    import importlib.util

    environ = os.environ if environ is None else environ
    parts = [
        sys.executable,
        sys.version,
        *(
            f"{name}={environ.get(name, '')}"
            for name in ("PYTHONPATH", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "NVIDIA_VISIBLE_DEVICES")
        ),
    ]
    for package in CAPABILITIES_PACKAGES:
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec is not None else None
        stamp = os.stat(origin).st_mtime_ns if origin and os.path.exists(origin) else None
        parts.append(f"{package}={origin}@{stamp}")
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/driver/nvidia/version").read_text())
    with contextlib.suppress(OSError):
        parts.append(
            ",".join(sorted(name for name in os.listdir("/dev") if name.startswith("nvidia") and name[6:].isdigit()))
        )
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def capabilities_cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuanat" / "capabilities.json"


def _cached_capabilities(key: str, path: Path, now_s: float) -> Capabilities | None:
    try:
        cached = json.loads(path.read_text())
        if cached["key"] == key and 0 <= now_s - float(cached["probed_at"]) < CAPABILITIES_CACHE_S:
            return Capabilities.from_json(cached["capabilities"])
    except (OSError, ValueError, KeyError, TypeError):  # none yet, or not ours: probe again
        pass
    return None


def _remember_capabilities(key: str, path: Path, capabilities: Capabilities, now_s: float) -> None:
    """Written whole or not at all (a temporary file renamed), readable by its owner only; a cache that cannot be
    written is no error."""
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            json.dump({"key": key, "probed_at": now_s, "capabilities": capabilities.to_json()}, handle)
        os.replace(partial, path)


def probe_capabilities(use_cache: bool = True) -> Capabilities:
    """Ask a subprocess what this machine can train with (keeps torch and CUDA out of this process). The answer is
    reused for a day while the environment it depends on (`capabilities_key`) is unchanged: the subprocess imports
    torch and initialises CUDA, seconds that every run would otherwise wait before its child starts. Set
    GPUANAT_NO_CAPABILITIES_CACHE=1 to probe every time.

    Raises RuntimeError with the probe's last error line when the training environment is broken (never cached).
    """
    use_cache = use_cache and not os.environ.get(NO_CAPABILITIES_CACHE_ENV)
    key, path, now_s = (capabilities_key(), capabilities_cache_path(), time.time()) if use_cache else ("", None, 0.0)
    if path is not None:
        cached = _cached_capabilities(key, path, now_s)
        if cached is not None:
            return cached
    completed = subprocess.run(
        python_module_command("gpuanat.worker.capabilities"),
        capture_output=True,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    if completed.returncode != 0:
        last_line = (completed.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(
            f"cannot start the training environment (python -m gpuanat.worker.capabilities): {last_line}"
        )
    capabilities = Capabilities.from_json(json.loads(completed.stdout))
    if path is not None:
        _remember_capabilities(key, path, capabilities, now_s)
    return capabilities


def worker_command(config_json: str, events_fd: int, ranks: int = 1) -> list[str]:
    """The command line of gpuanat's own training child: the worker itself, or for several ranks the rank launcher
    (gpuanat.worker.launch), which starts them through torchrun."""
    if ranks > 1:
        return python_module_command(
            "gpuanat.worker.launch", "--events-fd", str(events_fd), "--nproc", str(ranks), "--", "--config", config_json
        )
    return python_module_command("gpuanat.worker", "--events-fd", str(events_fd), "--config", config_json)


class ChildProcess:
    """One training child: a process group, an events pipe, a log file."""

    def __init__(
        self,
        make_command: Callable[..., list[str]],
        *,
        log_path: Path | None,
        env: Mapping[str, str] | None = None,
        handoff: bool = False,
    ) -> None:
        """`make_command(events_fd)` returns the argv; the fd is inherited by the child. With `handoff`, the child also
        gets the read end of a hand-over pipe (`make_command(events_fd, handoff_fd)`), which `hand_over` writes to once
        (a prepared worker's run: gpuanat.core.run.warm). Without a `log_path` yet, the child's output is kept in
        memory (at most `EARLY_OUTPUT_MAX_BYTES`) until `set_log_path` names its file."""
        self._make_command = make_command
        self.log_path = log_path
        self._env = dict(os.environ if env is None else env)
        self._handoff = handoff
        self._handoff_fd: int | None = None
        """Our end of the hand-over pipe, until the run is handed over (or the worker retired)."""
        self._events: queue.Queue[Event | Ranked | Malformed | ChildExited] = queue.Queue()
        self._process: subprocess.Popen[bytes] | None = None
        self._reader: threading.Thread | None = None
        self._lifeline_fd: int | None = None
        """Our end of the lifeline: open for as long as the child may live."""
        self._exited_seen_s: float | None = None
        """When `next_event` first found the child exited with its events pipe still open."""
        self.log_error: str | None = None
        """Why (part of) the child's output is missing from the log file, when it is."""
        self.dropped_log_bytes = 0
        self._log_lock = threading.Lock()
        self._log_fd: int | None = None
        self._log_closed = False
        """The copier has finished: a log file opened later is written and closed at once."""
        self._early_output = bytearray()
        """The child's output before its log file was named."""
        self._descendants: dict[int, Any] = {}
        """Every descendant seen in a session of its own (torchrun's ranks): found while the child lives, ended
        with its group even once re-parented."""

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def start(self) -> None:
        read_fd, write_fd = os.pipe()
        lifeline_child_fd, self._lifeline_fd = os.pipe()  # not inherited by any other child (O_CLOEXEC)
        output_read_fd, output_write_fd = os.pipe()
        handoff_child_fd = None
        if self._handoff:
            handoff_child_fd, self._handoff_fd = os.pipe()
        passed = (write_fd, lifeline_child_fd) + ((handoff_child_fd,) if handoff_child_fd is not None else ())
        env = {
            **self._env,
            "PYTHONUNBUFFERED": "1",
            "GPUANAT_EVENTS_FD": str(write_fd),
            LIFELINE_FD_ENV: str(lifeline_child_fd),
        }
        command = (
            self._make_command(write_fd, handoff_child_fd)
            if handoff_child_fd is not None
            else self._make_command(write_fd)
        )
        try:
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=output_write_fd,
                stderr=subprocess.STDOUT,
                pass_fds=passed,
                env=env,
                start_new_session=True,
            )
        except BaseException:
            for fd in (read_fd, output_read_fd, self._lifeline_fd, self._handoff_fd):
                if fd is not None:
                    os.close(fd)
            self._lifeline_fd = self._handoff_fd = None
            raise
        finally:
            for fd in (*passed, output_write_fd):
                os.close(fd)
        if self.log_path is not None:
            self.set_log_path(self.log_path)
        threading.Thread(target=self._copy_output, args=(output_read_fd,), name="gpuanat-log", daemon=True).start()
        self._reader = threading.Thread(target=self._read_events, args=(read_fd,), name="gpuanat-events", daemon=True)
        self._reader.start()

    def hand_over(self, payload: bytes) -> None:
        """Write `payload` to the hand-over pipe and close it (the child reads it to its end). Raises OSError when the
        child is gone (BrokenPipeError) or there is no pipe."""
        fd, self._handoff_fd = self._handoff_fd, None
        if fd is None:
            raise OSError("this child has no hand-over pipe, or was handed its run already")
        try:
            while payload:
                payload = payload[os.write(fd, payload) :]
        finally:
            os.close(fd)

    def close_handoff(self) -> None:
        """Close the hand-over pipe unwritten: a prepared worker reads end-of-file and leaves."""
        fd, self._handoff_fd = self._handoff_fd, None
        if fd is not None:
            os.close(fd)

    def early_output(self) -> bytes:
        """The child's output so far when no log file has been named yet."""
        with self._log_lock:
            return bytes(self._early_output)

    def set_log_path(self, path: Path) -> None:
        """The child's log file from now on: what it wrote before is written there first."""
        with self._log_lock:
            self.log_path = path
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self._log_fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as error:
                self.log_error = f"cannot write the log {path}: {error.strerror}; the child's output was dropped"
                return
            early, self._early_output = bytes(self._early_output), bytearray()
            self._write_log(early)
            if self._log_closed:
                os.close(self._log_fd)
                self._log_fd = None

    def _write_log(self, chunk: bytes) -> None:
        """Append `chunk` to the log file (the lock held); a chunk the file refuses is dropped and counted."""
        if self._log_fd is None:
            if self.log_path is None and len(self._early_output) < EARLY_OUTPUT_MAX_BYTES:
                self._early_output += chunk[: EARLY_OUTPUT_MAX_BYTES - len(self._early_output)]
            return
        try:
            while chunk:
                chunk = chunk[os.write(self._log_fd, chunk) :]
        except OSError as error:  # dropped; the next chunk tries again (space may be freed)
            self.dropped_log_bytes += len(chunk)
            self.log_error = (
                f"the log {self.log_path} refused {self.dropped_log_bytes} bytes of the "
                f"child's output ({error.strerror})"
            )

    def _copy_output(self, read_fd: int) -> None:
        """Copy the child's output into the log file until the pipe closes, draining it whatever the file does."""
        name_native_thread()
        try:
            while chunk := os.read(read_fd, PIPE_READ_BYTES):
                with self._log_lock:
                    self._write_log(chunk)
        finally:
            os.close(read_fd)
            with self._log_lock:
                self._log_closed = True
                if self._log_fd is not None:
                    os.close(self._log_fd)
                    self._log_fd = None

    def _read_events(self, read_fd: int) -> None:
        """Decode the pipe until it closes; whatever happens, end with ChildExited, so that the caller
        always learns that the child has gone."""
        name_native_thread()
        lines = EventLines()
        try:
            while chunk := os.read(read_fd, PIPE_READ_BYTES):
                for event in lines.feed(chunk):
                    self._events.put(event)
            for event in lines.finish():
                self._events.put(event)
        except Exception as error:  # never die silently: the run would wait for an end that never comes
            self._events.put(Malformed("", f"the events reader failed: {type(error).__name__}: {error}"))
        finally:
            os.close(read_fd)
            assert self._process is not None
            self._events.put(ChildExited(self._process.wait()))

    def next_event(self, timeout_s: float) -> Event | Ranked | Malformed | ChildExited | None:
        """The next event, or None when none arrived within `timeout_s`. ChildExited comes once the pipe has
        closed, or `PIPE_CLOSE_GRACE_S` after the child exited while something else still held the pipe open."""
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            pass
        returncode = self.poll()
        if returncode is None:
            return None
        now_s = time.monotonic()
        if self._exited_seen_s is None:
            self._exited_seen_s = now_s
        elif now_s - self._exited_seen_s >= PIPE_CLOSE_GRACE_S:
            self.kill_group()
            return ChildExited(returncode)
        return None

    def poll(self) -> int | None:
        return self._process.poll() if self._process else None

    def _family(self) -> list[Any]:
        """psutil processes still alive of the child's family: its process group (the child, DataLoader workers)
        and its descendants in sessions of their own (the ranks torchrun starts), zombies not counted. Each
        descendant is remembered once seen, so it is found even after its parent died and it was re-parented;
        psutil checks a process's start time before signalling it, so a reused PID is never signalled."""
        assert self._process is not None
        pgid = self._process.pid
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(pgid).children(recursive=True):
                self._descendants.setdefault(child.pid, child)
        family: dict[int, Any] = {}
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError, psutil.Error):
                    if os.getpgid(int(entry.name)) == pgid:
                        family[int(entry.name)] = psutil.Process(int(entry.name))
        for pid, process in self._descendants.items():
            if pid not in family:
                family[pid] = process
        alive = []
        for process in family.values():
            with contextlib.suppress(psutil.Error):
                if process.is_running() and process.status() != psutil.STATUS_ZOMBIE:
                    alive.append(process)
        return alive

    def group_pids(self) -> list[int]:
        """PIDs still alive of the child's family (see `_family`)."""
        if self._process is None:
            return []
        return sorted(process.pid for process in self._family())

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
            family = self._family()
            if not family:
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pgid, sig)
            for process in family:
                with contextlib.suppress(psutil.Error):
                    process.send_signal(sig)
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline and self.group_pids():
                time.sleep(0.05)
        self._process.wait()
        self._let_go()

    def _let_go(self) -> None:
        """Close our end of the lifeline (and of an unused hand-over pipe) once the child has been waited for."""
        self.close_handoff()
        if self._lifeline_fd is not None:
            os.close(self._lifeline_fd)
            self._lifeline_fd = None

    def wait(self, timeout_s: float | None = None) -> int:
        assert self._process is not None
        return self._process.wait(timeout=timeout_s)
