"""The largest batch that trains: start from the prediction, confirm with short real runs.

Where the run is not predicted — a --model whose config cannot be described, or the whole model compiled — the
search starts elsewhere and says so (`fit_start`): the whole model compiled from the batch predicted for eager, which
bounds nothing (on the H100 bert-large compiled whole took 1.7x eager's memory, docs/compile.md), else the batch given.

The search steps up from the predicted batch while batches train (or down while they run out of
memory), by 8 and then by doubling steps, then bisects between the largest that trained and the
smallest that did not. Each trial is a real run of a few steps, recorded in the history like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuanat.core.memory.allocation_templates import largest_batch
from gpuanat.core.memory.compiled import compile_unpredicted_reason
from gpuanat.core.memory.data_length import at_data_length
from gpuanat.core.memory.predict import unreadable_model_reason
from gpuanat.core.run.session import execute_run
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import RunResult


@dataclass(frozen=True)
class Trial:
    batch_size: int
    trained: bool
    """False when the run ran out of memory."""


def fit_unsupported_reason(config: RunConfig) -> str | None:
    """Why `config` cannot be fitted, else None: the search finds the largest batch that fits GPU memory, and on
    the CPU it would only climb to its cap (memory there is the host's, and swaps before it runs out)."""
    if config.device == "cuda":
        return None
    return (
        f"fit needs a CUDA GPU: it finds the largest batch that fits GPU memory, and this run is on "
        f"{config.device}; gpuanat predict --gpu-memory 24GiB predicts it for a GPU of that size"
    )


@dataclass(frozen=True)
class FitStart:
    """Where the search starts, and why there."""

    batch_size: int
    predicted: int | None
    """The largest batch predicted to fit; None where the run is not predicted (or no GPU size is known)."""
    method: str | None
    """How `batch_size` was found: the prediction's method (`replay`, `model`), `eager` (the whole model compiled
    starts where eager is predicted to fit, no bound), or None: the batch given."""

    def words(self) -> str:
        """ "(the prediction)" and the like: why the search starts at `batch_size`; empty for the batch given."""
        if self.method == "eager":
            return (
                " (eager's prediction, which bounds nothing here: the whole model compiled is not predicted, "
                "the trials decide)"
            )
        return " (the prediction)" if self.method is not None else ""


def fit_start(config: RunConfig, gpu_memory_bytes: int | None, data_longest_row: int | None = None) -> FitStart:
    """The batch the search starts from on a GPU of `gpu_memory_bytes` (None: not known): the largest predicted to
    fit; for the whole model compiled, never its own prediction (there is none) but eager's; else `config`'s batch.
    A --data run is predicted at its longest batch's length, its rows at most `data_longest_row` tokens."""
    if gpu_memory_bytes is None or unreadable_model_reason(config) is not None:
        return FitStart(config.batch_size, None, None)
    config = at_data_length(config, data_longest_row)
    if compile_unpredicted_reason(config) is not None:
        eager = largest_batch(config.replace(compile=False), gpu_memory_bytes).batch_size
        return FitStart(eager, None, "eager") if eager else FitStart(config.batch_size, None, None)
    predicted = largest_batch(config, gpu_memory_bytes)
    if not predicted.batch_size:
        return FitStart(config.batch_size, 0, None)
    return FitStart(predicted.batch_size, predicted.batch_size, predicted.method)


FIRST_STEP = 8
"""The search's first step away from the start: the prediction is meant to fit while 8 more does not."""


def find_largest_batch(trains: Callable[[int], bool], start: int, limit: int) -> tuple[int, list[Trial]]:
    """The largest batch in [1, limit] for which `trains` is true (0 if none), and the trials made.

    From `start` (the prediction) it steps up while batches train — or down while they run out of
    memory — by 8, then 16, 32, ..., and bisects the last step. A good prediction costs about five
    trials: the prediction trains, 8 more does not, three bisections. Assumes memory grows with the
    batch: if a batch runs out of memory, every larger one does too.
    """
    trials: list[Trial] = []

    def attempt(batch_size: int) -> bool:
        trained = trains(batch_size)
        trials.append(Trial(batch_size, trained))
        return trained

    start = min(max(1, start), limit)
    step = FIRST_STEP
    if attempt(start):
        largest_ok, smallest_failed = start, None
        while smallest_failed is None and largest_ok < limit:
            candidate = min(largest_ok + step, limit)
            if attempt(candidate):
                largest_ok = candidate
            else:
                smallest_failed = candidate
            step *= 2
        if smallest_failed is None:
            return largest_ok, trials
    else:
        largest_ok, smallest_failed = 0, start
        while largest_ok == 0 and smallest_failed > 1:
            candidate = max(smallest_failed - step, 1)
            if attempt(candidate):
                largest_ok = candidate
            else:
                smallest_failed = candidate
            step *= 2
    while smallest_failed - largest_ok > 1:
        middle = (largest_ok + smallest_failed) // 2
        if attempt(middle):
            largest_ok = middle
        else:
            smallest_failed = middle
    return largest_ok, trials


@dataclass(frozen=True)
class FitResult:
    largest_batch_size: int
    trials: tuple[Trial, ...]
    results: dict[int, RunResult]
    """Each trial's run result, by batch size."""
    failure: RunResult | None
    """The first trial that ended otherwise than trained or out of memory; the search stopped there."""


def run_fit(
    base: RunConfig,
    *,
    store: HistoryStore,
    log_dir: Path,
    start: int,
    trial_steps: int,
    max_batch: int,
    run_trial: Callable[..., RunResult] = execute_run,
    on_trial: Callable[[int, RunResult], None] | None = None,
    **run_options: Any,
) -> FitResult:
    """Search with real runs of `trial_steps` steps, each recorded as "fit batch N"."""
    results: dict[int, RunResult] = {}
    failures: list[RunResult] = []

    def trains(batch_size: int) -> bool:
        if failures:
            return False
        config = base.replace(
            batch_size=batch_size, max_steps=trial_steps, samples=batch_size * base.grad_accum * trial_steps
        )
        result = run_trial(config, store=store, log_dir=log_dir, name=f"fit batch {batch_size}", **run_options)
        results[batch_size] = result
        if on_trial is not None:
            on_trial(batch_size, result)
        if result.status not in ("ok", "oom"):
            failures.append(result)
        return result.status == "ok"

    largest, trials = find_largest_batch(trains, start, max_batch)
    return FitResult(largest, tuple(trials), results, failures[0] if failures else None)
