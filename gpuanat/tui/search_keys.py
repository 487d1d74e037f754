"""The launching dashboard's search keys: f fits (the largest batch that trains), T tunes (the fastest set of
techniques that fits), and what their workers report as they go (`gpuanat.tui.messages`: a trial done, the
outcome).

A search starts as a run does, in `RunControl`'s run worker, with `gpuanat.tui.searches`' bodies; s stops it and q
quits after it, as for a run (`RunKeys`). Its outcome becomes the configured run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.run.fit import fit_unsupported_reason
from gpuanat.core.run.tune.search import DEFAULT_BUDGET_MINUTES, DEFAULT_TRIAL_STEPS
from gpuanat.tui.messages import (
    FitFinished,
    FitStarting,
    FitTrialDone,
    TuneFinished,
    TuneRoundOrdered,
    TuneTrialDone,
)
from gpuanat.tui.searches import FIT_TRIAL_STEPS, fit_search, tune_search
from gpuanat.tui.widgets.line_chart import format_duration

if TYPE_CHECKING:
    from gpuanat.tui.run_keys import RunKeys
    from gpuanat.tui.screens.launch import LaunchDashboard


class SearchKeys:
    """f and T, and what their searches report."""

    def __init__(self, dashboard: LaunchDashboard, run_keys: RunKeys) -> None:
        self._dashboard = dashboard
        self._run_keys = run_keys

    def fit(self) -> None:
        """f: the largest batch that trains, from the predicted one, by short real runs."""
        dashboard = self._dashboard
        if not self._run_keys.can_start():
            return
        cannot_fit = fit_unsupported_reason(dashboard.config)
        if cannot_fit is not None:
            dashboard.notify(cannot_fit, severity="error", timeout=10)
            return
        self._start(fit_search, "gpuanat-fit")

    def tune(self) -> None:
        """T: the fastest set of techniques that fits, by short real runs within tune's default budget."""
        dashboard = self._dashboard
        if not self._run_keys.can_start():
            return
        if dashboard.capabilities is None:
            dashboard.notify(
                "tune waits for the capability probe (a few seconds after start); press T again then.",
                severity="warning",
            )
            return
        dashboard.notify(
            f"tune: short real runs of {DEFAULT_TRIAL_STEPS} steps, at most "
            f"{format_duration(60 * DEFAULT_BUDGET_MINUTES)}; s stops and keeps the best found so far",
            timeout=6,
        )
        self._start(tune_search, "gpuanat-tune", dashboard.capabilities)

    def _start(self, search: Callable[..., None], name: str, *args: Any) -> None:
        """A search of real trial runs in the run worker: `search(control, live, gpu_total, *args)`."""
        dashboard = self._dashboard
        gpu_total = dashboard.painter.gpu_total_bytes() if dashboard.config.device == "cuda" else None
        live = LiveRun(config=dashboard.config, stop_requested=threading.Event())
        dashboard.follow_run(live)
        dashboard.live_charts.clear_run()
        dashboard.run_control.start_search(search, name, live, gpu_total, *args)

    # --- what the searches report ------------------------------------------------------------------
    def fit_starting(self, message: FitStarting) -> None:
        source = {
            "replay": " (the prediction, replayed)",
            "model": " (the prediction)",
            "eager": " (eager's prediction: the whole model compiled is not predicted, no bound)",
        }.get(message.method or "", "")
        self._dashboard.notify(
            f"fit: trials of {FIT_TRIAL_STEPS} steps from batch {message.batch_size}{source}", timeout=4
        )

    def fit_trial_done(self, message: FitTrialDone) -> None:
        self._untrack_trial()
        outcome = {"ok": "trains", "oom": "out of memory"}.get(message.status, message.status)
        self._dashboard.notify(f"fit: batch {message.batch_size} {outcome}", timeout=4)

    def fit_finished(self, message: FitFinished) -> None:
        dashboard = self._dashboard
        self._end()
        if message.failure is not None or not message.largest_batch_size:
            failure = message.failure or "not even batch 1 trains"
            dashboard.notify(f"fit stopped: {failure}", severity="warning", timeout=8)
        else:
            dashboard.technique_keys.change_config(dashboard.config.replace(batch_size=message.largest_batch_size))
            dashboard.notify(
                f"fit: the largest batch that trains is {message.largest_batch_size}; it is the batch size now",
                timeout=8,
            )
        self._after()

    def tune_trial_done(self, message: TuneTrialDone) -> None:
        self._untrack_trial()
        rate = f", {message.samples_per_second:.1f} samples/s" if message.samples_per_second else ""
        self._dashboard.notify(
            f"{message.name}: {message.status}{rate} · {message.progress.left_words(format_duration)}", timeout=6
        )

    def tune_round_ordered(self, message: TuneRoundOrdered) -> None:
        self._dashboard.notify(f"tune: moves from tune {message.center}: {message.reason}", timeout=8)

    def tune_finished(self, message: TuneFinished) -> None:
        dashboard = self._dashboard
        self._end()
        if message.best is None:
            dashboard.notify(f"tune: {message.failure}", severity="warning", timeout=10)
        else:
            base = dashboard.config
            dashboard.technique_keys.change_config(
                message.best.replace(samples=base.samples, epochs=base.epochs, max_steps=base.max_steps)
            )
            dashboard.notify(f"tune: {message.summary}. It is the current set now (r runs it).", timeout=15)
        self._after()

    def _untrack_trial(self) -> None:
        """A trial ended: its process is not the search's to sample any more (the next trial's comes)."""
        live, sampler = self._dashboard.run_in_progress, self._dashboard.sampler
        if live is not None and live.pid is not None and sampler is not None:
            sampler.untrack(live.pid)

    def _end(self) -> None:
        """Before the search's outcome is shown: its last events painted, no run live, no question about it open."""
        self._run_keys.run_ended()
        self._dashboard.paint()
        self._dashboard.forget_run()

    def _after(self) -> None:
        self._dashboard.painter.show_techniques()
        self._run_keys.leave_if_quitting()
