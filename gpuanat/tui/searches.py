"""The launching dashboard's searches of short real runs: f fits (the largest batch that trains, from the predicted
one), T tunes (the fastest set of techniques that fits).

A key starts one as it starts a run (`RunActions`), on the `RunControl`'s thread: `fit_search` and `tune_search` are
its bodies. They run their trials one after the other, each a recorded run whose events reach the app's inbox, and
report their progress and their outcome as messages (`gpuanat.tui.messages`); they stop, keeping what they found,
when the search's `LiveRun.stop_requested` is set. `SearchActions` says each trial's outcome as it comes, and makes
what the search found the configured run.

A mixin, as `RunActions` is, because Textual calls a key's action and a message's handler by name on the App.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.memory.allocation_templates import largest_batch
from gpuanat.core.memory.predict import unreadable_model_reason
from gpuanat.core.run.fit import fit_unsupported_reason, run_fit
from gpuanat.core.run.tune.runs import run_command
from gpuanat.core.run.tune.search import DEFAULT_BUDGET_MINUTES, DEFAULT_TRIAL_STEPS, run_tune
from gpuanat.core.run.tune.space import search_space
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import Capabilities
from gpuanat.tui.messages import FitFinished, FitStarting, FitTrialDone, TuneFinished, TuneTrialDone
from gpuanat.tui.run_actions import RunActions
from gpuanat.tui.run_control import RunControl
from gpuanat.tui.technique_actions import TechniqueActions
from gpuanat.tui.widgets.line_chart import format_duration

FIT_TRIAL_STEPS = 3
FIT_MAX_BATCH = 1024


def fit_search(control: RunControl, live: LiveRun, gpu_total: int | None) -> None:
    """The largest batch that trains, from the predicted largest batch on a GPU of `gpu_total` bytes."""
    try:
        predicted = (
            largest_batch(live.config, gpu_total)
            if gpu_total and unreadable_model_reason(live.config) is None
            else None
        )  # a replay takes a second: not on the UI thread
        start = predicted.batch_size if predicted and predicted.batch_size else live.config.batch_size
        control.post(FitStarting(start, predicted.method if predicted and predicted.batch_size else None))
        with HistoryStore(control.db_path) as store:
            fit = run_fit(
                live.config,
                store=store,
                log_dir=control.db_path.parent / "logs",
                start=start,
                trial_steps=FIT_TRIAL_STEPS,
                max_batch=FIT_MAX_BATCH,
                on_trial=lambda batch_size, result: control.post(FitTrialDone(batch_size, str(result.status))),
                on_event=control.on_event,
                **control.run_options(),
                stop_requested=live.stop_requested,
                on_start=control.started,
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
        with HistoryStore(control.db_path) as store:
            outcome = run_tune(
                live.config,
                space,
                store=store,
                log_dir=control.db_path.parent / "logs",
                trial_steps=DEFAULT_TRIAL_STEPS,
                budget_s=60 * DEFAULT_BUDGET_MINUTES,
                stop=live.stop_requested,
                on_trial=lambda trial, progress: control.post(
                    TuneTrialDone(trial.name, trial.status, trial.samples_per_second, progress.estimated_left_s)
                ),
                on_event=control.on_event,
                **control.run_options(),
                stop_requested=live.stop_requested,
                on_start=control.started,
            )
    except Exception as error:  # the dashboard must survive any failure of a search
        control.post(TuneFinished(None, None, f"{type(error).__name__}: {error}"))
        return
    best = outcome.best
    if best is None:
        control.post(TuneFinished(None, None, f"no trial trained ({outcome.stop_reason})"))
        return
    summary = (
        f"{len(outcome.trials)} trials, {len(outcome.front)} on the front; best {best.name} at "
        f"{best.samples_per_second or 0:.1f} samples/s: {run_command(best.config)}"
    )
    control.post(TuneFinished(best.config, summary, None))


class SearchActions(RunActions, TechniqueActions):
    """Mixed into the App that has a `_sampler` and a `_gpu_total_bytes()`: a search starts as a run does, and what it
    finds changes the configured run as a technique key does."""

    _sampler: Sampler | None

    def _gpu_total_bytes(self) -> int | None:
        """The memory of the GPU the dashboard shows, where known."""

    def action_fit(self) -> None:
        if not self._can_start():
            return
        cannot_fit = fit_unsupported_reason(self.config)
        if cannot_fit is not None:
            self.notify(cannot_fit, severity="error", timeout=10)
            return
        self._start_search(fit_search, "gpuanat-fit")

    def action_tune(self) -> None:
        if not self._can_start():
            return
        if self.capabilities is None:
            self.notify(
                "tune waits for the capability probe (a few seconds after start); press T again then.",
                severity="warning",
            )
            return
        self.notify(
            f"tune: short real runs of {DEFAULT_TRIAL_STEPS} steps, at most "
            f"{format_duration(60 * DEFAULT_BUDGET_MINUTES)}; s stops and keeps the best found so far",
            timeout=6,
        )
        self._start_search(tune_search, "gpuanat-tune", self.capabilities)

    def _start_search(self, search: Callable[..., None], thread_name: str, *args: Any) -> None:
        """A search of real trial runs (fit, tune) on a thread of its own: `search(control, live, gpu_total, *args)`."""
        gpu_total = self._gpu_total_bytes() if self.config.device == "cuda" else None
        self.live = LiveRun(config=self.config, stop_requested=threading.Event())
        for name in ("run_used", "throughput", "host_rss", "host_cpu"):
            self.series[name].clear()
        self._run_control.start_search(search, thread_name, self.live, gpu_total, *args)

    def on_tune_trial_done(self, message: TuneTrialDone) -> None:
        self._untrack_trial()
        rate = f", {message.samples_per_second:.1f} samples/s" if message.samples_per_second else ""
        self.notify(f"{message.name}: {message.status}{rate} · about {format_duration(message.left_s)} left", timeout=6)

    def on_tune_finished(self, message: TuneFinished) -> None:
        self._end_search()
        if message.best is None:
            self.notify(f"tune: {message.failure}", severity="warning", timeout=10)
        else:
            base = self.config
            self._change_config(
                message.best.replace(samples=base.samples, epochs=base.epochs, max_steps=base.max_steps)
            )
            self.notify(f"tune: {message.summary}. It is the current set now (r runs it).", timeout=15)
        self._after_search()

    def on_fit_starting(self, message: FitStarting) -> None:
        source = {"replay": " (the prediction, replayed)", "model": " (the prediction)"}.get(message.method or "", "")
        self.notify(f"fit: trials of {FIT_TRIAL_STEPS} steps from batch {message.batch_size}{source}", timeout=4)

    def _untrack_trial(self) -> None:
        """A search's trial ended: its process is not the run's to sample any more (the next trial's comes)."""
        if self.live is not None and self.live.pid is not None and self._sampler is not None:
            self._sampler.untrack(self.live.pid)

    def _end_search(self) -> None:
        """Before a search's (fit's, tune's) outcome is shown: its last events painted, no run live."""
        self.paint()
        self.live = None

    def _after_search(self) -> None:
        self._show_techniques()
        if self._quit_after_run:
            self.exit()

    def on_fit_trial_done(self, message: FitTrialDone) -> None:
        self._untrack_trial()
        outcome = {"ok": "trains", "oom": "out of memory"}.get(message.status, message.status)
        self.notify(f"fit: batch {message.batch_size} {outcome}", timeout=4)

    def on_fit_finished(self, message: FitFinished) -> None:
        self._end_search()
        if message.failure is not None or not message.largest_batch_size:
            self.notify(f"fit stopped: {message.failure or 'not even batch 1 trains'}", severity="warning", timeout=8)
        else:
            self._change_config(self.config.replace(batch_size=message.largest_batch_size))
            self.notify(
                f"fit: the largest batch that trains is {message.largest_batch_size}; it is the batch size now",
                timeout=8,
            )
        self._after_search()
