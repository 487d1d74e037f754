"""The launching dashboard's run keys and a run's life: r runs the configured run, s stops the run in progress
(asking first), q quits (stopping and recording the run first, asking while it is live); a run's start and end, as
its worker reports them (`RunStarted`, `RunFinished`).

The run itself is the `RunBackend`'s, in `RunControl`'s run worker; here the dashboard follows it (`follow_run`) and
shows how it ended. A run always ends with a `RunFinished`, also when it fails, so the dashboard is never left with a
run in progress that is not.
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.measure.startup import REQUESTED
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.validation import machine_unsupported_reason, validate_values
from gpuanat.tui.messages import RunFinished, RunStarted
from gpuanat.tui.screens.confirm import ConfirmScreen

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel

    from gpuanat.tui.screens.launch import LaunchDashboard


class RunKeys:
    """r, s and q, and what happens as a run starts and ends."""

    def __init__(self, dashboard: LaunchDashboard) -> None:
        self._dashboard = dashboard
        self.quit_after_run = False
        """q was answered yes (or a stop signal came) while a run was live: the dashboard leaves once it ends."""
        self._stop_dialog: ConfirmScreen | None = None
        """The "Stop run N?" question while it is open."""

    def can_start(self) -> bool:
        """Whether a run (or search) may start now; says why not."""
        dashboard = self._dashboard
        if dashboard.run_in_progress is not None:
            dashboard.notify("A run is in progress; stop it with s first.", severity="warning")
            return False
        try:
            validate_values(dashboard.config)
        except ConfigError as error:
            dashboard.notify(str(error), severity="error")
            return False
        if dashboard.capabilities is not None:
            unsupported = machine_unsupported_reason(dashboard.config, dashboard.capabilities)
            if unsupported is not None:
                dashboard.notify(f"{unsupported[0]}: {unsupported[1]}", severity="error")
                return False
        return True

    def run(self) -> None:
        """r: run the configured run."""
        dashboard = self._dashboard
        if not self.can_start():
            return
        live = LiveRun(config=dashboard.config, stop_requested=threading.Event())
        live.parent_points[REQUESTED] = time.monotonic()
        dashboard.follow_run(live)
        dashboard.painter.start_up_begins()
        dashboard.live_charts.clear_run()
        dashboard.run_control.start_run(live)
        dashboard.paint()

    def stop(self) -> None:
        """s: stop the run in progress, once the question is answered yes."""
        dashboard = self._dashboard
        live = dashboard.run_in_progress
        if live is None:
            dashboard.notify("No run in progress.")
            return

        def answered(stop: bool | None) -> None:
            self._stop_dialog = None
            if stop:
                live.stop_requested.set()

        self._stop_dialog = ConfirmScreen(f"Stop run {live.run_id or ''} ({live.config.techniques_summary()})?")
        dashboard.app.push_screen(self._stop_dialog, answered)

    def quit(self) -> None:
        """q: leave; while a run is live, ask, then stop and record it first."""
        dashboard = self._dashboard
        live = dashboard.run_in_progress
        if live is None:
            dashboard.app.exit()
            return

        def answered(quit_now: bool | None) -> None:
            if quit_now:
                if dashboard.run_in_progress is None:  # the run ended while the question was open
                    dashboard.app.exit()
                    return
                self.quit_after_run = True
                live.stop_requested.set()

        dashboard.app.push_screen(ConfirmScreen("A run is in progress. Stop it and quit?"), answered)

    def stop_and_quit(self) -> None:
        """Leave without asking, after the run in progress (if any) is stopped and recorded."""
        live = self._dashboard.run_in_progress
        if live is None:
            self._dashboard.app.exit()
            return
        self.quit_after_run = True
        live.stop_requested.set()

    def leave_if_quitting(self) -> None:
        """A run or search has ended: the dashboard leaves if q (or a stop signal) asked it to."""
        if self.quit_after_run:
            self._dashboard.app.exit()

    # --- what the run's worker reports -------------------------------------------------------------
    def started(self, message: RunStarted) -> None:
        """The run's (or a search's trial's) training process runs: its samples and its log are followed."""
        dashboard = self._dashboard
        live = dashboard.run_in_progress
        if live is None:
            return
        live.observe_start(message.run_id, message.pid, message.gpu_indices)
        if "spawned" in live.parent_points:  # a search's next trial: its start-up begins now
            live.parent_points[REQUESTED] = time.monotonic()
            dashboard.painter.start_up_begins()
        live.parent_points["spawned"] = time.monotonic()
        dashboard.live_charts.run_started()
        if dashboard.sampler is not None:
            dashboard.sampler.track(message.pid)
        dashboard.log_pane.follow(message.log_path)
        if message.start_note is not None:
            dashboard.log_pane.note(f"gpuanat · {message.start_note}")
        dashboard.painter.process_started()

    def finished(self, message: RunFinished) -> None:
        """The run has ended and been recorded (or could not be): its result shown, the next process prepared."""
        dashboard = self._dashboard
        if self._stop_dialog is not None and self._stop_dialog in dashboard.app.screen_stack:
            self._stop_dialog.dismiss(False)  # the run it asked about has ended: the question is moot
        dashboard.paint()  # the run's last events and samples
        live = dashboard.forget_run()
        if live is not None and live.pid is not None and dashboard.sampler is not None:
            dashboard.sampler.untrack(live.pid)
        dashboard.run_control.prepare_worker(dashboard.config)  # for the configuration chosen meanwhile
        result = message.result
        if result is None:
            dashboard.notify(f"The run could not be recorded: {message.failure}", severity="error", timeout=10)
        else:
            dashboard.last_result = result
            status = result.status
            steady = result.steady_samples_per_second
            detail = f", steady {steady:.1f} samples/s" if steady else ""
            severity: SeverityLevel = "information" if status == "ok" else "warning" if status == "stopped" else "error"
            dashboard.notify(f"Run {result.run_id}: {status}{detail}", severity=severity, timeout=6)
            if result.history_error:
                dashboard.notify(result.history_error, severity="warning", timeout=15)
            dashboard.painter.show_result(result)
        dashboard.painter.show_techniques()
        self.leave_if_quitting()
