"""What a search found: its trials (real runs), the candidates it refused without running, and the Pareto front
of speed against memory.

A move is kept only when it `beats` the best by more than the noise. The front's memory comes from the first of
`MEMORY_SOURCES` that every ok trial has, so all trials are compared on one measure.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import RunResult

NOISE_FRACTION = 0.02
"""A move is kept only if it is this much faster than the best so far: back-to-back runs of one configuration
differ by about 1% (docs/cost.md)."""
MEMORY_SOURCES = (
    ("process_memory_used_bytes", "NVML: the training process's GPU memory"),
    ("peak_reserved_bytes", "torch: peak reserved by the caching allocator"),
    ("device_memory_used_bytes", "NVML: the GPU's used memory"),
    ("predicted_peak_allocated_bytes", "predicted peak allocated memory (the run measured none: CPU)"),
    ("unmeasured", "none: neither measured nor predicted (a --model on the CPU)"),
)
"""Where the front's memory comes from, in order of preference: the first that every ok trial has."""

T = TypeVar("T")


@dataclass(frozen=True)
class Pruned:
    """A candidate refused without running."""

    config: RunConfig
    dimension: str
    reason: str
    predicted_peak_device_bytes: int | None


@dataclass(frozen=True)
class TuneTrial:
    """One real run of the search."""

    index: int
    name: str
    dimension: str
    """The move it tried ("start" for the first trial, or one of DIMENSIONS)."""
    config: RunConfig
    """The configuration searched (the workload's own samples and epochs; the run trained `trial_steps` steps)."""
    result: RunResult
    """The run's result, as `gpuanat run --json` gives it."""
    wall_s: float
    """The trial's wall time, start-up included: what the budget pays."""

    @property
    def status(self) -> str:
        return str(self.result.status)

    @property
    def run_id(self) -> int | None:
        return self.result.run_id

    @property
    def samples_per_second(self) -> float | None:
        """The steady rate (warm-up excluded); the whole run's where the run had no steady window."""
        steady = self.result.steady_samples_per_second
        return steady if steady is not None else self.result.samples_per_second

    @property
    def joules_per_sample(self) -> float | None:
        """Energy a sample at the steady rate (NVML's energy counter: a GPU run's)."""
        return self.result.joules_per_sample

    def rate(self, objective: str) -> float | None:
        """What the search maximizes: samples/s ("throughput"), or samples a joule ("energy")."""
        if objective == "energy":
            joules = self.joules_per_sample
            return 1.0 / joules if joules else None
        return self.samples_per_second

    @property
    def rate_source(self) -> str:
        return "steady" if self.result.steady_samples_per_second is not None else "whole run"

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.samples_per_second is not None

    def memory_bytes(self, source: str) -> int | None:
        if source == "unmeasured":
            return None
        if source == "predicted_peak_allocated_bytes":
            return self.result.predicted.peak_allocated_bytes if self.result.predicted is not None else None
        value = getattr(self.result, source)  # the measured sources are the result's fields of their names
        return int(value) if value is not None else None


@dataclass
class TuneResult:
    trials: list[TuneTrial] = field(default_factory=list)
    pruned: list[Pruned] = field(default_factory=list)
    kept: list[int] = field(default_factory=list)
    """Indices of the trials the search moved to, in order (the start first)."""
    stop_reason: str = "converged"
    """converged (no move helped), budget, interrupted, failed (a trial failed for a reason other than memory
    where the search could not go on), nothing fits (the prediction refuses every start)."""
    elapsed_s: float = 0.0
    objective: str = "throughput"
    """What a move had to improve (`TuneTrial.rate`): "throughput" or "energy"."""

    @property
    def ok_trials(self) -> list[TuneTrial]:
        return [trial for trial in self.trials if trial.ok]

    @property
    def memory_source(self) -> str | None:
        return memory_source(self.ok_trials)

    @property
    def front(self) -> list[TuneTrial]:
        source = self.memory_source
        if source is None:
            return []
        points = [(trial.samples_per_second or 0.0, trial.memory_bytes(source) or 0, trial) for trial in self.ok_trials]
        return pareto_front(points)

    @property
    def best(self) -> TuneTrial | None:
        """The fastest ok trial (of equal speeds, the one using less memory): on the front by construction; with the
        energy objective, the one that used the least energy a sample."""
        source = self.memory_source
        ok = [trial for trial in self.ok_trials if trial.rate(self.objective) is not None]
        if not ok or source is None:
            return None
        return max(ok, key=lambda trial: (trial.rate(self.objective) or 0.0, -(trial.memory_bytes(source) or 0)))


def memory_source(trials: Sequence[TuneTrial]) -> str | None:
    """The first of MEMORY_SOURCES that every trial has a value for."""
    for source, _ in MEMORY_SOURCES:
        if source == "unmeasured" or all(trial.memory_bytes(source) is not None for trial in trials):
            return source if trials else None
    return None


def pareto_front(points: Iterable[tuple[float, int, T]]) -> list[T]:
    """The items no other beats on both counts: (throughput, memory, item), higher throughput and lower memory
    better; ordered by memory, least first. Of identical points the first is kept."""
    ordered = sorted(points, key=lambda point: (point[1], -point[0]))
    front: list[T] = []
    fastest = -math.inf
    for throughput, _, item in ordered:
        if throughput > fastest:
            front.append(item)
            fastest = throughput
    return front


def beats(candidate_rate: float, best_rate: float, noise: float = NOISE_FRACTION) -> bool:
    """Whether a move is worth keeping: faster than the best by more than the noise."""
    return candidate_rate > best_rate * (1.0 + noise)
