"""The search itself (`run_tune`): a strong start, then greedy coordinate moves from the best so far, each trial
a short real run, until no move helps, the budget would be exceeded, or the user stops it.

No torch here: the runs happen in child processes (`execute_run`); tests inject `run_trial` and the clock.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuanat.core.run.session import execute_run
from gpuanat.core.run.tune.candidates import Predictor, Search
from gpuanat.core.run.tune.moves import move_order
from gpuanat.core.run.tune.result import NOISE_FRACTION, Pruned, TuneResult, TuneTrial, beats
from gpuanat.core.run.tune.runs import trial_config, trial_name
from gpuanat.core.run.tune.space import SearchSpace
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.vocabulary.techniques import compile_mode

DEFAULT_TRIAL_STEPS = 20
DEFAULT_BUDGET_MINUTES = 15.0
COMPILE_TIME_FACTOR = 2.0
"""Before any compiled trial ran, one is expected to take this many times an eager trial (compilation)."""


TRIAL_KINDS = {
    "off": "an eager trial",
    "regions": "a trial with compiled regions",
    "model": "a trial with the model compiled",
}
"""The kinds of trial timed apart (`compile_mode`), as the progress names one not yet timed."""


@dataclass(frozen=True)
class Progress:
    """Where the search stands after a trial."""

    elapsed_s: float
    budget_s: float
    trials_left: int
    """The trials the search runs before it ends if no further move helps: the candidates one move from the best
    still untried. Each kept move opens another round, so the search may run more (never past the budget)."""
    estimated_left_s: float | None
    """Those trials' time, each at the mean wall time (start-up included) of the trials done of its kind — eager,
    compiled regions, the whole model compiled (`compile_mode`) — capped by the budget left; None while a kind still
    to run has no trial done to time it by (a compiled trial takes several eager ones' time: compilation)."""
    untimed_kind: str | None = None
    """A kind of trial still to run that no trial done has timed yet (then `estimated_left_s` is None)."""
    timed_left_s: float = 0.0
    """The time of the trials left whose kind is timed: while `estimated_left_s` is None, the least time left."""

    def left_words(self, duration: Callable[[float], str]) -> str:
        """The time left in words, durations written by `duration`: "about 2m05s left (6 trials; more if a move
        helps)", "estimating… at least 1m10s left (6 trials; a trial with compiled regions not yet timed)"."""
        if self.trials_left == 0:
            return "no trial left unless a move helps"
        trials = f"{self.trials_left} trial{'s' if self.trials_left != 1 else ''}"
        if self.estimated_left_s is None:
            kind = TRIAL_KINDS.get(self.untimed_kind or "", "a trial")
            return f"estimating… at least {duration(self.timed_left_s)} left ({trials}; {kind} not yet timed)"
        if self.estimated_left_s >= self.budget_s - self.elapsed_s:
            return f"about {duration(self.estimated_left_s)} left ({trials}: to the budget's end)"
        return f"about {duration(self.estimated_left_s)} left ({trials}; more if a move helps)"


def estimate_progress(
    elapsed_s: float, budget_s: float, trials_left: Sequence[RunConfig], done: Sequence[TuneTrial]
) -> Progress:
    """The search's progress after the trials `done`, with `trials_left` still to run (if no further move helps):
    each trial left is timed by the mean wall time of the trials done of its kind (`compile_mode`)."""
    walls_by_kind: dict[str, list[float]] = {}
    for trial in done:
        walls_by_kind.setdefault(compile_mode(trial.config), []).append(trial.wall_s)
    timed_left_s, untimed_kind = 0.0, None
    for config in trials_left:
        walls = walls_by_kind.get(compile_mode(config))
        if walls:
            timed_left_s += sum(walls) / len(walls)
        elif untimed_kind is None:
            untimed_kind = compile_mode(config)
    budget_left_s = max(0.0, budget_s - elapsed_s)
    return Progress(
        elapsed_s,
        budget_s,
        len(trials_left),
        None if untimed_kind is not None else min(budget_left_s, timed_left_s),
        untimed_kind,
        min(budget_left_s, timed_left_s),
    )


def run_tune(
    base: RunConfig,
    space: SearchSpace,
    *,
    store: HistoryStore,
    log_dir: Path,
    trial_steps: int,
    budget_s: float,
    run_trial: Callable[..., RunResult] = execute_run,
    on_trial: Callable[[TuneTrial, Progress], None] | None = None,
    on_pruned: Callable[[Pruned], None] | None = None,
    on_kept: Callable[[TuneTrial, float], None] | None = None,
    on_round: Callable[[TuneTrial, str], None] | None = None,
    stop: threading.Event | None = None,
    clock: Callable[[], float] = time.monotonic,
    noise: float = NOISE_FRACTION,
    objective: str = "throughput",
    data_longest_row: int | None = None,
    **run_options: Any,
) -> TuneResult:
    """Search from `base` (the workload, and every technique the user fixed) within `space`, each trial a real run
    of `trial_steps` steps through `run_trial` (`execute_run`'s signature), recorded in `store` as "tune N: …".
    Stops when no move helps, when the next trial would not end within `budget_s` (estimated from the trials
    done), or when `stop` is set — returning what was found so far each time. `on_kept` gets each trial moved
    to and its gain over the best before it (a fraction; 0 for the start); `on_round` each round's center and why
    its moves come in their order (`moves.move_order`; empty when nothing reorders them). `objective`: what a move
    must improve, steady samples/s ("throughput") or samples a joule ("energy", `TuneTrial.rate`).
    `data_longest_row`: --data's longest row in tokens, which sizes the candidates' predictions and each trial's
    (`memory.data_length`)."""
    started_s = clock()
    predictor = Predictor(space, data_longest_row)
    if data_longest_row is not None:
        run_options = {**run_options, "data_longest_row": data_longest_row}
    search = Search(base, space, predictor)
    result = TuneResult(objective=objective)
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
            following = search.untried(center or config) if result.stop_reason != "interrupted" else []
            on_trial(trial, estimate_progress(clock() - started_s, budget_s, following, result.trials))
        return trial

    center_trial = _start(search, result, attempt, report_pruned)
    if center_trial is not None:
        result.kept.append(center_trial.index)
        if on_kept is not None:
            on_kept(center_trial, 0.0)
    while center_trial is not None and not stopped():
        moved = False
        order = move_order(space.dimensions, center_trial.result)
        if on_round is not None:
            on_round(center_trial, order.reason)
        for dimension in order.dimensions:
            candidates = search.alternatives(dimension, center_trial.config)
            report_pruned()
            trials = [attempt(candidate, dimension, center_trial.config) for candidate in candidates]
            report_pruned()
            ok = [trial for trial in trials if trial is not None and trial.ok and trial.rate(objective) is not None]
            if ok:
                fastest = max(ok, key=lambda trial: trial.rate(objective) or 0.0)
                best_rate = center_trial.rate(objective) or 0.0
                if fastest is not center_trial and beats(fastest.rate(objective) or 0.0, best_rate, noise):
                    gain = (fastest.rate(objective) or 0.0) / best_rate - 1.0 if best_rate else 0.0
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


def _start(
    search: Search,
    result: TuneResult,
    attempt: Callable[[RunConfig, str, RunConfig | None], TuneTrial | None],
    report_pruned: Callable[[], None],
) -> TuneTrial | None:
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
