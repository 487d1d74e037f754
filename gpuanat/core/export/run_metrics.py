"""The metrics of the runs a command starts (`run`, `sweep`, `tune`, `fit`, the dashboard): `RunMetrics`.

`execute_run` feeds it on its own thread — the run's start, every event, every sample, the result — and the metrics
server reads it at each scrape from its thread; a lock keeps the two apart. While a run trains, each rank's bands are
those of one moment, assembled as the dashboard's bar is (`LiveRun.rank_bands`); once it has ended, the result's own
(the same numbers as `gpuanat run --json`), until the next run starts. Plain Python: no torch, no UI.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence

from gpuanat.core.export.metrics import RankSnapshot, tokens_per_second
from gpuanat.core.measure.anatomy import gradients_after_backward_bytes
from gpuanat.core.measure.diagnose import recent_breakdown
from gpuanat.core.measure.flops import utilization
from gpuanat.core.measure.gpm import throttle_names
from gpuanat.core.measure.gpus import Gpu
from gpuanat.core.measure.live_run import LiveRun, gpu_of
from gpuanat.core.measure.observed_run import THROUGHPUT_WINDOW_S
from gpuanat.core.measure.samples import Sample
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.protocol import Event, Ranked
from gpuanat.core.vocabulary.result import RunResult


class RunMetrics:
    """The latest run of a command, as `RankSnapshot`s."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: LiveRun | None = None
        self._gpus: tuple[Gpu, ...] = ()
        self._sample: Sample | None = None
        self._result: RunResult | None = None
        self._predicted: dict[str, int | None] = {}
        """Predicted peak device bytes by configuration (computed once, at the first scrape that needs it)."""

    def run_started(self, config: RunConfig, run_id: int, pid: int, gpus: Sequence[Gpu]) -> None:
        live = LiveRun(config=config, stop_requested=threading.Event())
        live.observe_start(run_id, pid, tuple(gpu.index for gpu in gpus))
        with self._lock:
            self._live, self._gpus, self._result = live, tuple(gpus), None

    def observe_event(self, event: Event | Ranked) -> None:
        with self._lock:
            if self._live is not None:
                self._live.observe_event(event, time.monotonic)

    def observe_sample(self, sample: Sample) -> None:
        with self._lock:
            self._sample = sample
            if self._live is not None:
                index = self._live.gpu_indices[0] if self._live.gpu_indices else None
                self._live.observe_sample(sample, gpu_of(sample, index))

    def run_ended(self, result: RunResult) -> None:
        with self._lock:
            self._result = dataclasses.replace(result)

    def snapshots(self) -> list[RankSnapshot]:
        with self._lock:
            live, result, sample, gpus = self._live, self._result, self._sample, self._gpus
            if live is None:
                return []
            ranks = sorted(set(live.ranks) | {0})
            snapshots = [self._snapshot(live, rank, sample, gpus, result) for rank in ranks]
        # Outside the lock: the first prediction of a configuration takes a while, and the run's thread feeds the
        # live state under it.
        predicted = self._predicted_peak(live.config) if live.config.device == "cuda" else None
        return [dataclasses.replace(snapshot, predicted_peak_bytes=predicted) for snapshot in snapshots]

    def _predicted_peak(self, config: RunConfig) -> int | None:
        """Predicted peak device bytes of `config`, computed once (only the scrape thread asks)."""
        from gpuanat.core.memory.predict import prediction

        key = repr(config.to_json())
        if key not in self._predicted:
            try:
                predicted = prediction(config)
            except Exception:  # a model the prediction cannot describe: no series
                predicted = None
            self._predicted[key] = predicted.peak_device_bytes if predicted else None
        return self._predicted[key]

    def _snapshot(
        self, live: LiveRun, rank: int, sample: Sample | None, gpus: tuple[Gpu, ...], result: RunResult | None
    ) -> RankSnapshot:
        config, state = live.config, live.rank(rank)
        gpu_index = live.gpu_indices[rank] if rank < len(live.gpu_indices) else None
        gpu_listed = next((gpu for gpu in gpus if gpu.index == gpu_index), None)
        gpu, bands, _ = live.rank_bands(rank, sample, gpu_index)
        step = state.last_step
        rate = state.samples_per_second(THROUGHPUT_WINDOW_S)
        status, used = "training", gpu.used_bytes if gpu else None
        joules_per_sample = None
        gradients = gradients_after_backward_bytes(state.probe_bands)
        if result is not None:  # ended: the result's own numbers
            entry = next((entry for entry in result.ranks if entry.rank == rank), None)
            status = (entry.status if entry else None) or result.status or status
            if entry is not None:
                bands, used = entry.bands.values() if entry.bands else {}, entry.device_memory_used_bytes
                gradients = entry.gradients_after_backward_bytes
                rate = entry.steady_samples_per_second or rate
            joules_per_sample = result.joules_per_sample if rank == 0 else None  # rank 0's GPU's, at the steady rate
        phases = {}
        if rank == 0:
            breakdown = recent_breakdown(live.timed_steps, live.gpu_busy)
            phases = dict(breakdown["per_step_s"]) if breakdown else {}
        elif step is not None and step.phases_s:
            phases = dict(step.phases_s)
        gpu_name = gpu.name if gpu else (gpu_listed.name if gpu_listed else None)
        flops = utilization(config, rate, gpu_name, 1, model=state.model)
        return RankSnapshot(
            rank=rank,
            run_id=str(live.run_id or ""),
            status=status,
            gpu_index=gpu_index,
            gpu_uuid=gpu_listed.uuid if gpu_listed else None,
            gpu_name=gpu_name,
            bands=bands,
            gradients_after_backward_bytes=gradients,
            device_used_bytes=used,
            device_total_bytes=gpu.total_bytes if gpu else None,
            gpu_util_percent=gpu.gpu_util_percent if gpu else None,
            sm_active_percent=gpu.sm_active_percent if gpu else None,
            tensor_active_percent=gpu.tensor_active_percent if gpu else None,
            dram_bandwidth_percent=gpu.dram_bandwidth_percent if gpu else None,
            power_w=gpu.power_w if gpu else None,
            energy_joules=gpu.energy_mj / 1000.0 if gpu and gpu.energy_mj is not None else None,
            sm_clock_mhz=gpu.sm_clock_mhz if gpu else None,
            throttle_reasons=(
                tuple(throttle_names(gpu.clocks_event_reasons))
                if gpu and gpu.clocks_event_reasons is not None
                else None
            ),
            joules_per_sample=joules_per_sample,
            step=step.step if step else None,
            total_steps=state.model.total_steps if state.model else None,
            samples_per_second=rate,
            tokens_per_second=tokens_per_second(rate, step),
            achieved_tflops=flops.achieved_tflops,
            mfu=flops.mfu,
            step_phase_seconds=phases,
            loss=state.loss.loss,
            learning_rate=state.loss.learning_rate,
            grad_norm=state.loss.grad_norm,
            model=config.model or config.preset,
            techniques=config.techniques_summary(),
        )
