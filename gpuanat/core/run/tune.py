"""The fastest training that fits: a greedy search over the techniques, with short real runs.

`gpuanat tune` holds the workload (preset or model, sequence length, LoRA, GPUs) and every technique the user gave a
flag for, and searches the rest, one technique at a time ("dimensions": batch, precision, tf32, attention,
optimizer, checkpointing, DataLoader workers, expandable segments, Liger, torch.compile):

1. A strong start: 16-bit mixed precision (bf16 where the GPU has compute capability ≥ 8, else fp16), tf32, SDPA
   attention, fused AdamW, no checkpointing, at the largest power-of-two batch the memory prediction says fits.
2. Greedy coordinate moves: from the best so far, each dimension's other values are tried; the fastest of them is
   kept only if its samples/s beat the best's by more than `NOISE_FRACTION`. Rounds repeat until no move helps,
   the budget would be exceeded, or the user stops it.

Every candidate is checked against the memory prediction before it runs (`gpuanat.core.memory`): one predicted not
to fit the GPU's memory less `MEMORY_MARGIN_FRACTION` is refused without running (a move that changes the memory,
say fp32 in place of bf16, first steps its batch down the ladder to the largest that fits). Each trial is a real run
of `trial_steps` optimizer steps recorded in the history like any other run ("tune 3: bs64 bf16 tf32"); its speed is
the run's steady samples/s (after the probe's warm-up steps). A trial that runs out of memory or fails is recorded
as such and marks its direction dead: the same value of that technique is not tried again, and after an OOM no
batch at least as large with the same memory-relevant techniques.

No torch here: the runs happen in child processes (`execute_run`); tests inject `run_trial` and the clock.
"""

from __future__ import annotations

import math
import shlex
import threading
import time
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, TypeVar

from gpuanat.core.memory.allocation_templates import largest_batch
from gpuanat.core.memory.predict import prediction_json
from gpuanat.core.run.config import Capabilities, RunConfig
from gpuanat.core.run.presets import PRESETS
from gpuanat.core.run.session import execute_run
from gpuanat.core.run.techniques import TECHNIQUES, compile_mode, with_compile_mode
from gpuanat.core.store.history import HistoryStore

DIMENSION_FIELDS: dict[str, tuple[str, ...]] = {
    "batch": ("batch_size", "grad_accum"),
    "precision": ("precision",),
    "tf32": ("tf32",),
    "attn": ("attn",),
    "optim": ("optim",),
    "grad-checkpointing": ("grad_checkpointing",),
    "workers": ("workers",),
    "expandable-segments": ("expandable_segments",),
    "liger": ("liger",),
    "engine": ("engine",),
    "compile": ("compile_regions", "compile"),
}
"""The dimensions searched, in the order of the moves, and the RunConfig fields each one sets. torch.compile comes
last: its trials are the longest (compilation). Its values: eager, the regions outside attention compiled (faster
than eager on the H100), the whole model compiled (slower there, with 1.7× the memory)."""
DIMENSIONS = tuple(DIMENSION_FIELDS)
FIRST_MOVES_FOR: dict[str, tuple[str, ...]] = {
    "gpu-bound": ("compile", "engine", "liger"),
    "host-bound": ("batch", "engine", "compile"),
    "input-bound": ("workers",),
    "memory-bound": ("grad-checkpointing", "optim", "expandable-segments"),
}
"""The moves a round tries first, by the kept run's main bottleneck (`diagnose`): what its fix names. A GPU-bound
run gains from less GPU work a sample (fused kernels) and from a loop that leaves the GPU no gap: HF Trainer
synchronises once a step, the Accelerate loop does not (bert-large bf16 batch 128 on the H100: 310 → 324 samples/s
eager, 335 → 354 with compiled regions; benchmarks/results/h100/compile_speed/). The default order reaches both last:
an 8.6-minute search there kept compiled regions, then ran out of budget before the engine
(benchmarks/results/h100/tune3/)."""
NOISE_FRACTION = 0.02
"""A move is kept only if it is this much faster than the best so far: back-to-back runs of one configuration
differ by about 1% (docs/cost.md)."""
MEMORY_MARGIN_FRACTION = 0.02
"""Left free of the GPU's memory when pruning by prediction: the predicted peak is within a few % of the measured
one for the configurations measured (docs/memory-model.md); 1.6 GiB of an 80 GiB GPU."""
DEFAULT_TRIAL_STEPS = 20
"""Optimizer steps per trial: the probe's first 2 are warm-up (10%, at least 2), 18 are timed."""
DEFAULT_BUDGET_MINUTES = 15.0
CPU_MAX_BATCH = 64
"""The largest batch tried on the CPU when no --gpu-memory bounds it: host memory is not what the search is for."""
GPU_MAX_BATCH = 4096
"""The largest batch tried on a GPU, whatever the prediction says (as `gpuanat fit`'s --max-batch)."""
WORKER_COUNTS = (0, 2)
TOP_RUNG_MULTIPLE = 8
"""Besides powers of two, the batch ladder's top rung is the largest batch predicted to fit, rounded down to a
multiple of 8 (tensor-core friendly): bert-large bf16 on an 80 GiB GPU fits 140, above the 128 rung."""
COMPILE_TIME_FACTOR = 2.0
"""Before any compiled trial ran, one is expected to take this many times an eager trial (compilation)."""
MEMORY_SOURCES = (
    ("process_memory_used_bytes", "NVML: the training process's GPU memory"),
    ("peak_reserved_bytes", "torch: peak reserved by the caching allocator"),
    ("device_memory_used_bytes", "NVML: the GPU's used memory"),
    ("predicted_peak_allocated_bytes", "predicted peak allocated memory (the run measured none: CPU)"),
    ("unmeasured", "none: neither measured nor predicted (a --model on the CPU)"),
)
"""Where the front's memory comes from, in order of preference: the first that every ok trial has."""
MEMORY_RELEVANT_FIELDS = ("precision", "grad_checkpointing", "optim", "attn", "compile", "compile_regions",
                          "expandable_segments", "liger")
"""Techniques that change what a batch needs: a trial that ran out of memory rules out larger batches only for
the same values of these."""

T = TypeVar("T")
GIB = 1024**3


@dataclass(frozen=True)
class SearchSpace:
    """What `run_tune` may change, and the limits it searches within."""

    dimensions: tuple[str, ...]
    """The dimensions searched, in move order; the others stay as the base config has them."""
    half_precision: str
    """bf16, or fp16 on a GPU of compute capability < 8."""
    optimizers: tuple[str, ...]
    """adamw_torch_fused, and adamw_bnb_8bit where bitsandbytes and CUDA are there."""
    gpu_memory_bytes: int | None
    """The GPU's memory (NVML's total) the candidates must fit; None: no limit (the CPU without --gpu-memory)."""
    max_batch: int
    effective_batch: int | None = None
    """Samples per optimizer step to keep: each batch b trains with accumulation effective_batch / b."""
    tf32_available: bool = False

    @property
    def usable_memory_bytes(self) -> int | None:
        if self.gpu_memory_bytes is None:
            return None
        return self.gpu_memory_bytes - int(MEMORY_MARGIN_FRACTION * self.gpu_memory_bytes)


def search_space(base: RunConfig, capabilities: Capabilities, given: Collection[str], *,
                 gpu_memory_bytes: int | None, only: Sequence[str] | None = None, max_batch: int | None = None,
                 effective_batch: int | None = None) -> SearchSpace:
    """The dimensions to search on this machine: those in `only` (default: all), less those whose fields the user
    gave (`given`: RunConfig field names) and those this machine or workload has no alternative for."""
    cuda = base.device == "cuda"
    capability = capabilities.cuda_compute_capability
    ampere = cuda and (capability is None or capability >= (8, 0))
    causal_lm = base.model is None and PRESETS[base.preset].objective == "causal-lm"
    bitsandbytes = cuda and capabilities.bitsandbytes_version is not None
    applicable = {
        "batch": "batch_size" not in given,
        "precision": True,
        "tf32": ampere,
        "attn": True,
        "optim": bitsandbytes and not base.load_in_4bit,
        "grad-checkpointing": gpu_memory_bytes is not None,
        "workers": True,
        "expandable-segments": cuda,
        "liger": causal_lm and cuda and capabilities.liger_version is not None,
        # the docs' Accelerate loop reads the loss only when it logs; Trainer synchronises once a step
        "engine": base.distributed in ("none", "ddp"),
        "compile": True,
    }
    chosen = set(DIMENSIONS if only is None else only)
    dimensions = tuple(name for name in DIMENSIONS if name in chosen and applicable[name]
                       and not (set(DIMENSION_FIELDS[name]) & set(given) - {"grad_accum"}))
    limit = max_batch or (GPU_MAX_BATCH if cuda or gpu_memory_bytes is not None else CPU_MAX_BATCH)
    if effective_batch is not None:
        limit = min(limit, effective_batch)
    return SearchSpace(
        dimensions=dimensions,
        half_precision="bf16" if not cuda or ampere else "fp16",
        optimizers=("adamw_torch_fused", "adamw_bnb_8bit") if bitsandbytes else ("adamw_torch_fused",),
        gpu_memory_bytes=gpu_memory_bytes, max_batch=limit, effective_batch=effective_batch, tf32_available=ampere,
    )


def searched_fields(space: SearchSpace) -> set[str]:
    return {name for dimension in space.dimensions for name in DIMENSION_FIELDS[dimension]}


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
    result: dict[str, Any]
    """The run's result, as `gpuanat run --json` gives it."""
    wall_s: float
    """The trial's wall time, start-up included: what the budget pays."""

    @property
    def status(self) -> str:
        return str(self.result["status"])

    @property
    def run_id(self) -> int | None:
        return self.result.get("run_id")

    @property
    def samples_per_second(self) -> float | None:
        """The steady rate (warm-up excluded); the whole run's where the run had no steady window."""
        steady = self.result.get("steady_samples_per_second")
        return steady if steady is not None else self.result.get("samples_per_second")

    @property
    def rate_source(self) -> str:
        return "steady" if self.result.get("steady_samples_per_second") is not None else "whole run"

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.samples_per_second is not None

    def memory_bytes(self, source: str) -> int | None:
        if source == "unmeasured":
            return None
        if source == "predicted_peak_allocated_bytes":
            return (self.result.get("predicted") or {}).get("peak_allocated_bytes")
        value = self.result.get(source)
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
        """The fastest ok trial (of equal speeds, the one using less memory): on the front by construction."""
        source = self.memory_source
        ok = self.ok_trials
        if not ok or source is None:
            return None
        return max(ok, key=lambda trial: (trial.samples_per_second or 0.0, -(trial.memory_bytes(source) or 0)))


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


def _powers_of_two(limit: int) -> list[int]:
    return [1 << exponent for exponent in range(limit.bit_length()) if 1 << exponent <= limit]


class _Predictor:
    """The memory prediction, asked the same questions many times: answers kept."""

    def __init__(self, space: SearchSpace) -> None:
        self.space = space
        self._largest: dict[RunConfig, int] = {}

    def largest_fitting(self, config: RunConfig) -> int | None:
        """The largest batch predicted to fit with `config`'s other techniques (None: no limit known)."""
        usable = self.space.usable_memory_bytes
        if usable is None or config.model is not None:
            return None
        key = config.replace(batch_size=1)
        if key not in self._largest:
            self._largest[key] = largest_batch(key, usable).batch_size
        return self._largest[key]

    def fits(self, config: RunConfig) -> bool:
        largest = self.largest_fitting(config)
        return largest is None or config.batch_size <= largest

    @staticmethod
    def peak_device_bytes(config: RunConfig) -> int | None:
        predicted = prediction_json(config)
        return predicted["peak_device_bytes"] if predicted is not None else None


class _Search:
    """The state of one search: what was tried, refused and ruled out."""

    def __init__(self, base: RunConfig, space: SearchSpace, predictor: _Predictor) -> None:
        self.base = base
        self.space = space
        self.predictor = predictor
        self.tried: dict[RunConfig, TuneTrial] = {}
        self.pruned: dict[RunConfig, Pruned] = {}
        self.dead: set[tuple[str, tuple[Any, ...]]] = set()
        self.oom_batches: dict[tuple[Any, ...], int] = {}

    # The batch ladder

    def with_batch(self, config: RunConfig, batch_size: int) -> RunConfig:
        if self.space.effective_batch is not None:
            return config.replace(batch_size=batch_size, grad_accum=self.space.effective_batch // batch_size)
        return config.replace(batch_size=batch_size)

    def ladder(self, config: RunConfig) -> list[int]:
        """Batches the search may try with `config`'s techniques, smallest first: powers of two (dividing the
        effective batch when one is kept, and the effective batch itself), and the largest predicted to fit."""
        effective = self.space.effective_batch
        rungs = set(_powers_of_two(self.space.max_batch))
        if effective is not None:
            rungs = {rung for rung in rungs if effective % rung == 0} | {effective}
        largest = self.predictor.largest_fitting(config)
        if largest is not None and effective is None:
            top = min(largest, self.space.max_batch) // TOP_RUNG_MULTIPLE * TOP_RUNG_MULTIPLE
            if top > 0:
                rungs.add(top)
        return sorted(rung for rung in rungs if rung <= self.space.max_batch)

    def largest_fitting_rung(self, config: RunConfig, powers_only: bool = False) -> RunConfig | None:
        """`config` at the largest rung predicted to fit (only powers of two and the effective batch when
        `powers_only`); None when none does."""
        for rung in reversed(self.ladder(config)):
            if powers_only and rung & (rung - 1) and rung != self.space.effective_batch:
                continue
            candidate = self.with_batch(config, rung)
            if self.predictor.fits(candidate) and not self._batch_dead(candidate):
                return candidate
        return None

    # Candidates

    def start(self) -> RunConfig:
        """The strong start, before its batch is chosen."""
        config, searched = self.base, searched_fields(self.space)
        changes: dict[str, Any] = {"precision": self.space.half_precision, "tf32": self.space.tf32_available,
                                   "attn": "sdpa", "optim": "adamw_torch_fused", "grad_checkpointing": False,
                                   "compile": False, "compile_regions": False}
        return config.replace(**{name: value for name, value in changes.items() if name in searched})

    def _fitted(self, candidate: RunConfig, dimension: str) -> RunConfig | None:
        """`candidate`, or with its batch stepped down to the largest rung that fits when the batch is searched;
        None (and the refusal noted) when it cannot fit."""
        if self.predictor.fits(candidate):
            return candidate
        self.note_pruned(candidate, dimension)
        if "batch" not in self.space.dimensions:
            return None
        smaller = [rung for rung in self.ladder(candidate) if rung < candidate.batch_size]
        for rung in reversed(smaller):
            stepped = self.with_batch(candidate, rung)
            if self.predictor.fits(stepped):
                return stepped
        return None

    def note_pruned(self, candidate: RunConfig, dimension: str) -> None:
        if candidate in self.pruned:
            return
        largest = self.predictor.largest_fitting(candidate)
        usable = self.space.usable_memory_bytes
        total = self.space.gpu_memory_bytes
        reason = (f"predicted not to fit {usable / GIB:.2f} GiB (the GPU's {total / GIB:.2f} GiB less a "
                  f"{MEMORY_MARGIN_FRACTION:.0%} margin): the largest batch predicted to fit with these techniques is "
                  f"{largest}" if usable is not None and total is not None else "")
        self.pruned[candidate] = Pruned(candidate, dimension, reason, self.predictor.peak_device_bytes(candidate))

    def alternatives(self, dimension: str, center: RunConfig) -> list[RunConfig]:
        """The candidates of one move away from `center` along `dimension`, each fitted to the memory (those that
        cannot fit are noted as pruned and left out)."""
        candidates: list[RunConfig | None] = []
        if dimension == "batch":
            ladder = sorted(set(self.ladder(center)) | {center.batch_size})
            position = ladder.index(center.batch_size)
            for neighbour in (ladder[position - 1] if position > 0 else None,
                              ladder[position + 1] if position + 1 < len(ladder) else None):
                if neighbour is None:
                    continue
                candidate = self.with_batch(center, neighbour)
                if self.predictor.fits(candidate):
                    candidates.append(candidate)
                else:
                    self.note_pruned(candidate, dimension)
        elif dimension == "precision":
            for precision in (self.space.half_precision, "fp32"):
                if precision != center.precision:
                    candidates.append(self._fitted(center.replace(precision=precision), dimension))
        elif dimension == "tf32":
            candidates.append(center.replace(tf32=not center.tf32))
        elif dimension == "attn":
            candidates.append(self._fitted(center.replace(attn="eager" if center.attn == "sdpa" else "sdpa"),
                                           dimension))
        elif dimension == "optim":
            candidates.extend(self._fitted(center.replace(optim=optim), dimension) for optim in self.space.optimizers
                              if optim != center.optim)
        elif dimension == "grad-checkpointing":
            candidates.append(self._checkpointing_move(center))
        elif dimension == "workers":
            candidates.extend(center.replace(workers=workers) for workers in WORKER_COUNTS if workers != center.workers)
        elif dimension == "engine":
            candidates.append(center.replace(engine="accelerate" if center.engine == "trainer" else "trainer"))
        elif dimension == "compile":  # the other two of eager, regions compiled, the model compiled
            for mode in ("regions", "model", "off"):
                if mode != compile_mode(center):
                    candidates.append(self._fitted(with_compile_mode(center, mode), dimension))
        elif dimension in ("expandable-segments", "liger"):
            name = DIMENSION_FIELDS[dimension][0]
            candidates.append(self._fitted(center.replace(**{name: not getattr(center, name)}), dimension))
        return [candidate for candidate in dict.fromkeys(candidates) if candidate is not None and candidate != center]

    def _checkpointing_move(self, center: RunConfig) -> RunConfig | None:
        """Checkpointing trades speed for memory, so it is tried only where it lets a larger batch fit: on, at the
        largest power of two that fits with it, when that is larger than the largest without it. Off again
        (from a start the user gave it in) at the largest batch that fits."""
        if center.grad_checkpointing:
            return self._fitted(center.replace(grad_checkpointing=False), "grad-checkpointing")
        if "batch" not in self.space.dimensions:
            return self._fitted(center.replace(grad_checkpointing=True), "grad-checkpointing")
        without = self.largest_fitting_rung(center, powers_only=True)
        with_checkpointing = self.largest_fitting_rung(center.replace(grad_checkpointing=True), powers_only=True)
        if with_checkpointing is None or (without is not None
                                          and with_checkpointing.batch_size <= without.batch_size):
            return None
        return with_checkpointing

    # What failed

    @staticmethod
    def _direction(dimension: str, config: RunConfig) -> tuple[str, tuple[Any, ...]]:
        return dimension, tuple(getattr(config, name) for name in DIMENSION_FIELDS[dimension])

    @staticmethod
    def _memory_signature(config: RunConfig) -> tuple[Any, ...]:
        return (*(getattr(config, name) for name in MEMORY_RELEVANT_FIELDS), config.grad_accum > 1)

    def _batch_dead(self, config: RunConfig) -> bool:
        limit = self.oom_batches.get(self._memory_signature(config))
        return limit is not None and config.batch_size >= limit

    def is_dead(self, dimension: str, config: RunConfig) -> bool:
        return self._batch_dead(config) or (dimension not in ("start", "batch")
                                            and self._direction(dimension, config) in self.dead)

    def mark_failed(self, trial: TuneTrial) -> None:
        if trial.status == "oom":
            signature = self._memory_signature(trial.config)
            self.oom_batches[signature] = min(self.oom_batches.get(signature, trial.config.batch_size),
                                              trial.config.batch_size)
        if trial.dimension not in ("start", "batch"):
            self.dead.add(self._direction(trial.dimension, trial.config))

    def untried(self, center: RunConfig) -> int:
        """Candidates one move from `center` still to try: how many trials this round has left at least."""
        return sum(1 for dimension in self.space.dimensions for candidate in self.alternatives(dimension, center)
                   if candidate not in self.tried and not self.is_dead(dimension, candidate))


def trial_config(config: RunConfig, trial_steps: int) -> RunConfig:
    """What a trial trains: `trial_steps` optimizer steps, on a dataset of exactly that many full batches."""
    ranks = config.ranks or 1
    return config.replace(max_steps=trial_steps, epochs=1,
                          samples=config.batch_size * config.grad_accum * ranks * trial_steps)


def trial_name(index: int, config: RunConfig) -> str:
    return f"tune {index}: {config.techniques_summary()}"


@dataclass(frozen=True)
class Progress:
    """Where the search stands after a trial."""

    elapsed_s: float
    budget_s: float
    estimated_left_s: float
    """The trials one move from the best still to try, at the mean trial's time, capped by the budget left: a
    floor while moves keep helping (each kept move opens a new round)."""


def run_tune(base: RunConfig, space: SearchSpace, *, store: HistoryStore, log_dir: Path, trial_steps: int,
             budget_s: float, run_trial: Callable[..., dict[str, Any]] = execute_run,
             on_trial: Callable[[TuneTrial, Progress], None] | None = None,
             on_pruned: Callable[[Pruned], None] | None = None,
             on_kept: Callable[[TuneTrial, float], None] | None = None,
             stop: threading.Event | None = None, clock: Callable[[], float] = time.monotonic,
             noise: float = NOISE_FRACTION, **run_options: Any) -> TuneResult:
    """Search from `base` (the workload, and every technique the user fixed) within `space`, each trial a real run
    of `trial_steps` steps through `run_trial` (`execute_run`'s signature), recorded in `store` as "tune N: …".
    Stops when no move helps, when the next trial would not end within `budget_s` (estimated from the trials
    done), or when `stop` is set — returning what was found so far each time. `on_kept` gets each trial moved
    to and its gain over the best before it (a fraction; 0 for the start)."""
    started_s = clock()
    predictor = _Predictor(space)
    search = _Search(base, space, predictor)
    result = TuneResult()
    reported_pruned: set[RunConfig] = set()

    def report_pruned() -> None:
        for config, pruned in search.pruned.items():
            if config not in reported_pruned:
                reported_pruned.add(config)
                result.pruned.append(pruned)
                if on_pruned is not None:
                    on_pruned(pruned)

    def estimate_s(config: RunConfig) -> float | None:
        compiled = compile_mode(config) != "off"
        done = [trial.wall_s for trial in result.trials if compile_mode(trial.config) == compile_mode(config)]
        if done:
            return sum(done) / len(done)
        if not result.trials:
            return None
        mean = sum(trial.wall_s for trial in result.trials) / len(result.trials)
        return mean * (COMPILE_TIME_FACTOR if compiled else 1.0)

    def stopped() -> bool:
        if stop is not None and stop.is_set():
            result.stop_reason = "interrupted"
            return True
        return result.stop_reason in ("budget", "interrupted", "failed")

    def attempt(config: RunConfig, dimension: str, center: RunConfig | None) -> TuneTrial | None:
        """Run `config` unless it was tried, is ruled out, or would overrun the budget."""
        if config in search.tried:
            return search.tried[config]
        if stopped() or search.is_dead(dimension, config):
            return None
        expected = estimate_s(config)
        if expected is not None and clock() - started_s + expected > budget_s:
            result.stop_reason = "budget"
            return None
        index = len(result.trials) + 1
        name = trial_name(index, config)
        began = clock()
        run = run_trial(trial_config(config, trial_steps), store=store, log_dir=log_dir, name=name, **run_options)
        trial = TuneTrial(index, name, dimension, config, run, clock() - began)
        result.trials.append(trial)
        search.tried[config] = trial
        if trial.status == "stopped" or (stop is not None and stop.is_set()):
            result.stop_reason = "interrupted"
        elif not trial.ok:
            search.mark_failed(trial)
        if on_trial is not None:
            elapsed = clock() - started_s
            mean = sum(t.wall_s for t in result.trials) / len(result.trials)
            following = search.untried(center or config) if result.stop_reason != "interrupted" else 0
            on_trial(trial, Progress(elapsed, budget_s, max(0.0, min(budget_s - elapsed, following * mean))))
        return trial

    center_trial = _start(search, result, attempt, report_pruned)
    if center_trial is not None:
        result.kept.append(center_trial.index)
        if on_kept is not None:
            on_kept(center_trial, 0.0)
    while center_trial is not None and not stopped():
        moved = False
        for dimension in moves_in_order(space.dimensions, center_trial.result):
            candidates = search.alternatives(dimension, center_trial.config)
            report_pruned()
            trials = [attempt(candidate, dimension, center_trial.config) for candidate in candidates]
            report_pruned()
            ok = [trial for trial in trials if trial is not None and trial.ok]
            if ok:
                fastest = max(ok, key=lambda trial: trial.samples_per_second or 0.0)
                best_rate = center_trial.samples_per_second or 0.0
                if fastest is not center_trial and beats(fastest.samples_per_second or 0.0, best_rate, noise):
                    gain = (fastest.samples_per_second or 0.0) / best_rate - 1.0 if best_rate else 0.0
                    center_trial = fastest
                    result.kept.append(fastest.index)
                    moved = True
                    if on_kept is not None:
                        on_kept(fastest, gain)
            if stopped():
                break
        if not moved:
            break
    report_pruned()
    result.elapsed_s = clock() - started_s
    return result


def moves_in_order(dimensions: Sequence[str], center_result: Mapping[str, Any]) -> list[str]:
    """`dimensions` with the moves that answer the kept run's main bottleneck first (FIRST_MOVES_FOR), the others
    in their usual order."""
    findings = center_result.get("diagnosis") or []
    first = FIRST_MOVES_FOR.get(findings[0]["bottleneck"], ()) if findings else ()
    return ([dimension for dimension in first if dimension in dimensions]
            + [dimension for dimension in dimensions if dimension not in first])


def _start(search: _Search, result: TuneResult, attempt: Callable[[RunConfig, str, RunConfig | None],
                                                                    TuneTrial | None],
           report_pruned: Callable[[], None]) -> TuneTrial | None:
    """Run the strong start; after an OOM, the next smaller batch on the ladder, until one trains. None (with the
    reason in `result.stop_reason`) when none does."""
    config = search.start()
    while True:
        if "batch" in search.space.dimensions:
            fitted = search.largest_fitting_rung(config, powers_only=True)
            larger = [rung for rung in search.ladder(config) if fitted is None or rung > fitted.batch_size]
            refused = search.with_batch(config, larger[0]) if larger else None
            if refused is not None and not search.predictor.fits(refused):
                search.note_pruned(refused, "start")  # where the prediction bounds the start
        else:
            fitted = config if search.predictor.fits(config) else None
            if fitted is None:
                search.note_pruned(config, "start")
        report_pruned()
        if fitted is None:
            if result.stop_reason == "converged":
                result.stop_reason = "nothing fits"
            return None
        trial = attempt(fitted, "start", None)
        if trial is None:
            return None
        if trial.ok:
            return trial
        if trial.status != "oom" or "batch" not in search.space.dimensions:
            if result.stop_reason == "converged":
                result.stop_reason = "failed"
            return None
        config = fitted


def run_flags(config: RunConfig) -> list[str]:
    """`config` as `gpuanat run` flags: every technique that differs from RunConfig's defaults, and on CUDA the
    allocator's expandable segments either way (the default follows the user's PYTORCH_CUDA_ALLOC_CONF)."""
    defaults = {item.name: item.default for item in fields(RunConfig)}
    flags: list[str] = []
    for technique in TECHNIQUES:
        value = getattr(config, technique.field)
        explicit = technique.field == "expandable_segments" and config.device == "cuda"
        if value == defaults.get(technique.field) and not explicit:
            continue
        if technique.kind == "bool":
            flags.append(technique.flag if value else "--no-" + technique.flag.removeprefix("--"))
        elif value is not None:
            flags.extend([technique.flag, str(value)])
    return flags


def run_command(config: RunConfig) -> str:
    return shlex.join(["gpuanat", "run", *run_flags(config)])
