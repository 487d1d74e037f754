"""One recorded training run: child + sampler + history, from start to a result.

`execute_run` is what `gpuanat run` and `gpuanat sweep` call: it spawns the worker, samples NVML
and host metrics while it trains, writes step records and samples to the history as they arrive,
and returns the run's result — the JSON contract of `gpuanat run --json`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuanat.core.export.run_metrics import RunMetrics
from gpuanat.core.measure.diagnose import diagnose, reference_rates
from gpuanat.core.measure.gpus import (
    Gpu,
    GpuChoice,
    child_gpu_environment,
    gpus_for_run,
    read_gpus,
)
from gpuanat.core.measure.nvml_guard import GpuFaultLog
from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.measure.result import RankRecord, build_result
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.measure.samples import NvmlStatus, Sample
from gpuanat.core.measure.startup import REQUESTED
from gpuanat.core.run.runner import ChildExited, ChildProcess, worker_command
from gpuanat.core.run.warm import AHEAD_MIN_CORES, WarmStart, WarmWorkers, adopt, usable_cores
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.history_errors import HistoryError, write_with_backoff
from gpuanat.core.store.recording import FINAL_WRITE_DEADLINE_S, PendingWrites
from gpuanat.core.vocabulary.config import RunConfig, child_environment
from gpuanat.core.vocabulary.protocol import (
    Event,
    Hello,
    Malformed,
    Ranked,
    Step,
)
from gpuanat.core.vocabulary.result import RunResult

SAMPLE_INTERVAL_S = 0.25
HISTORY_FLUSH_INTERVAL_S = 1.0
HISTORY_REFERENCE_RUNS = 500
"""The latest runs searched for the same training eager or on one GPU (the diagnosis's compile and scaling rules)."""
EVENT_POLL_INTERVAL_S = 0.2

SamplerFactory = Callable[[], tuple[Any, NvmlStatus]]


@dataclass(frozen=True)
class SharedSampler:
    """A sampler already running, with the NVML status of its source: the dashboard's. A run given one tracks its
    child on it and listens to its samples instead of starting a second sampler that would read NVML and the
    process tree again at the same pace (the dashboard's own run read everything twice)."""

    sampler: Sampler
    nvml: NvmlStatus


def run_environment(
    config: RunConfig, base_environment: Mapping[str, str], gpu_reader: Callable[[], list[Gpu]] = read_gpus
) -> tuple[GpuChoice | None, dict[str, str]]:
    """The GPUs `config` trains on and its training process's environment: `base_environment` with the allocator's
    options and the chosen GPUs. Raises ConfigError when the GPUs cannot be had."""
    choice = gpus_for_run(config, base_environment, gpu_reader() if config.device == "cuda" else [])
    return choice, {
        **child_environment(config, base_environment),
        **child_gpu_environment(choice, config, base_environment),
    }


def execute_run(
    config: RunConfig,
    *,
    store: HistoryStore,
    log_dir: Path,
    name: str | None = None,
    on_event: Callable[[Event | Ranked], None] | None = None,
    sampler_factory: SamplerFactory = open_source,
    shared_sampler: SharedSampler | None = None,
    env: Mapping[str, str] | None = None,
    trace_path: Path | None = None,
    stop_grace_s: float = 10.0,
    stop_requested: threading.Event | None = None,
    on_start: Callable[[int, int, Path, tuple[int, ...]], None] | None = None,
    gpu_reader: Callable[[], list[Gpu]] = read_gpus,
    requested_monotonic_s: float | None = None,
    warm_workers: WarmWorkers | None = None,
    metrics: RunMetrics | None = None,
    search_id: int | None = None,
    tags: Sequence[str] = (),
    data_longest_row: int | None = None,
) -> RunResult:
    """Train `config` in a child process, record it, return its result.

    The GPUs are chosen first (`gpuanat.core.measure.gpus`, from what `gpu_reader` lists): ConfigError, before
    anything is recorded, when they cannot be had. Several ranks are started through the rank launcher; rank 0's
    events are the run's own, every rank's measurements land in the result's `ranks`.

    Ctrl-C (KeyboardInterrupt) while it runs — or `stop_requested` being set, from any thread — stops
    the child and its process group and records the run as stopped. `on_event` sees every decoded
    event (another rank's in its `Ranked` envelope), on the calling thread; `on_start` gets (run id, child pid,
    log path, the NVML indices of the GPUs of ranks 0, 1, …) once the child runs.
    A history that is busy or full does not stop the run (see gpuanat.core.store.recording); when its last
    writes could not be saved, the result's `history_error` says so. `requested_monotonic_s` is when the user asked
    for the run (time.monotonic(); default: now), where the result's `wall_breakdown_s` begins. With a running
    `shared_sampler` the run samples through it (`sampler_factory` unused); `trace_path` needs a sampler of the run's
    own. With `warm_workers`, a worker prepared ahead takes the run when it can (gpuanat.core.run.warm; the result's
    `start` says whether and why not), and the next one is prepared. `metrics` is told the run's start, events,
    samples and result (a Prometheus endpoint reads it: gpuanat.core.export). `data_longest_row`: --data's longest
    row in tokens, from the parent's data check, which sizes the prediction stored with the run (`build_result`).
    """
    if shared_sampler is not None and trace_path is not None:
        raise ValueError("trace_path records the run's own sampler: it cannot be given with shared_sampler")
    parent_points = {REQUESTED: time.monotonic() if requested_monotonic_s is None else requested_monotonic_s}
    choice, environment = run_environment(config, os.environ if env is None else env, gpu_reader)
    rank_count = len(choice.gpus) if choice is not None else (config.ranks or 1)
    run_id = write_with_backoff(
        lambda: store.create_run(config.to_json(), name=name, search_id=search_id, tags=tags),
        deadline_s=FINAL_WRITE_DEADLINE_S,
    )
    log_path = log_dir / f"run-{run_id}.log"
    pending = PendingWrites(store, run_id)
    pending.update(lambda history: history.set_log_path(run_id, log_path))

    def gpu_of(rank: int) -> int | None:
        return choice.gpus[rank].index if choice is not None and rank < len(choice.gpus) else None

    state = RankRecord(gpu_index=gpu_of(0))
    ranks: dict[int, RankRecord] = {0: state}
    config_json = json.dumps(config.to_json())
    prepared, start = (
        warm_workers.take(environment, rank_count, parent_points[REQUESTED])
        if warm_workers
        else (None, WarmStart(False, cold_reason="this command prepares no process ahead"))
    )
    child = prepared or ChildProcess(
        lambda fd: worker_command(config_json, fd, rank_count), log_path=log_path, env=environment
    )
    samples: queue.SimpleQueue[Sample] = queue.SimpleQueue()
    gpu_faults = GpuFaultLog()

    def flush() -> None:
        while not samples.empty():
            sample = samples.get()
            gpu_faults.observe(sample)
            if child.pid is not None:
                for rank_state in ranks.values():
                    rank_state.observe_sample(sample, rank_state.hello.pid if rank_state.hello else child.pid)
            pending.add_samples([sample.to_json()])
            if metrics is not None:
                metrics.observe_sample(sample)
        pending.flush()

    def handle(event: Event | Ranked | Malformed) -> None:
        if metrics is not None and not isinstance(event, Malformed):
            metrics.observe_event(event)
        rank, event = (event.rank, event.event) if isinstance(event, Ranked) else (0, event)
        rank_state = ranks.setdefault(rank, RankRecord(gpu_index=gpu_of(rank)))
        rank_state.observe(event)
        if isinstance(event, Malformed):
            return
        if rank != 0:  # the run's record is rank 0's; the others' are in the result's `ranks`
            if on_event is not None:
                on_event(Ranked(rank, event))
            return
        if isinstance(event, Hello):
            run_environment = {
                "pid": event.pid,
                "versions": event.versions,
                "device": event.device,
                "device_name": event.device_name,
                "nvml": nvml.__dict__,
                "config_received": event.config,
                "allocator_conf": event.allocator_conf,
                "gpus": [gpu.to_json() for gpu in choice.gpus] if choice else [],
                "ranks": rank_count,
            }
            pending.update(lambda history: history.set_environment(run_id, run_environment))
        elif isinstance(event, Step):
            pending.add_steps([dataclasses.asdict(event)])
        if on_event is not None:
            on_event(event)

    def pump(stop_when_idle: bool) -> None:
        """Handle events until the child has exited (or, when `stop_when_idle`, until none arrives)."""
        last_flush_s = time.monotonic()
        while True:
            if not stop_when_idle and stop_requested is not None and stop_requested.is_set():
                raise KeyboardInterrupt
            event = child.next_event(EVENT_POLL_INTERVAL_S)
            if time.monotonic() - last_flush_s >= HISTORY_FLUSH_INTERVAL_S:
                flush()
                last_flush_s = time.monotonic()
            if event is None:
                if stop_when_idle:
                    return
                continue
            if isinstance(event, ChildExited):
                state.exit_code = event.returncode
                return
            handle(event)

    parent_points["spawned"] = time.monotonic()
    if prepared is not None:
        try:
            adopt(prepared, config_json, environment, log_path)
        except OSError as error:  # it died in the meantime: start cold after all
            prepared.kill_group()
            start = WarmStart(False, cold_reason=f"the prepared process could not take the run ({error})")
            child = ChildProcess(
                lambda fd: worker_command(config_json, fd, rank_count), log_path=log_path, env=environment
            )
            prepared = None
    if prepared is None:
        child.start()
    assert child.pid is not None
    if warm_workers is not None:
        warm_workers.last_start = start
    if metrics is not None:
        metrics.run_started(config, run_id, child.pid, choice.gpus if choice is not None else ())
    if warm_workers is not None and usable_cores() >= AHEAD_MIN_CORES:
        warm_workers.prepare(environment)  # while this run trains: the machine has cores to spare
    if shared_sampler is not None:
        sampler, nvml = shared_sampler.sampler, shared_sampler.nvml
        sampler.add_listener(samples.put)
    else:
        try:  # NVML opens while the child imports torch (a tenth of a second or more, not waited for first)
            source, nvml = sampler_factory()
            sampler = Sampler(source, interval_s=SAMPLE_INTERVAL_S, on_sample=samples.put, trace_path=trace_path)
        except BaseException:
            child.kill_group()
            raise
        sampler.start()
    sampler.track(child.pid)
    if on_start is not None:
        on_start(run_id, child.pid, log_path, tuple(gpu.index for gpu in choice.gpus) if choice else ())
    try:
        pump(stop_when_idle=False)
    except KeyboardInterrupt:
        state.stopped_by_user = True
        state.exit_code = child.stop(grace_s=stop_grace_s)
        pump(stop_when_idle=True)
    finally:
        child.kill_group()
        if shared_sampler is not None:
            sampler.untrack(child.pid)
            sampler.remove_listener(samples.put)
        else:
            sampler.stop()
        flush()
    parent_points["exited"] = time.monotonic()
    if warm_workers is not None:
        warm_workers.prepare(environment)  # (the one prepared while it trained, when there is one)
    state.log_error = child.log_error
    for rank in range(rank_count):  # a rank that never said anything is still one of the run's
        ranks.setdefault(rank, RankRecord(gpu_index=gpu_of(rank)))
    result = build_result(
        run_id,
        config,
        state,
        nvml,
        log_path,
        name=name,
        ranks=ranks,
        gpus=choice,
        parent_points=parent_points,
        data_longest_row=data_longest_row,
    )
    result.start = start.to_json()
    if (faults := gpu_faults.summary()) is not None:  # NVML failed on a GPU while the run trained
        result.unavailable["gpu_readings"] = faults
    # The same training eager, or on one GPU, from the history (the compile and scaling findings); a busy history
    # only costs those findings.
    with contextlib.suppress(sqlite3.Error, HistoryError):
        earlier = [
            (row.config, row.status, row.result)
            for row in reversed(store.runs(limit=HISTORY_REFERENCE_RUNS))
            if row.id != run_id
        ]
        result.diagnosis = [
            finding.to_json() for finding in diagnose(result, **reference_rates(result.config, earlier))
        ]
    if metrics is not None:
        metrics.run_ended(result)
    result.history_error = pending.finish(lambda history: history.update_result(run_id, result, status=result.status))
    return result
