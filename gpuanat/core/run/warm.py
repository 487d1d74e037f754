"""The warm worker: the next training process, started ahead and handed its run when one starts.

A training process spends most of its start-up importing torch, transformers and datasets (12-18 s on the H100
machine, benchmarks/results/h100/warm_worker/). The dashboard, and `sweep`, `tune` and `fit` between their runs, keep
one such process prepared: `python -m gpuanat.worker --warm-fd FD` imports everything a run needs, says
`prepared`, and waits for one line on FD — the run's configuration and the variables chosen with it — then trains
exactly as a cold `python -m gpuanat.worker --config JSON` would.

It does not initialise CUDA while it waits: a context would hold GPU memory (about 0.5 GB on an H100) on a GPU the
next run may not choose, seen by everyone on a shared machine, and would fix the allocator's settings before the run
chose them. So a prepared worker costs no GPU memory at all; CUDA's initialisation (0.35 s on the H100) stays in the
run's start-up, as its "CUDA init" part.

What a process reads while it imports is fixed when it starts: its environment. A prepared worker takes a run only
when the run's environment equals the one it was started with, but for the variables that the worker applies itself
when handed the run (`ADOPTABLE_VARIABLES`: the allocator's options, gpuanat's measurement requests); otherwise the
run starts cold and says why (`cold_start_reason`) — other GPUs chosen, several ranks (torchrun starts those), a
variable changed. A prepared worker is a child like any other: it holds the lifeline, so it ends with gpuanat.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuanat.core.run.python_command import python_module_command
from gpuanat.core.run.runner import ChildExited, ChildProcess
from gpuanat.core.vocabulary.config import (
    ALLOCATOR_CONF_VARIABLE,
    MEMORY_SNAPSHOT_VARIABLE,
    PROFILE_OPS_TRACE_VARIABLE,
    PROFILE_OPS_VARIABLE,
)
from gpuanat.core.vocabulary.protocol import Milestone

WARM_WORKER_VARIABLE = "GPUANAT_WARM_WORKER"
"""Set to 0 to start every run cold (no process prepared ahead)."""
ADOPTABLE_VARIABLES = frozenset(
    {ALLOCATOR_CONF_VARIABLE, MEMORY_SNAPSHOT_VARIABLE, PROFILE_OPS_VARIABLE, PROFILE_OPS_TRACE_VARIABLE}
)
"""Variables a prepared worker sets itself when handed its run, before anything reads them: torch reads the allocator's
options when CUDA initialises, gpuanat's probe its measurement requests when the run starts."""
PREPARED = "prepared"
"""The milestone a prepared worker reports once its imports are done."""
AHEAD_MIN_CORES = 4
"""A worker is prepared while a run trains only where at least this many cores are usable: its imports take one core
for several seconds, which on fewer cores would slow the run being measured. With fewer, it is prepared once the run
has ended."""
RETIRE_GRACE_S = 1.0


def warm_workers_wanted(environment: Mapping[str, str] | None = None) -> bool:
    """Whether runs may start warm: not when GPUANAT_WARM_WORKER is 0 (or off, no, false)."""
    value = (os.environ if environment is None else environment).get(WARM_WORKER_VARIABLE, "1")
    return value.strip().lower() not in ("0", "off", "no", "false")


def usable_cores() -> int:
    with contextlib.suppress(AttributeError, OSError):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def cold_start_reason(prepared: Mapping[str, str], run: Mapping[str, str], ranks: int) -> str | None:
    """Why a worker prepared with the environment `prepared` cannot take a run with the environment `run` on `ranks`
    ranks; None when it can."""
    if ranks > 1:
        return f"{ranks} ranks start through torchrun"
    changed = sorted(
        name
        for name in set(prepared) | set(run)
        if name not in ADOPTABLE_VARIABLES and prepared.get(name) != run.get(name)
    )
    if not changed:
        return None
    if "CUDA_VISIBLE_DEVICES" in changed:
        return (
            f"the run's GPUs (CUDA_VISIBLE_DEVICES={run.get('CUDA_VISIBLE_DEVICES', '')}) are not those the "
            f"prepared process was started for ({prepared.get('CUDA_VISIBLE_DEVICES', '')})"
        )
    shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
    return f"the environment changed since the process was prepared ({shown})"


def warm_worker_command(events_fd: int, handoff_fd: int) -> list[str]:
    return python_module_command("gpuanat.worker", "--events-fd", str(events_fd), "--warm-fd", str(handoff_fd))


@dataclass(frozen=True)
class WarmStart:
    """How a run's training process started: `warm` (a prepared worker took it) with the seconds it had been
    prepared for, or cold and why."""

    warm: bool
    prepared_for_s: float | None = None
    """Seconds between the prepared worker's start and the run's request (its imports ran in that time)."""
    imports_done: bool | None = None
    """Whether the prepared worker had finished its imports when it was handed the run."""
    cold_reason: str | None = None

    def to_json(self) -> dict[str, object]:
        return {
            "warm": self.warm,
            "prepared_for_s": self.prepared_for_s,
            "imports_done": self.imports_done,
            "cold_reason": self.cold_reason,
        }

    def describe(self) -> str:
        """One line for the log: "warm: a process prepared 42 s ago took the run" or "cold: …"."""
        if self.warm:
            state = "its imports done" if self.imports_done else "still importing"
            return f"warm start: a training process prepared {self.prepared_for_s:.0f} s ago took the run ({state})"
        return f"cold start: {self.cold_reason}"


class _Prepared:
    """One prepared worker: its process, the environment it started with, and whether it said it is ready."""

    def __init__(self, environment: Mapping[str, str]) -> None:
        self.environment = dict(environment)
        self.started_s = time.monotonic()
        self.child = ChildProcess(warm_worker_command, log_path=None, env=self.environment, handoff=True)
        self.child.start()
        self.prepared_s: float | None = None
        self.exited: int | None = None

    def poll(self) -> None:
        """Read what the worker said so far: ready, or gone."""
        while self.exited is None:
            event = self.child.next_event(0)
            if event is None:
                return
            if isinstance(event, ChildExited):
                self.exited = event.returncode if event.returncode is not None else -1
            elif isinstance(event, Milestone) and event.name == PREPARED:
                self.prepared_s = event.monotonic_s

    def retire(self) -> None:
        self.child.close_handoff()
        self.child.kill_group(term_grace_s=RETIRE_GRACE_S)


class WarmWorkers:
    """At most one prepared worker, for the next run. Thread-safe: the dashboard prepares from its threads."""

    def __init__(self, *, enabled: bool | None = None) -> None:
        self.enabled = warm_workers_wanted() if enabled is None else enabled
        self._lock = threading.Lock()
        self._prepared: _Prepared | None = None
        self._closed = False
        self.last_start: WarmStart | None = None
        """How the latest run given these workers started (set by `execute_run` once its process runs)."""

    def prepare(self, environment: Mapping[str, str]) -> None:
        """Have a worker prepared with `environment`: the one already there when it fits, else a new one (the
        old one retired)."""
        if not self.enabled:
            return
        old = None
        with self._lock:
            if self._closed:
                return
            current = self._prepared
            if current is not None:
                current.poll()
                if current.exited is None and cold_start_reason(current.environment, environment, 1) is None:
                    return
                old = current
            self._prepared = _Prepared(environment)
        if old is not None:
            old.retire()

    @property
    def prepared_pid(self) -> int | None:
        """The process prepared for the next run, while there is one."""
        current = self._prepared
        return current.child.pid if current is not None else None

    def status(self) -> str | None:
        """ "ready" once the prepared worker's imports are done, "preparing" before, None when there is none."""
        with self._lock:
            current = self._prepared
            if current is None:
                return None
            current.poll()
            if current.exited is not None:
                return None
            return "ready" if current.prepared_s is not None else "preparing"

    def take(
        self, environment: Mapping[str, str], ranks: int, requested_s: float
    ) -> tuple[ChildProcess | None, WarmStart]:
        """The prepared worker for a run with `environment` on `ranks` ranks, no longer held here (the caller hands
        it the run with `adopt`), or None with why the run starts cold. One that cannot take the run is retired
        unless only the ranks stand in the way (the next one-rank run may use it)."""
        with self._lock:
            current = self._prepared
            if current is None:
                return None, WarmStart(
                    False,
                    cold_reason="no process was prepared"
                    if self.enabled
                    else f"warm starts are off ({WARM_WORKER_VARIABLE}=0)",
                )
            current.poll()
            reason = cold_start_reason(current.environment, environment, ranks)
            if current.exited is not None:
                output = current.child.early_output().decode(errors="replace").strip().splitlines()
                reason = f"the prepared process had exited (code {current.exited})" + (
                    f": {output[-1]}" if output else ""
                )
            if reason is not None:
                if ranks == 1 or current.exited is not None:
                    self._prepared = None
                else:
                    return None, WarmStart(False, cold_reason=reason)
            else:
                self._prepared = None
                return current.child, WarmStart(
                    True,
                    prepared_for_s=max(0.0, requested_s - current.started_s),
                    imports_done=current.prepared_s is not None,
                )
        current.retire()
        return None, WarmStart(False, cold_reason=reason)

    def close(self) -> None:
        """Retire the prepared worker and prepare no other."""
        with self._lock:
            self._closed = True
            current, self._prepared = self._prepared, None
        if current is not None:
            current.retire()


def adopt(child: ChildProcess, config_json: str, environment: Mapping[str, str], log_path: Path) -> None:
    """Hand a prepared worker its run: the configuration and the adoptable variables of the run's environment (unset
    ones as null, which the worker removes). Its output so far, and from now on, goes to `log_path`. Raises OSError when
    the worker is gone."""
    variables = {name: environment.get(name) for name in sorted(ADOPTABLE_VARIABLES)}
    child.set_log_path(log_path)
    child.hand_over((json.dumps({"config": json.loads(config_json), "environ": variables}) + "\n").encode())
