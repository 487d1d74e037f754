"""Watching a process gpuanat did not start: `gpuanat watch PID`, one record per sample.

A `WatchSession` follows one process and its descendants (DataLoader workers, ranks). Each sample of the
injected source (NVML + psutil live, or a recorded NVML trace with live psutil in tests) becomes one
JSON-ready record (`WatchRecords`): host CPU and RSS, GPU memory and utilization of the tree, the device's other
processes, how NVML's PIDs relate to ours, and — when a process of the tree publishes probe events
(`AnatomyCallback` in its script, found by `Publications`, learned by `ObservedRun`) — the step, throughput and
memory bands, exactly as for runs gpuanat launched. When the process exits, `final_record` says so. The session
can record itself into the history as a run of kind `watched` (`start_saving`, through `HistoryRecorder`).
`follow` is the loop that samples and hands each record on.

`gpuanat run --script` uses the same session for the child it launched, with events from its pipe
(`add_events`) instead of publication files.

Plain Python: no torch, no UI. Reads run on whatever thread calls `handle`; nothing here touches a widget.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import psutil

from gpuanat.core.measure.observed_run import ObservedRun
from gpuanat.core.measure.pid_namespace import PidNamespaceResolver
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.measure.samples import NvmlStatus, Sample
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.protocol import Event, Malformed, Ranked, Step
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.watch.publications import Publications, default_publication_dirs
from gpuanat.core.watch.recorder import HistoryRecorder
from gpuanat.core.watch.records import WatchRecords
from gpuanat.core.watch.target import WatchTarget
from gpuanat.core.watch.watched_result import watched_result

KEPT_SAMPLES = 20_000
"""Samples kept for a save requested later (about 80 minutes at 4 Hz); older ones are dropped."""


class WatchSession:
    """Follows one watched process tree: takes its events and samples, hands back its records (`WatchRecords`);
    keeps what a save needs."""

    def __init__(
        self,
        target: WatchTarget,
        nvml: NvmlStatus,
        *,
        clock: Callable[[], float] = time.monotonic,
        resolver: PidNamespaceResolver | None = None,
        publication_dirs_for: Callable[[int], list[Path]] | None = default_publication_dirs,
        process_alive: Callable[[], bool] | None = None,
        kind: str = "watched",
        description: Mapping[str, Any] | None = None,
    ) -> None:
        """`publication_dirs_for` None: events come only through `add_events` (a child gpuanat launched).
        `process_alive` defaults to psutil: the target still runs and is not a zombie. `kind` and
        `description` (config entries that say what ran; default the PID and command) are for the history."""
        self.target = target
        self._publications = Publications(publication_dirs_for, clock) if publication_dirs_for is not None else None
        self._process_alive = process_alive or self._psutil_alive
        self._process: psutil.Process | None = None
        self.observed = ObservedRun()
        self._records = WatchRecords(
            target,
            nvml,
            self.observed,
            clock=clock,
            resolver=resolver or PidNamespaceResolver(),
            publications=self._publications,
            kind=kind,
            description=description,
        )
        self.samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEPT_SAMPLES)
        self._pushed_events: collections.deque[tuple[int, Event | Ranked | Malformed]] = collections.deque()
        self._lock = threading.Lock()
        self._recorder: HistoryRecorder | None = None
        self._save_request: tuple[Path, str | None, Callable[[int | None, str | None], None] | None] | None = None
        self._new_steps: list[Step] = []

    # --- inputs ----------------------------------------------------------------------------------
    def add_events(self, pid: int, events: Iterable[Event | Ranked | Malformed]) -> None:
        """Events of `pid` that arrived another way than a publication file (any thread)."""
        self._pushed_events.extend((pid, event) for event in events)

    def _psutil_alive(self) -> bool:
        try:
            if self._process is None:
                self._process = psutil.Process(self.target.pid)
                if abs(self._process.create_time() - self.target.create_time_s) > 1.0:
                    return False  # the PID now belongs to another process
            return self._process.is_running() and self._process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def alive(self) -> bool:
        return self._process_alive()

    def _drain_events(self, tree_pids: Iterable[int]) -> list[Step]:
        incoming: list[tuple[int, Event | Ranked | Malformed]] = []
        while self._pushed_events:
            incoming.append(self._pushed_events.popleft())
        if self._publications is not None:
            incoming.extend(self._publications.poll(tree_pids))
        new_steps = []
        for pid, event in incoming:
            try:
                step = self.observed.observe_event(pid, event)
            except (TypeError, ValueError, AttributeError, KeyError, ArithmeticError, RecursionError):
                # decode checks every field's type; an event it lets through that the session still cannot
                # take counts as malformed: whatever a publication holds, the watch goes on
                self.observed.malformed += 1
                continue
            if step is not None:
                new_steps.append(step)
        return new_steps

    # --- records ---------------------------------------------------------------------------------
    def handle(self, sample: Sample) -> dict[str, Any]:
        """One record from one sample (and the events that arrived since the previous one)."""
        with self._lock:
            tree_pids = [self.target.pid] + [p.pid for p in sample.host.processes if p.pid != self.target.pid]
            self._new_steps = self._drain_events(tree_pids)
            record = self._records.record(sample, tree_pids)
            sample_json = sample.to_json()
            self.samples.append(sample_json)
            self._serve_save_request()
            if self._recorder is not None and not self._recorder.finished:
                self._recorder.add(sample_json, self._new_steps)
        return record

    def final_record(self, *, exit_code: int | None = None) -> dict[str, Any]:
        """The record that ends the watch because the process exited (after reading its last events)."""
        with self._lock:
            self._new_steps = self._drain_events([self.target.pid, *self._records.observed_pids()])
            if self._recorder is not None and not self._recorder.finished:
                self._recorder.add(None, self._new_steps)
            return self._records.final_record(exit_code=exit_code)

    # --- the history -----------------------------------------------------------------------------
    def request_save(
        self, db_path: Path, name: str | None = None, on_saved: Callable[[int | None, str | None], None] | None = None
    ) -> None:
        """Start recording into the history at the next sample, on the thread that calls `handle`
        (SQLite connections belong to their thread). `on_saved(run_id, failure)` is called then."""
        self._save_request = (db_path, name, on_saved)

    def _serve_save_request(self) -> None:
        request, self._save_request = self._save_request, None
        if request is None:
            return
        db_path, name, on_saved = request
        if self._recorder is not None:
            if on_saved is not None:
                on_saved(self._recorder.run_id, None)
            return
        try:
            self.start_saving(HistoryStore(db_path), name)
        except Exception as error:  # a broken history file must not end the watch
            if on_saved is not None:
                on_saved(None, f"{type(error).__name__}: {error}")
            return
        if on_saved is not None:
            assert self._recorder is not None
            on_saved(self._recorder.run_id, None)

    def start_saving(self, store: HistoryStore, name: str | None = None, *, run_id: int | None = None) -> int:
        """Record this watch as a history run of this session's kind: what was kept so far, then every
        sample (into `run_id` when the caller created the run already). Returns the run id; `finish_saving`
        gives it its final status and result."""
        if self._recorder is None:
            self._recorder = HistoryRecorder(store, self._records, self.samples, name, run_id)
        return self._recorder.run_id

    @property
    def saved_run_id(self) -> int | None:
        return self._recorder.run_id if self._recorder is not None else None

    def finish_saving(self, *, exited: bool, **overrides: Any) -> RunResult | None:
        """Write the result and status of the saved run (None when not saving) and close the store;
        `overrides` replace fields of the result (a launched script's status, exit code and log), a field the watch's
        result lacks added at its end."""
        with self._lock:
            if self._recorder is None or self._recorder.finished:
                return None
            result = self.result(exited=exited)
            for key, value in overrides.items():
                setattr(result, key, value)
            self._recorder.finish(result)
            result.history_error = self._recorder.history_error
            return result

    def result(self, *, exited: bool) -> RunResult:
        """The watched run's result in the terms of `gpuanat run --json`, so history and compare read it."""
        return watched_result(
            self._records, exited=exited, run_id=self.saved_run_id, name=self._recorder.name if self._recorder else None
        )

    def close(self) -> None:
        if self._publications is not None:
            self._publications.close()


def follow(
    session: WatchSession,
    sampler: Sampler,
    *,
    interval_s: float,
    on_record: Callable[[dict[str, Any]], None],
    duration_s: float | None = None,
    stop_requested: threading.Event | None = None,
    exit_code: Callable[[], int | None] = lambda: None,
) -> str:
    """Sample on the calling thread every `interval_s` and hand each record to `on_record`, until the process
    exits (then the final record; returns "exited"), `duration_s` passes ("duration"), `stop_requested` is set
    ("stopped") or a replayed trace ends ("trace ended")."""
    sampler.track(session.target.pid)
    started_s = time.monotonic()
    next_read_s = started_s
    while True:
        if not session.alive():
            on_record(session.final_record(exit_code=exit_code()))
            return "exited"
        try:
            sample = sampler.sample_once()
        except StopIteration:
            return "trace ended"
        on_record(session.handle(sample))
        now_s = time.monotonic()
        if duration_s is not None and now_s - started_s >= duration_s:
            return "duration"
        next_read_s = max(next_read_s + interval_s, now_s)
        if stop_requested is not None:
            if stop_requested.wait(next_read_s - now_s):
                return "stopped"
        else:
            time.sleep(next_read_s - now_s)
