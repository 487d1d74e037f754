"""A recorded run's result: its ranks' states at the end, turned into the JSON contract of `gpuanat run --json`.

While a run goes on, `session.execute_run` hands each rank's events and samples to its `RankRecord`; when the run
has ended, `build_result` reads them: the run's status (rank 0's, unless another rank failed), its memory and bands
(rank 0's), samples and steady samples/s (every rank's summed), the error that best explains its end, the step
time's breakdown and the diagnosis, where the wall time went, and the prediction beside the measurement.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuanat.core.measure.activity import steady_activity
from gpuanat.core.measure.anatomy import assemble_bands, gradients_after_backward_bytes
from gpuanat.core.measure.data_rates import data_rates
from gpuanat.core.measure.diagnose import diagnose, step_time_breakdown
from gpuanat.core.measure.failure import Readings, bands_readings, modules_json, out_of_memory_json
from gpuanat.core.measure.flops import utilization
from gpuanat.core.measure.gpus import GpuChoice
from gpuanat.core.measure.run_state import RankEvents, rank_status
from gpuanat.core.measure.samples import GpuSample, NvmlStatus, Sample
from gpuanat.core.measure.startup import time_to_first_step_s, wall_breakdown
from gpuanat.core.memory.data_length import data_prediction
from gpuanat.core.operations.anatomy import operations_anatomy
from gpuanat.core.percent import percent_delta
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.protocol import Done, Error, Event, Malformed, Step
from gpuanat.core.vocabulary.result import (
    EXITED_ERROR_KEYS,
    RANK_ERROR_KEYS,
    Bands,
    RankResult,
    RunError,
    RunResult,
)

LOG_TAIL_LINES = 20
"""Lines of the training process's log a failed run's error quotes."""
_ERROR_ARRIVALS = itertools.count()


@dataclass
class RankRecord(RankEvents):
    """One rank of a recorded run (rank 0's is the run's own): what its events said (`RankEvents`), what the
    samples said of its GPU, and how its process ended."""

    peak_device_used_bytes: int | None = None
    peak_process_used_bytes: int | None = None
    device_total_bytes: int | None = None
    gpu_name: str | None = None
    exit_code: int | None = None
    stopped_by_user: bool = False
    log_error: str | None = None
    gpu_index: int | None = None
    """NVML index of the GPU this rank trains on; None when unknown (no NVML): the first GPU NVML lists."""
    error_order: int | None = None
    """When its error came, among every rank's: of two errors of one kind, the earlier is the cause."""
    gpu_readings: list[tuple[float, GpuSample]] = field(default_factory=list)
    """(sampler time, this rank's GPU without its process lists), every sample: its utilization, activity, energy."""

    @property
    def gpu_busy(self) -> list[tuple[float, float]]:
        """(sampler time, NVML utilization %) of this rank's GPU, every sample that read it."""
        return [(t_s, gpu.gpu_util_percent) for t_s, gpu in self.gpu_readings if gpu.gpu_util_percent is not None]

    def observe(self, event: Event | Malformed) -> Step | None:
        if isinstance(event, Error):
            self.error_order = next(_ERROR_ARRIVALS)
        return super().observe(event)

    def observe_sample(self, sample: Sample, pid: int) -> None:
        gpus = [gpu for gpu in sample.gpus if self.gpu_index is None or gpu.index == self.gpu_index]
        if not gpus:
            return
        gpu = gpus[0]
        self.gpu_name = gpu.name
        self.gpu_readings.append((sample.t_s, dataclasses.replace(gpu, processes=(), process_utilization=None)))
        self.device_total_bytes = gpu.total_bytes
        if gpu.used_bytes is not None:
            self.peak_device_used_bytes = max(self.peak_device_used_bytes or 0, gpu.used_bytes)
        process_used = dataclasses.replace(sample, gpus=(gpu,)).process_used_bytes([pid])
        if process_used is not None:
            self.peak_process_used_bytes = max(self.peak_process_used_bytes or 0, process_used)


def _status(state: RankRecord, ranks: Mapping[int, RankRecord] | None = None) -> str:
    """The run's status: rank 0's, unless another rank ran out of memory or failed — a rank killed mid-run fails
    the run, though the ranks torchrun then stopped say "stopped"."""
    others = [rank_state for rank, rank_state in (ranks or {}).items() if rank != 0]
    errors = [rank_state.error for rank_state in (state, *others) if rank_state.error is not None]
    if any(error.kind == "oom" for error in errors):
        return "oom"
    if state.stopped_by_user:
        return "stopped"
    if errors or any(rank_status(rank_state) == "failed" for rank_state in others):
        return "failed"
    if state.done is not None and state.done.status == "stopped":
        return "stopped"
    if state.done is not None and state.done.status == "ok" and state.exit_code == 0:
        return "ok"
    return "failed"


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = log_path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.replace("\r", "\n").splitlines()[-lines:])


def probe_cost_percent(done: Done | None) -> float | None:
    """The probe's own work in the training steps as a share of the training time without the probe (HF's
    train_runtime includes it). Not counted: its once-per-run setup, and the waits of its two CUDA
    synchronisations, which are the GPU's queued work finishing."""
    if done is None or done.probe_time_s is None or not done.train_runtime_s:
        return None
    parts = done.probe_time_by_part_s
    in_steps_s = parts["measured steps"] + parts["other steps"] if parts else done.probe_time_s
    without_probe_s = done.train_runtime_s - done.probe_time_s
    return 100.0 * in_steps_s / without_probe_s if without_probe_s > 0 else None


@dataclass
class _Memory:
    """One rank's memory: peaks, NVML readings of its GPU and its bands, with why any is missing."""

    peak_allocated_bytes: int | None
    peak_reserved_bytes: int | None
    device_memory_used_bytes: int | None
    process_memory_used_bytes: int | None
    device_memory_total_bytes: int | None
    bands: Bands
    unavailable: dict[str, str]


def _memory(config: RunConfig, state: RankRecord, nvml: NvmlStatus) -> _Memory:
    """One rank's memory: peaks, NVML readings of its GPU and its bands, with why any is missing."""
    done, error = state.done, state.error
    unavailable: dict[str, str] = {}
    no_gpu_reason = None
    if config.device != "cuda":
        no_gpu_reason = "CPU run: it uses no GPU memory"
    elif not nvml.available:
        no_gpu_reason = f"NVML unavailable: {nvml.reason}"
    peak_allocated = (done.peak_allocated_bytes if done else None) or (error.peak_allocated_bytes if error else None)
    peak_reserved = (done.peak_reserved_bytes if done else None) or (error.reserved_bytes if error else None)
    readings = bands_readings(
        Readings(peak_reserved, state.peak_device_used_bytes, state.peak_process_used_bytes, state.device_total_bytes),
        error,
    )
    device_used, process_used, device_total = (
        readings.device_used_bytes,
        readings.process_used_bytes,
        readings.device_total_bytes,
    )
    if config.device != "cuda":
        unavailable["peak_allocated_bytes"] = "CPU run: torch's CUDA allocator is not used"
    device_used = device_used if no_gpu_reason is None else None
    if no_gpu_reason is not None:
        unavailable["device_memory_used_bytes"] = no_gpu_reason
    elif device_used is None:
        unavailable["device_memory_used_bytes"] = "NVML gave no reading during the run"
    bands = assemble_bands(
        state.probe_bands,
        reserved_bytes=readings.reserved_bytes,
        device_used_bytes=device_used,
        device_total_bytes=device_total,
        process_used_bytes=process_used,
        no_gpu_reason=no_gpu_reason,
    )
    return _Memory(
        peak_allocated_bytes=peak_allocated,
        peak_reserved_bytes=peak_reserved,
        device_memory_used_bytes=device_used,
        process_memory_used_bytes=process_used if no_gpu_reason is None else None,
        device_memory_total_bytes=device_total if no_gpu_reason is None else None,
        bands=Bands.from_json(bands.values()),
        unavailable={**unavailable, **bands.unavailable},
    )


def _rank_result(rank: int, config: RunConfig, state: RankRecord, nvml: NvmlStatus, run_stopped: bool) -> RankResult:
    """One entry of the result's `ranks`; `run_stopped`: the user stopped the run (rank 0's record says so)."""
    done, last_step = state.done, state.last_step
    memory = _memory(config, state, nvml)
    return RankResult(
        rank=rank,
        pid=state.hello.pid if state.hello else None,
        gpu_index=state.gpu_index,
        status=rank_status(state, run_stopped),
        samples=done.samples if done else (last_step.samples if last_step else 0),
        steady_samples_per_second=done.steady_samples_per_second if done else None,
        gradients_after_backward_bytes=gradients_after_backward_bytes(state.probe_bands),
        error=(
            RunError(
                kind=state.error.kind, message=state.error.message, step=state.error.step, json_keys=RANK_ERROR_KEYS
            )
            if state.error
            else None
        ),
        peak_allocated_bytes=memory.peak_allocated_bytes,
        peak_reserved_bytes=memory.peak_reserved_bytes,
        device_memory_used_bytes=memory.device_memory_used_bytes,
        process_memory_used_bytes=memory.process_memory_used_bytes,
        device_memory_total_bytes=memory.device_memory_total_bytes,
        bands=memory.bands,
        unavailable=memory.unavailable,
    )


ERROR_CAUSE_ORDER = ("oom", "exited", "config", "exception")
"""Which rank's error the run reports: running out of memory, then a rank that died without a word (killed), whose
death made the others fail in their collectives; then the lowest rank's."""


def first_cause(states: list[RankRecord]) -> Error | None:
    """The error that best explains a run's end, of its ranks' errors: by kind (ERROR_CAUSE_ORDER), then the one
    that came first (of two ranks that ended without a word, the launcher reports the first to end first)."""
    present = [state for state in states if state.error is not None]
    ranked = sorted(
        present,
        key=lambda state: (
            ERROR_CAUSE_ORDER.index(state.error.kind)
            if state.error and state.error.kind in ERROR_CAUSE_ORDER
            else len(ERROR_CAUSE_ORDER),
            state.error_order or 0,
        ),
    )
    return ranked[0].error if ranked else None


def _sum_or_none(values: list[float | None]) -> float | None:
    return None if not values or any(value is None for value in values) else sum(v for v in values if v is not None)


def build_result(
    run_id: int,
    config: RunConfig,
    state: RankRecord,
    nvml: NvmlStatus,
    log_path: Path,
    name: str | None = None,
    ranks: Mapping[int, RankRecord] | None = None,
    gpus: GpuChoice | None = None,
    parent_points: Mapping[str, float] | None = None,
    data_longest_row: int | None = None,
) -> RunResult:
    """The run's result, the JSON contract of `gpuanat run --json`. The top level is rank 0's (its memory, its
    bands); samples and steady samples/s are the whole run's (every rank's summed); `ranks` has one entry per rank.
    Its prediction is at the length of --data's longest batch where `data_longest_row` (tokens) is given, as
    `gpuanat predict`'s (`memory.data_length`)."""
    ranks = {0: state, **(ranks or {})}
    done = state.done
    status = _status(state, ranks)
    memory = _memory(config, state, nvml)
    unavailable = dict(memory.unavailable)
    steady_reason = done.steady_reason if done else f"run ended with status {status}"
    rank_results = [_rank_result(rank, config, ranks[rank], nvml, state.stopped_by_user) for rank in sorted(ranks)]
    steady = _sum_or_none([entry.steady_samples_per_second for entry in rank_results])
    if steady is None:
        unavailable["steady_samples_per_second"] = steady_reason or "not measured on every rank"
    last_step = state.last_step
    gpu_count = len(gpus.gpus) if gpus is not None and gpus.gpus else (config.ranks or 1)
    data = data_rates(config, done, steady)
    per_sample = data.tokens_per_sample
    # a --data sample is as long as its batch's positions, not --seq-len: FLOPs and energy a token at that length
    sized = config.replace(seq_len=max(1, round(per_sample))) if config.data is not None else config
    speed = utilization(
        sized,
        steady,
        state.gpu_name,
        gpu_count,
        model=state.model,
        no_rate_reason=f"no steady samples/s: {unavailable.get('steady_samples_per_second')}",
    )
    if speed.mfu is None:
        unavailable["mfu"] = speed.reason or "not measured"
    if speed.achieved_tflops is None:
        unavailable["achieved_tflops"] = speed.reason or "not measured"
    predicted = data_prediction(
        config.replace(gpus=str(len(gpus.gpus))) if gpus is not None and config.ranks is None else config,
        data_longest_row,
    )
    result = RunResult(
        run_id=run_id,
        name=name,
        status=status,
        config=config.to_json(),
        params=state.model.params if state.model else None,
        trainable_params=state.model.trainable_params if state.model else None,
        train_runtime_s=done.train_runtime_s if done else None,
        samples_per_second=done.samples_per_second if done else None,
        steady_samples_per_second=steady,
        # every sample is seq-len tokens of the random dataset (of --data: its batches' positions, padding included)
        tokens_per_second=done.samples_per_second * per_sample if done and done.samples_per_second else None,
        steady_tokens_per_second=steady * per_sample if steady is not None else None,
        # model FLOPs (6 × matmul weights + attention a token) at the steady rate, against the GPUs' dense peak
        flops_per_sample=speed.flops_per_sample,
        achieved_tflops=speed.achieved_tflops,
        peak_tflops=speed.peak_tflops,
        mfu=speed.mfu,
        logits_bytes=state.probe_bands.logits_bytes if state.probe_bands else None,
        warmup_steps=done.warmup_steps if done else None,
        steps=done.steps if done else (last_step.step if last_step else 0),
        samples=sum(entry.samples or 0 for entry in rank_results),
        train_loss=done.train_loss if done else None,
        probe_time_s=done.probe_time_s if done else None,
        probe_time_by_part_s=done.probe_time_by_part_s if done else None,
        probe_cost_percent=probe_cost_percent(done),
        peak_allocated_bytes=memory.peak_allocated_bytes,
        peak_reserved_bytes=memory.peak_reserved_bytes,
        device_memory_used_bytes=memory.device_memory_used_bytes,
        process_memory_used_bytes=memory.process_memory_used_bytes,
        device_memory_total_bytes=memory.device_memory_total_bytes,
        bands=memory.bands,
        device=config.device,
        device_name=state.hello.device_name if state.hello else None,
        gpu_name=state.gpu_name,
        gpus=[gpu.to_json() for gpu in gpus.gpus] if gpus is not None else [],
        versions=state.hello.versions if state.hello else {},
        gradients_after_backward_bytes=gradients_after_backward_bytes(state.probe_bands),
        unavailable=unavailable,
        error=_run_error(state, ranks, status, log_path),
        exit_code=state.exit_code,
        log_error=state.log_error,
        log_path=str(log_path),
        malformed_events=sum(len(rank_state.malformed) for rank_state in ranks.values()),
        ranks=rank_results,
        predicted=predicted,
        prediction_error_percent=(
            percent_delta(predicted.peak_allocated_bytes, memory.peak_allocated_bytes)
            if predicted is not None
            else None
        ),
        # where each steady step's time went, and what to change
        step_time_breakdown=step_time_breakdown(
            done.steady_phases_s if done else None,
            done.steady_steps if done else None,
            done.steady_gpu_caught_up_steps if done else None,
            state.step_ends_s,
            state.gpu_busy,
            done.warmup_steps if done else None,
        ),
        compile_stats=done.compile_stats if done else None,
        operations_anatomy=operations_anatomy(state.operations) if state.operations is not None else None,
    )
    result.modules = modules_json(state.probe_bands)
    ends = state.step_ends_s
    start_s = ends.get(done.warmup_steps or 0) if done and ends else None
    activity = steady_activity(
        state.gpu_readings,
        (start_s, max(ends.values())) if start_s is not None else None,
        steady,
        sized.seq_len,
        no_gpu_reason="CPU run: no GPU" if config.device != "cuda" else None if nvml.available else nvml.reason,
    )
    activity.fill(result)
    losses, no_loss = state.loss.result_values()
    for name, value in losses.items():
        setattr(result, name, value)
    result.unavailable |= no_loss
    for name, value in data.values.items():
        setattr(result, name, value)
    result.unavailable |= data.unavailable
    cause = first_cause([ranks[rank] for rank in sorted(ranks)])
    result.out_of_memory = out_of_memory_json(cause, next((r for r in ranks if ranks[r].error is cause), 0))
    result.diagnosis = [finding.to_json() for finding in diagnose(result)]
    # where the wall time went: rank 0's training process's points and the parent's
    points = {**state.milestones, **(parent_points or {}), "recorded": time.monotonic()}
    result.wall_breakdown_s = wall_breakdown(points)
    result.time_to_first_step_s = time_to_first_step_s(points)
    return result


def _run_error(state: RankRecord, ranks: Mapping[int, RankRecord], status: str, log_path: Path) -> RunError | None:
    """The error that best explains the run's end (`first_cause`), named by its rank; a training process that exited
    without finishing and without a word; None when the run did not fail."""
    rank_error = first_cause([ranks[rank] for rank in sorted(ranks)])
    if rank_error is not None:
        failed_rank = next(rank for rank in sorted(ranks) if ranks[rank].error is rank_error)
        prefix = f"rank {failed_rank}: " if failed_rank and not rank_error.message.startswith("rank ") else ""
        return RunError(
            kind=rank_error.kind, message=prefix + rank_error.message, step=rank_error.step, flag=rank_error.flag
        )
    if status == "failed":
        last_step = state.last_step
        return RunError(
            kind="exception",
            flag=None,
            step=last_step.step + 1 if last_step else None,
            message=f"the training process exited with code {state.exit_code} "
            f"without finishing; last lines of its log:\n{log_tail(log_path)}",
            json_keys=EXITED_ERROR_KEYS,
        )
    return None
