"""The launching dashboard's searches of short real runs: f fits (the largest batch that trains, from the predicted
one), T tunes (the fastest set of techniques that fits).

A key starts one as it starts a run, in the `RunControl`'s run worker: `fit_search` and `tune_search` are its bodies.
They run their trials one after the other through the dashboard's backend, each a recorded run whose events reach the
dashboard's inbox, and report their progress and their outcome as messages (`gpuanat.tui.messages`); they stop,
keeping what they found, when the search's `LiveRun.stop_requested` is set. The dashboard's `SearchKeys`
(`gpuanat.tui.search_keys`) starts them, says each trial's outcome as it comes, and makes what the search found the
configured run.
"""

from __future__ import annotations

from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.run.fit import fit_start
from gpuanat.core.run.tune.runs import run_command
from gpuanat.core.run.tune.search import DEFAULT_BUDGET_MINUTES, DEFAULT_TRIAL_STEPS
from gpuanat.core.run.tune.space import search_space
from gpuanat.core.store.report import counted
from gpuanat.core.vocabulary.config import Capabilities
from gpuanat.tui.messages import (
    FitFinished,
    FitStarting,
    FitTrialDone,
    TuneFinished,
    TuneRoundOrdered,
    TuneTrialDone,
)
from gpuanat.tui.run_control import RunControl

FIT_TRIAL_STEPS = 3
FIT_MAX_BATCH = 1024


def fit_search(control: RunControl, live: LiveRun, gpu_total: int | None) -> None:
    """The largest batch that trains, from the predicted largest batch on a GPU of `gpu_total` bytes."""
    try:
        hooks = control.hooks(live)  # (reads --data's lengths if the panel has not yet)
        # a replay takes a second: not on the UI thread
        starting = fit_start(live.config, gpu_total or None, hooks.data_longest_row)
        start = starting.batch_size
        control.post(FitStarting(start, starting.method))
        fit = control.backend.fit(
            live.config,
            hooks,
            start=start,
            trial_steps=FIT_TRIAL_STEPS,
            max_batch=FIT_MAX_BATCH,
            on_trial=lambda batch_size, result: control.post(FitTrialDone(batch_size, str(result.status))),
        )
    except Exception as error:  # the dashboard must survive any failure of a run
        control.post(FitFinished(None, f"{type(error).__name__}: {error}"))
        return
    failure = None
    if fit.failure is not None:
        failure = f"the trial at batch {fit.failure.config['batch_size']} ended {fit.failure.status}"
    control.post(FitFinished(fit.largest_batch_size, failure))


def tune_search(control: RunControl, live: LiveRun, gpu_total: int | None, capabilities: Capabilities) -> None:
    """The fastest set of techniques that fits a GPU of `gpu_total` bytes, within tune's default budget."""
    try:
        space = search_space(live.config, capabilities, set(), gpu_memory_bytes=gpu_total)
        outcome = control.backend.tune(
            live.config,
            space,
            control.hooks(live),
            trial_steps=DEFAULT_TRIAL_STEPS,
            budget_s=60 * DEFAULT_BUDGET_MINUTES,
            on_trial=lambda trial, progress: control.post(
                TuneTrialDone(trial.name, trial.status, trial.samples_per_second, progress)
            ),
            on_round=lambda center, reason: control.post(TuneRoundOrdered(center.index, reason)) if reason else None,
        )
    except Exception as error:  # the dashboard must survive any failure of a search
        control.post(TuneFinished(None, None, f"{type(error).__name__}: {error}"))
        return
    best = outcome.best
    if best is None:
        control.post(TuneFinished(None, None, f"no trial trained ({outcome.stop_reason})"))
        return
    summary = (
        f"{counted(len(outcome.trials), 'trial')}, {len(outcome.front)} on the front; best {best.name} at "
        f"{best.samples_per_second or 0:.1f} samples/s: {run_command(best.config)}"
    )
    control.post(TuneFinished(best.config, summary, None))
