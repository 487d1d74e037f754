"""The launching dashboard's keys for its run: r runs the configured run, s stops it, q quits (stopping it first).

A start is refused with one line while a run (or search) is in progress or the configuration cannot train here;
otherwise the run gets a fresh `LiveRun` and the `RunControl` runs it on its thread. Stopping and quitting ask first,
then set the run's `stop_requested`; the run's thread records what ran, and the app paints its end (`RunFinished`).

A mixin, as `DashboardActions` is, because Textual calls a key's action by its name on the App (`action_run`), and
the stop signals call `stop_and_quit` and `finish_recording`, hooks of `DashboardActions`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.measure.startup import REQUESTED, startup_progress
from gpuanat.core.operations.anatomy import operations_anatomy
from gpuanat.core.vocabulary.config import DEFAULT_PROFILE_OPS_STEPS, Capabilities, RunConfig
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.validation import machine_unsupported_reason, validate_values
from gpuanat.tui.dashboard_actions import DashboardActions
from gpuanat.tui.run_control import RunControl
from gpuanat.tui.screens.confirm import ConfirmScreen
from gpuanat.tui.series import TimeSeries
from gpuanat.tui.widgets.log_pane import LogPane
from gpuanat.tui.widgets.operations_panel import OperationsPanel


class RunActions(DashboardActions):
    """Mixed into the App that has the attributes below and a `paint()`."""

    config: RunConfig
    capabilities: Capabilities | None
    live: LiveRun | None
    series: dict[str, TimeSeries]
    _run_control: RunControl
    _quit_after_run: bool
    _stop_dialog: ConfirmScreen | None
    """The "Stop run N?" question while it is open."""
    operations_shown: tuple[Mapping[str, Any], int | None] | None = None
    """The operations anatomy on show and its run: the latest run's that was profiled."""

    def action_toggle_operations(self) -> None:
        """`O`: the next runs profile their operations and the panel takes the charts' place; again: off."""
        steps = 0 if self._run_control.profile_ops_steps else DEFAULT_PROFILE_OPS_STEPS
        self._run_control.profile_ops_steps = steps
        self.screen.set_class(bool(steps), "-operations")
        self._show_operations()
        self.notify(
            f"Operations anatomy: the next runs profile {steps} steps after warm-up, left out of their "
            "steady samples/s (O: off)."
            if steps
            else "Operations profiling off; the charts are back.",
            timeout=4,
        )

    def _log_startup(self, live: LiveRun) -> None:
        """Each part of the run's start-up, as it passes, in the log (the status line shows the one under way)."""
        passed, _ = startup_progress(live.startup_points, time.monotonic())
        logged = getattr(self, "_startup_parts_logged", 0)
        for part, seconds in passed[logged:]:
            self.query_one(LogPane).note(f"gpuanat · start-up: {part} {seconds:.1f} s")
        self._startup_parts_logged = max(logged, len(passed))

    def _show_live_operations(self, live: LiveRun) -> None:
        """The run in progress has been profiled: its anatomy shows at once."""
        operations = live.rank(0).operations
        if operations is not None and getattr(self, "_live_operations", None) is not operations:
            self._live_operations = operations
            self.operations_shown = (operations_anatomy(operations), live.run_id)
            self._show_operations()

    def _show_operations(self) -> None:
        anatomy, run_id = self.operations_shown or (None, None)
        steps = self._run_control.profile_ops_steps
        note = (
            f"The next run profiles {steps} steps after warm-up (O: off)."
            if steps
            else "O: profile the next run's operations."
        )
        self.query_one(OperationsPanel).show(anatomy, run_id, note)

    def action_run(self) -> None:
        if not self._can_start():
            return
        self.live = LiveRun(config=self.config, stop_requested=threading.Event())
        self.live.parent_points[REQUESTED] = time.monotonic()
        self._startup_parts_logged = 0
        for name in ("run_used", "throughput", "host_rss", "host_cpu"):
            self.series[name].clear()
        self._run_control.start_run(self.live)
        self.paint()

    def _can_start(self) -> bool:
        """Whether a run (or fit) may start now; says why not."""
        if self.live is not None:
            self.notify("A run is in progress; stop it with s first.", severity="warning")
            return False
        try:
            validate_values(self.config)
        except ConfigError as error:
            self.notify(str(error), severity="error")
            return False
        if self.capabilities is not None:
            unsupported = machine_unsupported_reason(self.config, self.capabilities)
            if unsupported is not None:
                self.notify(f"{unsupported[0]}: {unsupported[1]}", severity="error")
                return False
        return True

    def action_stop(self) -> None:
        if self.live is None:
            self.notify("No run in progress.")
            return
        live = self.live

        def answered(stop: bool | None) -> None:
            self._stop_dialog = None
            if stop:
                live.stop_requested.set()

        self._stop_dialog = ConfirmScreen(f"Stop run {live.run_id or ''} ({live.config.techniques_summary()})?")
        self.push_screen(self._stop_dialog, answered)

    def finish_recording(self, timeout_s: float) -> None:
        self._run_control.join(timeout_s)

    def stop_and_quit(self) -> None:
        if self.live is None:
            self.exit()
            return
        self._quit_after_run = True
        self.live.stop_requested.set()

    async def action_quit(self) -> None:
        if self.live is None:
            self.exit()
            return
        live = self.live

        def answered(quit_now: bool | None) -> None:
            if quit_now:
                if self.live is None:  # the run ended while the question was open
                    self.exit()
                    return
                self._quit_after_run = True
                live.stop_requested.set()

        self.push_screen(ConfirmScreen("A run is in progress. Stop it and quit?"), answered)
