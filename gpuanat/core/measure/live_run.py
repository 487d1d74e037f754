"""The run in progress as the dashboard knows it: `LiveRun`, reduced from the runner's events and the sampler's samples.

The dashboard's paint tick hands each event (`observe_event`) and sample (`observe_sample`) of the run it launched to
its `LiveRun`, which keeps what they add up to — what each rank said (its PID, latest step and measured bands, in a
`RankEvents` per rank: the same reduction as a recorded run's and a watched one's), the throughput mean of rank 0's
latest steps, the clock offset of steps without `monotonic_s`, the bands at the peak, NVML's busy
share for the step strip — and returns what is new to draw. The app paints; nothing here knows a widget.

Plain Python: no torch, no UI. Every method runs on the thread that paints.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpuanat.core.measure.anatomy import assemble_bands
from gpuanat.core.measure.diagnose import LIVE_WINDOW_STEPS
from gpuanat.core.measure.failure import Readings, bands_readings, read_the_gpu
from gpuanat.core.measure.run_state import RankEvents
from gpuanat.core.measure.samples import GpuSample, Sample
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.protocol import Event, ModelInfo, ProbeBands, Ranked, Step

GPU_BUSY_SAMPLES_KEPT = 2400
"""NVML utilization samples a run keeps for the step strip: 10 minutes at 4 Hz."""
THROUGHPUT_WINDOW_STEPS = 10
"""The throughput chart plots the mean rate of this many steps."""


@dataclass(frozen=True)
class ObservedStep:
    """A step of rank 0, as the throughput chart places it."""

    step: Step
    t_s: float
    """When the step ended, on the sampler's clock (the other charts' time axis)."""
    samples_per_second: float | None
    """The mean rate of the last `THROUGHPUT_WINDOW_STEPS` steps; None at the first."""


@dataclass
class LiveRun:
    """What the dashboard knows about the run in progress."""

    config: RunConfig
    stop_requested: threading.Event
    run_id: int | None = None
    pid: int | None = None
    ranks: dict[int, RankEvents] = field(default_factory=dict)
    """What each rank has said (rank 0's is the run's own): the same reduction as the recorded run's and the
    watch's."""
    peak_bands: dict[str, int | None] | None = None
    """The bands at the highest device use seen so far."""
    gpu_indices: tuple[int, ...] = ()
    """NVML index of each rank's GPU (rank 0 first); empty on the CPU or without NVML."""
    clock_offset_s: float | None = None
    """For steps without `monotonic_s`: the sampler's time at the run's elapsed 0 s, from its first step."""
    timed_steps: collections.deque[Step] = field(
        default_factory=lambda: collections.deque(maxlen=LIVE_WINDOW_STEPS + 2)
    )
    """Rank 0's latest steps, for the step strip's breakdown."""
    gpu_busy: collections.deque[tuple[float, float]] = field(
        default_factory=lambda: collections.deque(maxlen=GPU_BUSY_SAMPLES_KEPT)
    )
    """(sampler time, NVML utilization %) of rank 0's GPU, the last 10 minutes at 4 Hz."""
    parent_points: dict[str, float] = field(default_factory=dict)
    """The dashboard's points of the run's start-up (`startup.WALL_PARTS`): when it was asked for ("requested") and
    its training process spawned ("spawned"), on time.monotonic(); the training process's own come as milestones."""

    @property
    def startup_points(self) -> dict[str, float]:
        """Every point of the start-up known so far: the dashboard's and rank 0's milestones."""
        return {**self.parent_points, **self.rank(0).milestones}

    def rank(self, rank: int) -> RankEvents:
        """What `rank` has said so far (nothing yet: an empty state)."""
        return self.ranks.get(rank, _NOTHING_SAID)

    @property
    def model(self) -> ModelInfo | None:
        return self.rank(0).model

    @property
    def last_step(self) -> Step | None:
        return self.rank(0).last_step

    @property
    def probe_bands(self) -> ProbeBands | None:
        return self.rank(0).probe_bands

    @property
    def rank_pids(self) -> dict[int, int]:
        """The PID of each rank that said hello."""
        return {rank: state.hello.pid for rank, state in self.ranks.items() if state.hello is not None}

    def observe_start(self, run_id: int, pid: int, gpu_indices: tuple[int, ...]) -> None:
        """The run's training process started: its ranks, steps and bands start afresh (a fit starts one run per
        trial)."""
        self.run_id, self.pid, self.gpu_indices = run_id, pid, gpu_indices
        self.ranks = {}
        self.timed_steps.clear()

    def observe_event(self, event: Event | Ranked, now_s: Callable[[], float]) -> ObservedStep | None:
        """Take one event of the run (another rank's in its `Ranked` envelope). Returns rank 0's step when the event
        is a new one; `now_s` tells the sampler's time, asked for only to place a first step without `monotonic_s`."""
        rank, rank_event = (event.rank, event.event) if isinstance(event, Ranked) else (0, event)
        state = self.ranks.setdefault(rank, RankEvents())
        step = state.observe(rank_event)
        if rank != 0 or step is None:
            return None
        self.timed_steps.append(step)
        # The mean rate of the last steps, as the steady rate is a mean: a single step's rate jumps with the
        # loss logging and the DataLoader, and would read against the "steady" figure the run ends with.
        window = list(itertools.islice(reversed(state.recent_steps), THROUGHPUT_WINDOW_STEPS + 1))
        first_elapsed_s, first_samples = window[-1]
        if step.monotonic_s is not None:  # the worker's time.monotonic(): the sampler's clock (Linux)
            t_s = step.monotonic_s
        else:  # a step without it (older recordings): placed by the latest sample when the first step came
            if self.clock_offset_s is None:
                self.clock_offset_s = now_s() - step.elapsed_s
            t_s = self.clock_offset_s + step.elapsed_s
        rate = (
            (step.samples - first_samples) / (step.elapsed_s - first_elapsed_s)
            if step.elapsed_s > first_elapsed_s
            else None
        )
        return ObservedStep(step, t_s, rate)

    def observe_sample(self, sample: Sample, gpu: GpuSample | None) -> int | None:
        """Take one sample, `gpu` being its reading of the GPU the dashboard shows (rank 0's). Returns the GPU memory
        the run's processes use there (None: not known)."""
        if gpu is None:
            return None
        if gpu.gpu_util_percent is not None:
            self.gpu_busy.append((sample.t_s, gpu.gpu_util_percent))
        if self.pid is None:
            return None
        pids = [self.pid, *self.rank_pids.values()]  # the run's processes on the GPU shown
        return dataclasses.replace(sample, gpus=(gpu,)).process_used_bytes(pids)

    def rank_bands(
        self, rank: int, sample: Sample | None, gpu_index: int | None
    ) -> tuple[GpuSample | None, dict[str, Any], dict[str, str]]:
        """One rank's bands now, of one moment (the end of forward: only accumulated gradients alive), from its
        own events and NVML's reading of its GPU and its PID; with why a band is missing."""
        gpu = gpu_of(sample, gpu_index)
        state = self.rank(rank)
        probe, step = state.probe_bands, state.last_step
        pid = self.rank_pids.get(rank, self.pid if rank == 0 else None)
        failed = state.failure_shown
        # after an out-of-memory failure the bands are the failing allocation's, and so are the readings beside them:
        # its probe read the GPU then
        read_gpu = gpu is not None or read_the_gpu(failed)
        no_gpu = None if read_gpu and self.config.device == "cuda" else "CPU run: no GPU memory"
        readings = bands_readings(
            Readings(
                reserved_bytes=step.reserved_bytes if step else None,
                device_used_bytes=gpu.used_bytes if gpu else None,
                process_used_bytes=(
                    dataclasses.replace(sample, gpus=(gpu,)).process_used_bytes([pid])
                    if sample is not None and gpu is not None and pid
                    else None
                ),
                device_total_bytes=gpu.total_bytes if gpu else None,
            ),
            failed,
        )
        bands = assemble_bands(
            probe,
            reserved_bytes=readings.reserved_bytes,
            device_used_bytes=readings.device_used_bytes,
            device_total_bytes=readings.device_total_bytes,
            process_used_bytes=readings.process_used_bytes,
            no_gpu_reason=no_gpu,
        )
        return gpu, bands.values(), bands.unavailable

    def observe_peak(self, bands: dict[str, Any], device_used_bytes: int | None) -> None:
        """Keep rank 0's `bands` as the peak's when the device uses as much memory as it ever did in this run."""
        if device_used_bytes is not None and (
            self.peak_bands is None or device_used_bytes >= (self.peak_bands.get("device_used_bytes") or 0)
        ):
            self.peak_bands = {**bands, "device_used_bytes": device_used_bytes}


def gpu_of(sample: Sample | None, index: int | None) -> GpuSample | None:
    """GPU `index` of `sample` (None: the first NVML lists)."""
    if sample is None or not sample.gpus:
        return None
    return next((gpu for gpu in sample.gpus if index is None or gpu.index == index), None)


def trainable_weights_bytes(params: int | None, trainable_params: int | None) -> int | None:
    """The bytes of the weights that train where the rest is frozen: LoRA's and QLoRA's adapters, which PEFT keeps
    in fp32; None for full fine-tuning (all of them train) or without counts."""
    if not params or trainable_params is None or trainable_params >= params:
        return None
    return 4 * trainable_params


_NOTHING_SAID = RankEvents()
"""Read, never written: what a rank that has said nothing yet has said."""
