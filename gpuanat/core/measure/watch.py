"""Watching a process gpuanat did not start: `gpuanat watch PID`, one record per sample.

A `WatchSession` follows one process and its descendants (DataLoader workers, ranks). Each sample of the
injected source (NVML + psutil live, or a recorded NVML trace with live psutil in tests) becomes one
JSON-ready record: host CPU and RSS of the tree and of each process, GPU memory of the tree on every GPU it
uses (NVML per-process), GPU utilization (per process where NVML reports it, else device-wide, labelled),
the device's other processes, how NVML's PIDs relate to ours (`pid_namespace`), and — when a process of the
tree publishes probe events (`AnatomyCallback` in its script, see `gpuanat.core.measure.publish`) — the step,
throughput and memory bands, exactly as for runs gpuanat launched. When the process exits, `final_record`
says so. The session can record itself into the history as a run of kind `watched` (`start_saving`).

`gpuanat run --script` uses the same session for the child it launched, with events from its pipe
(`add_events`) instead of publication files.

Plain Python: no torch, no UI. Reads run on whatever thread calls `handle`; nothing here touches a widget.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from gpuanat.core.measure.anatomy import MemoryBands, assemble_bands
from gpuanat.core.measure.pid_namespace import PidMapping, PidNamespaceResolver
from gpuanat.core.measure.publish import PUBLICATION_SUFFIX, PublicationReader, publication_dirs
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.measure.samples import GpuSample, NvmlStatus, Sample
from gpuanat.core.run.protocol import Done, Error, Event, Hello, Malformed, ModelInfo, ProbeBands, Step
from gpuanat.core.store.history import HistoryStore, write_with_backoff
from gpuanat.core.store.recording import FINAL_WRITE_DEADLINE_S, PendingWrites

THROUGHPUT_WINDOW_S = 5.0
"""Samples/s in a record is the rate over the published steps of about this many seconds of training."""
PUBLICATION_SEARCH_INTERVAL_S = 1.0
"""How often the tree's processes that do not publish yet are looked for in the publication directories."""
KEPT_SAMPLES = 20_000
"""Samples kept for a save requested later (about 80 minutes at 4 Hz); older ones are dropped."""
KEPT_STEPS = 20_000
HISTORY_FLUSH_INTERVAL_S = 1.0
NOT_PUBLISHED = ("not published: the script has no gpuanat AnatomyCallback "
                 "(add trainer.add_callback(gpuanat.probe.AnatomyCallback()))")
NEEDS_PROBE_RESERVED = "needs torch's reserved memory, which only the probe reports"


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
        command = " ".join(process.cmdline())
    except psutil.Error:
        command = ""
    try:
        username: str | None = process.username()
    except psutil.Error:
        username = None
    return WatchTarget(pid=pid, name=name, command=command, create_time_s=create_time_s, username=username)


def _default_publication_dirs(pid: int) -> list[Path]:
    """Where `pid` would publish: from its own environment when we may read it, then from ours."""
    uid = os.getuid()
    dirs: list[Path] = []
    with contextlib.suppress(psutil.Error):
        dirs.extend(publication_dirs(psutil.Process(pid).environ(), uid))
    dirs.extend(publication_dirs(os.environ, uid))
    return list(dict.fromkeys(dirs))


class _Publications:
    """Finds and follows the publication files of the watched tree's processes."""

    def __init__(self, dirs_for: Callable[[int], list[Path]], clock: Callable[[], float]) -> None:
        self._dirs_for = dirs_for
        self._clock = clock
        self.readers: dict[int, PublicationReader] = {}
        self.problems: dict[int, str] = {}
        self._searched_at_s: dict[int, float] = {}

    def poll(self, pids: Iterable[int]) -> list[tuple[int, Event | Malformed]]:
        now_s = self._clock()
        for pid in pids:
            if pid in self.readers or now_s - self._searched_at_s.get(pid, -1e9) < PUBLICATION_SEARCH_INTERVAL_S:
                continue
            self._searched_at_s[pid] = now_s
            for directory in self._dirs_for(pid):
                path = directory / f"{pid}{PUBLICATION_SUFFIX}"
                if os.path.lexists(path):
                    try:
                        started_s = psutil.Process(pid).create_time()
                    except psutil.Error:
                        break
                    self.readers[pid] = PublicationReader(path, not_before_s=started_s - 0.5)
                    break
        events: list[tuple[int, Event | Malformed]] = []
        for pid, reader in list(self.readers.items()):
            events.extend((pid, event) for event in reader.read())
            if reader.problem is not None:
                self.problems[pid] = reader.problem
                reader.close()
                del self.readers[pid]
                self._searched_at_s[pid] = now_s + 30.0  # do not retry an untrusted file at every sample
            else:
                self.problems.pop(pid, None)
        return events

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()


@dataclass
class Publisher:
    """What one publishing process of the tree has said: with torchrun, one rank."""

    pid: int
    rank: int | None = None
    """From the process's RANK (torchrun, accelerate launch); None when unreadable or not set."""
    probe_bands: ProbeBands | None = None
    reserved_bytes: int | None = None
    step: int | None = None

    def observe(self, event: Event) -> None:
        if isinstance(event, (Step, Done)) and event.bands is not None and (
                self.probe_bands is None or event.bands.measured_at_step >= self.probe_bands.measured_at_step):
            self.probe_bands = event.bands
        if isinstance(event, Step):
            self.step = event.step if self.step is None else max(self.step, event.step)
            if event.reserved_bytes is not None:
                self.reserved_bytes = event.reserved_bytes


def _rank_of(pid: int) -> int | None:
    with contextlib.suppress(psutil.Error, ValueError):
        rank = psutil.Process(pid).environ().get("RANK")
        return int(rank) if rank is not None else None
    return None


@dataclass
class ObservedRun:
    """What the watch has learned about the run: probe events of the publishing process, and peaks."""

    hello: Hello | None = None
    model: ModelInfo | None = None
    last_step: Step | None = None
    probe_bands: ProbeBands | None = None
    done: Done | None = None
    error: Error | None = None
    malformed: int = 0
    publisher_pid: int | None = None
    peak_reserved_bytes: int | None = None
    peak_gpu_memory_bytes: int | None = None
    """The tree's GPU memory (NVML per-process, all GPUs) at its highest."""
    peak_device_used_bytes: int | None = None
    device_total_bytes: int | None = None
    gpu_name: str | None = None
    peak_rss_bytes: int | None = None
    peak_cpu_percent: float | None = None
    recent_steps: collections.deque[tuple[float, int]] = field(
        default_factory=lambda: collections.deque(maxlen=256))
    """(elapsed s, samples) of the latest published steps, for the current samples/s."""
    steps: collections.deque[dict[str, Any]] = field(default_factory=lambda: collections.deque(maxlen=KEPT_STEPS))
    publishers: dict[int, Publisher] = field(default_factory=dict)
    """Every publishing process, by PID, in the order they first published: each rank of a distributed job."""

    def observe_event(self, pid: int, event: Event | Malformed) -> Step | None:
        """Take one event; returns the step when it is a new one (for the history)."""
        if isinstance(event, Malformed):
            self.malformed += 1
            return None
        if pid not in self.publishers:
            self.publishers[pid] = Publisher(pid, rank=_rank_of(pid))
        self.publishers[pid].observe(event)
        if self.publisher_pid is None or (self.publishers[pid].rank == 0
                                          and self.publishers[self.publisher_pid].rank != 0):
            self.publisher_pid = pid  # rank 0 speaks for the run; without ranks, the first publisher
        if pid != self.publisher_pid:
            return None
        if isinstance(event, Hello):
            self.hello = event
        elif isinstance(event, ModelInfo):
            # A rewritten publication file starts over with the same ModelInfo; a new model means a new run.
            if event != self.model or self.done is not None:
                self.model, self.done, self.last_step = event, None, None
                self.recent_steps.clear()
        elif isinstance(event, Step):
            if event.bands is not None and (self.probe_bands is None
                                            or event.bands.measured_at_step >= self.probe_bands.measured_at_step):
                self.probe_bands = event.bands
            if event.reserved_bytes is not None:
                self.peak_reserved_bytes = max(self.peak_reserved_bytes or 0, event.reserved_bytes)
            if self.last_step is not None and event.step <= self.last_step.step:
                return None
            self.last_step = event
            self.recent_steps.append((event.elapsed_s, event.samples))
            record = dataclasses.asdict(event)
            self.steps.append(record)
            return event
        elif isinstance(event, Done):
            self.done = event
            if event.bands is not None:
                self.probe_bands = event.bands
            if event.peak_reserved_bytes is not None:
                self.peak_reserved_bytes = max(self.peak_reserved_bytes or 0, event.peak_reserved_bytes)
        elif isinstance(event, Error):
            self.error = event
        return None

    def samples_per_second(self) -> float | None:
        """Samples/s over the last `THROUGHPUT_WINDOW_S` seconds of published steps."""
        if len(self.recent_steps) < 2:
            return None
        last_elapsed_s, last_samples = self.recent_steps[-1]
        first_elapsed_s, first_samples = self.recent_steps[-2]
        for elapsed_s, samples in reversed(self.recent_steps):
            if last_elapsed_s - elapsed_s > THROUGHPUT_WINDOW_S:
                break
            first_elapsed_s, first_samples = elapsed_s, samples
        if last_elapsed_s <= first_elapsed_s:
            return None
        return (last_samples - first_samples) / (last_elapsed_s - first_elapsed_s)


def _gpu_of(gpus: Sequence[GpuSample], nvml_pids: set[int]) -> GpuSample | None:
    """The GPU a process trains on: where NVML lists the most of its memory. A rank may hold a small context on
    another GPU too (seen on 4 H200s: a torchrun rank with 610 MiB on rank 0's GPU and 11.7 GiB on its own)."""
    listed = [gpu for gpu in gpus if any(process.pid in nvml_pids for process in gpu.processes)]
    return max(listed, key=lambda gpu: _gpu_used_by(gpu, nvml_pids)[0], default=None)


def _gpu_used_by(gpu: GpuSample, nvml_pids: set[int]) -> tuple[int, bool]:
    """Memory NVML reports for `nvml_pids` on `gpu`, and whether any of them is listed without a number."""
    used = 0
    unknown = False
    for process in gpu.processes:
        if process.pid in nvml_pids:
            if process.used_bytes is None:
                unknown = True
            else:
                used += process.used_bytes
    return used, unknown


class WatchSession:
    """Turns samples of one watched process tree into records; keeps what a save needs."""

    def __init__(
        self,
        target: WatchTarget,
        nvml: NvmlStatus,
        *,
        clock: Callable[[], float] = time.monotonic,
        resolver: PidNamespaceResolver | None = None,
        publication_dirs_for: Callable[[int], list[Path]] | None = _default_publication_dirs,
        process_alive: Callable[[], bool] | None = None,
        kind: str = "watched",
        description: Mapping[str, Any] | None = None,
    ) -> None:
        """`publication_dirs_for` None: events come only through `add_events` (a child gpuanat launched).
        `process_alive` defaults to psutil: the target still runs and is not a zombie. `kind` and
        `description` (config entries that say what ran; default the PID and command) are for the history."""
        self.target = target
        self.kind = kind
        self._description = dict(description) if description is not None else {
            "watched_pid": target.pid, "command": target.command or target.name}
        self.nvml = nvml
        self._clock = clock
        self._resolver = resolver or PidNamespaceResolver()
        self._publications = (_Publications(publication_dirs_for, clock)
                              if publication_dirs_for is not None else None)
        self._process_alive = process_alive or self._psutil_alive
        self._process: psutil.Process | None = None
        self.started_s = clock()
        self.observed = ObservedRun()
        self.samples: collections.deque[dict[str, Any]] = collections.deque(maxlen=KEPT_SAMPLES)
        self.last_record: dict[str, Any] | None = None
        self.mapping = PidMapping()
        self._pushed_events: collections.deque[tuple[int, Event | Malformed]] = collections.deque()
        self._lock = threading.Lock()
        self._recorder: _HistoryRecorder | None = None
        self._save_request: tuple[Path, str | None, Callable[[int | None, str | None], None] | None] | None = None
        self._new_steps: list[Step] = []
        self._other_process_names: dict[int | None, str | None] = {}
        """The names of the other processes on the GPUs, kept while NVML lists them (read once, not every sample)."""

    # --- inputs ----------------------------------------------------------------------------------
    def add_events(self, pid: int, events: Iterable[Event | Malformed]) -> None:
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
        incoming: list[tuple[int, Event | Malformed]] = []
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
            record = self._record(sample)
            sample_json = sample.to_json()
            self.samples.append(sample_json)
            self.last_record = record
            self._serve_save_request()
            if self._recorder is not None and not self._recorder.finished:
                self._recorder.add(sample_json, self._new_steps)
        return record

    def _record(self, sample: Sample) -> dict[str, Any]:
        host = sample.host
        tree_pids = [self.target.pid] + [p.pid for p in host.processes if p.pid != self.target.pid]
        self._new_steps = self._drain_events(tree_pids)
        nvml_pids_listed = {process.pid for gpu in sample.gpus for process in gpu.processes}
        nvml_pids_listed |= {entry.pid for gpu in sample.gpus for entry in gpu.process_utilization or ()}
        self.mapping = mapping = self._resolver.resolve(nvml_pids_listed, tree_pids)
        tree_nvml_pids = mapping.nvml_pids_of(tree_pids)
        observed = self.observed

        gpus: list[dict[str, Any]] = []
        gpu_memory_bytes: int | None = 0
        memory_unknown = False
        for gpu in sample.gpus:
            used, unknown = _gpu_used_by(gpu, tree_nvml_pids)
            memory_unknown |= unknown
            gpu_memory_bytes = (gpu_memory_bytes or 0) + used
            on_gpu = any(process.pid in tree_nvml_pids for process in gpu.processes)
            process_util = None
            if gpu.process_utilization is not None:
                process_util = sum(entry.sm_util_percent for entry in gpu.process_utilization
                                   if entry.pid in tree_nvml_pids)
            gpus.append({
                "index": gpu.index, "name": gpu.name, "uses_it": on_gpu,
                "process_memory_bytes": used if on_gpu else 0,
                "used_bytes": gpu.used_bytes, "total_bytes": gpu.total_bytes,
                "other_processes_bytes": gpu.used_bytes - used if gpu.used_bytes is not None else None,
                "device_util_percent": gpu.gpu_util_percent, "process_util_percent": process_util,
                "memory_util_percent": gpu.memory_util_percent, "power_w": gpu.power_w,
                "temperature_c": gpu.temperature_c,
            })
        gpu_memory_reason = None
        if not sample.gpus:
            gpu_memory_bytes = None
            gpu_memory_reason = f"no GPU readings: {self.nvml.reason or 'NVML unavailable'}"
        elif memory_unknown and not gpu_memory_bytes:
            gpu_memory_bytes = None
            gpu_memory_reason = "NVML lists the process without its memory (MIG or no permission)"
        elif mapping.foreign and not tree_nvml_pids:
            gpu_memory_bytes = None
            gpu_memory_reason = "NVML's PIDs are from another PID namespace and could not be mapped to this process"

        used_gpus = [entry for entry in gpus if entry["uses_it"]] or gpus
        gpu_util_percent: float | None = None
        gpu_util_scope: str | None = None
        process_utils = [entry["process_util_percent"] for entry in used_gpus
                         if entry["process_util_percent"] is not None]
        if used_gpus and len(process_utils) == len(used_gpus) and any(entry["uses_it"] for entry in gpus):
            gpu_util_percent, gpu_util_scope = sum(process_utils) / len(process_utils), "process"
        else:
            device_utils = [entry["device_util_percent"] for entry in used_gpus
                            if entry["device_util_percent"] is not None]
            if device_utils:
                gpu_util_percent, gpu_util_scope = sum(device_utils) / len(device_utils), "device"

        memory_by_local_pid: dict[int, int] = collections.defaultdict(int)
        other_processes = []
        named: dict[int | None, str | None] = {}
        for gpu in sample.gpus:
            for process in gpu.processes:
                local_pid = mapping.local_by_nvml.get(process.pid)
                if process.pid in tree_nvml_pids and local_pid is not None:
                    memory_by_local_pid[local_pid] += process.used_bytes or 0
                else:
                    if local_pid not in named:
                        named[local_pid] = (self._other_process_names[local_pid]
                                            if local_pid in self._other_process_names else _process_name(local_pid))
                    other_processes.append({"gpu": gpu.index, "pid": process.pid, "local_pid": local_pid,
                                            "name": named[local_pid], "used_bytes": process.used_bytes})
        self._other_process_names = named  # one that leaves the GPU is forgotten: a PID used again is named again
        processes = [{"pid": p.pid, "parent_pid": p.parent_pid, "name": p.name, "cpu_percent": p.cpu_percent,
                      "rss_bytes": p.rss_bytes, "gpu_memory_bytes": memory_by_local_pid.get(p.pid)}
                     for p in host.processes]

        if host.rss_bytes is not None:
            observed.peak_rss_bytes = max(observed.peak_rss_bytes or 0, host.rss_bytes)
        if host.cpu_percent is not None:
            observed.peak_cpu_percent = max(observed.peak_cpu_percent or 0.0, host.cpu_percent)
        if gpu_memory_bytes is not None:
            observed.peak_gpu_memory_bytes = max(observed.peak_gpu_memory_bytes or 0, gpu_memory_bytes)
        main_gpu, main_process_bytes = self._main_gpu(sample, tree_nvml_pids)
        if main_gpu is not None:
            observed.gpu_name, observed.device_total_bytes = main_gpu.name, main_gpu.total_bytes
            if main_gpu.used_bytes is not None:
                observed.peak_device_used_bytes = max(observed.peak_device_used_bytes or 0, main_gpu.used_bytes)

        published = observed.publisher_pid is not None
        bands = bands_unavailable = None
        if published:
            memory = self._bands(main_gpu, main_process_bytes, observed.last_step.reserved_bytes
                                 if observed.last_step else None, main_gpu.used_bytes if main_gpu else None)
            bands_unavailable = memory.unavailable
            bands = {key: value for key, value in memory.to_json().items() if key != "unavailable"}
        last_step = observed.last_step
        done = observed.done
        return {
            "pid": self.target.pid,
            "t": round(sample.t_s - self.started_s, 3),
            "exited": False,
            "cpu_percent": host.cpu_percent,
            "rss_bytes": host.rss_bytes,
            "gpu_memory_bytes": gpu_memory_bytes,
            "gpu_memory_reason": gpu_memory_reason,
            "gpu_util_percent": gpu_util_percent,
            "gpu_util_scope": gpu_util_scope,
            "gpus": gpus,
            "processes": processes,
            "other_gpu_processes": other_processes,
            "pid_namespace": None if not mapping.other_namespace else {
                "note": mapping.note, "mapped": {str(nvml_pid): local for nvml_pid, local
                                                 in mapping.local_by_nvml.items() if nvml_pid != local},
                "unmapped": list(mapping.foreign)},
            "published": published,
            "publisher_pid": observed.publisher_pid,
            "publication_reason": None if published else self._publication_reason(),
            "step": last_step.step if last_step else None,
            "total_steps": observed.model.total_steps if observed.model else None,
            "samples": last_step.samples if last_step else None,
            "loss": last_step.loss if last_step else None,
            "samples_per_second": observed.samples_per_second(),
            "steady_samples_per_second": done.steady_samples_per_second if done else None,
            "params": observed.model.params if observed.model else None,
            "training_done": done is not None,
            "bands": bands,
            "bands_unavailable": bands_unavailable,
            "gradients_at_forward_end_bytes": (observed.probe_bands.gradients_at_forward_end_bytes
                                               if observed.probe_bands else None),
            "bands_measured_at_step": observed.probe_bands.measured_at_step if observed.probe_bands else None,
            "malformed_events": observed.malformed,
            "ranks": self._ranks(sample, mapping),
        }

    def _ranks(self, sample: Sample, mapping: Any) -> list[dict[str, Any]]:
        """Every publishing process (each rank of a distributed job) with its GPU and its own bands, computed as
        one GPU's are: from its probe and NVML's reading of the GPU NVML lists its PID on."""
        ranks = []
        for position, publisher in enumerate(self.observed.publishers.values()):
            nvml_pids = mapping.nvml_pids_of([publisher.pid])
            gpu = _gpu_of(sample.gpus, nvml_pids)
            used = _gpu_used_by(gpu, nvml_pids)[0] if gpu is not None else None
            hello = self.observed.hello
            no_gpu = ("CPU run: it uses no GPU memory" if hello is not None and hello.device != "cuda"
                      else None if gpu is not None else "NVML lists no GPU memory of this process")
            memory = assemble_bands(publisher.probe_bands, reserved_bytes=publisher.reserved_bytes,
                                    device_used_bytes=gpu.used_bytes if gpu else None,
                                    device_total_bytes=gpu.total_bytes if gpu else None,
                                    process_used_bytes=used, no_gpu_reason=no_gpu)
            ranks.append({"pid": publisher.pid, "rank": publisher.rank if publisher.rank is not None else position,
                          "gpu_index": gpu.index if gpu else None, "step": publisher.step,
                          "used_bytes": gpu.used_bytes if gpu else None,
                          "total_bytes": gpu.total_bytes if gpu else None,
                          "gradients_at_forward_end_bytes": (publisher.probe_bands.gradients_at_forward_end_bytes
                                                             if publisher.probe_bands else None),
                          "bands": {key: value for key, value in memory.to_json().items() if key != "unavailable"},
                          "bands_unavailable": memory.unavailable})
        return sorted(ranks, key=lambda entry: entry["rank"])

    def _publication_reason(self) -> str:
        if self._publications is None:
            return "the process has sent no probe events yet"
        problems = self._publications.problems
        if problems:
            pid, problem = next(iter(problems.items()))
            return f"publication of PID {pid} not trusted: {problem}"
        return NOT_PUBLISHED

    def _main_gpu(self, sample: Sample, tree_nvml_pids: set[int]) -> tuple[GpuSample | None, int | None]:
        """The GPU whose memory the bands describe — the publishing process's, else the tree's largest — and
        the watched memory on it."""
        if not sample.gpus:
            return None, None
        publisher = self.observed.publisher_pid
        candidates = self.mapping.nvml_pids_of([publisher]) if publisher is not None else set()
        best: tuple[int, GpuSample] | None = None
        for pids in (candidates, tree_nvml_pids):
            for gpu in sample.gpus:
                used, _ = _gpu_used_by(gpu, pids)
                if any(process.pid in pids for process in gpu.processes) and (best is None or used > best[0]):
                    best = (used, gpu)
            if best is not None:
                return best[1], best[0]
        return sample.gpus[0], None

    def _bands(self, gpu: GpuSample | None, process_used_bytes: int | None, reserved_bytes: int | None,
               device_used_bytes: int | None) -> MemoryBands:
        hello = self.observed.hello
        no_gpu_reason = None
        if hello is not None and hello.device != "cuda":
            no_gpu_reason = "CPU run: it uses no GPU memory"
        elif gpu is None:
            no_gpu_reason = f"no GPU readings: {self.nvml.reason or 'NVML unavailable'}"
        return assemble_bands(self.observed.probe_bands, reserved_bytes=reserved_bytes,
                              device_used_bytes=device_used_bytes,
                              device_total_bytes=gpu.total_bytes if gpu else None,
                              process_used_bytes=process_used_bytes, no_gpu_reason=no_gpu_reason)

    def final_record(self, *, exit_code: int | None = None) -> dict[str, Any]:
        """The record that ends the watch because the process exited (after reading its last events)."""
        with self._lock:
            self._new_steps = self._drain_events([self.target.pid, *self.observed_pids()])
            if self._recorder is not None and not self._recorder.finished:
                self._recorder.add(None, self._new_steps)
            observed = self.observed
            return {
                "pid": self.target.pid,
                "t": round(self._clock() - self.started_s, 3),
                "exited": True,
                "exit_code": exit_code,
                "training_done": observed.done is not None,
                "steps": observed.last_step.step if observed.last_step else None,
                "peak_gpu_memory_bytes": observed.peak_gpu_memory_bytes,
                "peak_rss_bytes": observed.peak_rss_bytes,
                "steady_samples_per_second": observed.done.steady_samples_per_second if observed.done else None,
                "malformed_events": observed.malformed,
            }

    def observed_pids(self) -> list[int]:
        if self.last_record is None:
            return []
        return [process["pid"] for process in self.last_record["processes"]]

    # --- the history -----------------------------------------------------------------------------
    def request_save(self, db_path: Path, name: str | None = None,
                     on_saved: Callable[[int | None, str | None], None] | None = None) -> None:
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
            self._recorder = _HistoryRecorder(store, self, name, run_id)
        return self._recorder.run_id

    @property
    def saved_run_id(self) -> int | None:
        return self._recorder.run_id if self._recorder is not None else None

    def finish_saving(self, *, exited: bool, **overrides: Any) -> dict[str, Any] | None:
        """Write the result and status of the saved run (None when not saving) and close the store;
        `overrides` replace entries of the result (a launched script's status, exit code and log)."""
        with self._lock:
            if self._recorder is None or self._recorder.finished:
                return None
            result = {**self.result(exited=exited), **overrides}
            self._recorder.finish(result)
            return {**result, "history_error": self._recorder.history_error}

    def config(self) -> dict[str, Any]:
        """What the run is, for the history: the techniques the probe reported, else the command."""
        config: dict[str, Any] = dict(self.observed.hello.config) if self.observed.hello else {}
        config.update(self._description)
        return config

    def result(self, *, exited: bool) -> dict[str, Any]:
        """The watched run's result in the terms of `gpuanat run --json`, so history and compare read it."""
        observed, done, last_step = self.observed, self.observed.done, self.observed.last_step
        status = "ok" if done is not None and done.status == "ok" else "exited" if exited else "detached"
        unavailable: dict[str, str] = {}
        bands: dict[str, Any] = {}
        if observed.publisher_pid is not None:
            gpu_total = observed.device_total_bytes
            memory = assemble_bands(
                observed.probe_bands, reserved_bytes=(done.peak_reserved_bytes if done else None)
                or observed.peak_reserved_bytes, device_used_bytes=observed.peak_device_used_bytes,
                device_total_bytes=gpu_total, process_used_bytes=observed.peak_gpu_memory_bytes,
                no_gpu_reason=("CPU run: it uses no GPU memory" if observed.hello and observed.hello.device != "cuda"
                               else None if observed.gpu_name else "no GPU readings"))
            bands = {key: value for key, value in memory.to_json().items() if key != "unavailable"}
            unavailable.update(memory.unavailable)
        else:
            unavailable["bands"] = self._publication_reason()
        train_runtime_s = done.train_runtime_s if done else (last_step.elapsed_s if last_step else None)
        samples_per_second = done.samples_per_second if done else (
            last_step.samples / last_step.elapsed_s if last_step and last_step.elapsed_s > 0 else None)
        if done is None or done.steady_samples_per_second is None:
            unavailable["steady_samples_per_second"] = (
                (done.steady_reason if done else None) or "the run had not finished training when the watch ended")
        if observed.peak_gpu_memory_bytes is None:
            unavailable["device_memory_used_bytes"] = (self.last_record or {}).get("gpu_memory_reason") or "no GPU"
        hello = observed.hello
        return {
            "run_id": self.saved_run_id,
            "name": self._recorder.name if self._recorder else None,
            "kind": self.kind,
            "status": status,
            "config": self.config(),
            "params": observed.model.params if observed.model else None,
            "train_runtime_s": train_runtime_s,
            "samples_per_second": samples_per_second,
            "steady_samples_per_second": done.steady_samples_per_second if done else None,
            "warmup_steps": done.warmup_steps if done else None,
            "steps": done.steps if done else (last_step.step if last_step else 0),
            "samples": done.samples if done else (last_step.samples if last_step else 0),
            "train_loss": done.train_loss if done else None,
            "peak_allocated_bytes": done.peak_allocated_bytes if done else None,
            "peak_reserved_bytes": (done.peak_reserved_bytes if done else None) or observed.peak_reserved_bytes,
            "device_memory_used_bytes": observed.peak_device_used_bytes,
            "process_memory_used_bytes": observed.peak_gpu_memory_bytes,
            "device_memory_total_bytes": observed.device_total_bytes,
            "peak_rss_bytes": observed.peak_rss_bytes,
            "peak_cpu_percent": observed.peak_cpu_percent,
            "device": hello.device if hello else None,
            "device_name": hello.device_name if hello else None,
            "gpu_name": observed.gpu_name,
            "versions": hello.versions if hello else {},
            "bands": bands,
            "gradients_at_forward_end_bytes": (observed.probe_bands.gradients_at_forward_end_bytes
                                               if observed.probe_bands else None),
            "unavailable": unavailable,
            "published": observed.publisher_pid is not None,
            "watched_s": round(self._clock() - self.started_s, 3),
            "pid_namespace_note": self.mapping.note,
            "error": ({"kind": observed.error.kind, "message": observed.error.message, "step": observed.error.step,
                       "flag": observed.error.flag} if observed.error else None),
            "log_path": None,
            "malformed_events": observed.malformed,
            "ranks": (self.last_record or {}).get("ranks", []),
        }

    def close(self) -> None:
        if self._publications is not None:
            self._publications.close()


def _process_name(pid: int | None) -> str | None:
    if pid is None:
        return None
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return None


class _HistoryRecorder:
    """Writes a watched session into the history while it goes on (samples and steps, once a second), through
    `PendingWrites`: a busy or full history delays the writes, never the watch.

    SQLite connections belong to the thread that opened them: the last writes, from another thread (a
    dashboard quitting), go through a connection of their own."""

    def __init__(self, store: HistoryStore, session: WatchSession, name: str | None, run_id: int | None) -> None:
        self.store = store
        self.finished = False
        self.history_error: str | None = None
        """What the last writes could not save, when the history refused them until the end."""
        self._thread = threading.get_ident()
        self.name = name or f"watch {session.target.pid} {session.target.name}"
        self.run_id = run_id if run_id is not None else write_with_backoff(
            lambda: store.create_run(session.config(), kind=session.kind, name=self.name),
            deadline_s=FINAL_WRITE_DEADLINE_S)
        self._session = session
        self._pending = PendingWrites(store, self.run_id)
        environment = self._environment()
        self._pending.update(lambda history: history.set_environment(self.run_id, environment))
        self._pending.add_samples(session.samples)
        self._pending.add_steps(session.observed.steps)
        self._flushed_at_s = -1e9
        self._flush()

    def _environment(self) -> dict[str, Any]:
        session = self._session
        hello = session.observed.hello
        nvml_pids = sorted(session.mapping.nvml_pids_of([session.target.pid, *session.observed_pids()]))
        return {"pid": nvml_pids[0] if len(nvml_pids) == 1 else session.target.pid, "nvml_pids": nvml_pids,
                "watched_pid": session.target.pid, "command": session.target.command,
                "username": session.target.username, "versions": hello.versions if hello else {},
                "device": hello.device if hello else None, "nvml": dataclasses.asdict(session.nvml)}

    def add(self, sample_json: Mapping[str, Any] | None, steps: Iterable[Step]) -> None:
        if sample_json is not None:
            self._pending.add_samples([sample_json])
        self._pending.add_steps(dataclasses.asdict(step) for step in steps)
        if time.monotonic() - self._flushed_at_s >= HISTORY_FLUSH_INTERVAL_S:
            self._flush()

    def _flush(self) -> None:
        self._pending.flush()
        self._flushed_at_s = time.monotonic()

    def finish(self, result: dict[str, Any]) -> None:
        store = self.store if threading.get_ident() == self._thread else HistoryStore(self.store.path)
        config, environment = self._session.config(), self._environment()

        def final_write(history: HistoryStore) -> None:
            history.set_config(self.run_id, config)
            history.set_environment(self.run_id, environment)
            history.update_result(self.run_id, {**result, "run_id": self.run_id}, status=result["status"])

        self.history_error = self._pending.finish(final_write, store=store)
        store.close()
        self.finished = True


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
