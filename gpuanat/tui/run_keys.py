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
from collections.abc import Callable
from typing import TYPE_CHECKING

from textual.binding import Binding

from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.measure.startup import REQUESTED
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.validation import machine_unsupported_reason, validate_values
from gpuanat.tui.messages import RunFinished, RunStarted
from gpuanat.tui.screens.confirm import ConfirmScreen, QuitQuestion
from gpuanat.tui.widgets.failure_line import out_of_memory_sentence

QUIT_BINDING_IDS = ("quit", "quit_ctrl_c")
"""The dashboard's bindings that quit (`gpuanat.tui.screens.dashboard.FIRST_BINDINGS`), in the order the quit question
names their keys."""

if TYPE_CHECKING:
    from textual.notifications import SeverityLevel

    from gpuanat.tui.screens.launch import LaunchDashboard


class RunKeys:
    """r, s and q, and what happens as a run starts and ends."""

    def __init__(self, dashboard: LaunchDashboard) -> None:
        self._dashboard = dashboard
        self.quit_after_run = False
        """q was answered yes (or a stop signal came) while a run was live: the dashboard leaves once it ends."""
        self._question: ConfirmScreen | None = None
        """The question about the run in progress ("Stop run N?" or "Stop it and quit?") while it is open: one at a
        time, since a question stacked on another freezes the dashboard beneath both (Textual repaints a change of the
        bottom screen through the top one only, and the middle one shows its own stale copy of it)."""
        self._question_quits = False
        """Whether the open question is the quit question (q or ctrl+c again answers it yes)."""

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
        if self._question_open():
            return  # the question on screen already asks about this run

        def answered(stop: bool | None) -> None:
            if stop:
                live.stop_requested.set()

        self._ask(f"Stop run {live.run_id or ''} ({live.config.techniques_summary()})?", answered, quits=False)

    def quit(self) -> None:
        """q (or ctrl+c): leave; while a run is live, ask, then stop and record it first. Pressed again while the
        question is open, it answers yes (q through the question's own binding, ctrl+c, a priority binding, here);
        ctrl+c pressed while the stop question is open asks this instead."""
        dashboard = self._dashboard
        live = dashboard.run_in_progress
        if live is None:
            dashboard.app.exit()
            return
        if self._question_open():
            if self._question_quits:
                self._answer(True)
                return
            self._answer(False)

        def answered(quit_now: bool | None) -> None:
            if quit_now:
                if dashboard.run_in_progress is None:  # the run ended while the question was open
                    dashboard.app.exit()
                    return
                self.quit_after_run = True
                live.stop_requested.set()

        again = " or ".join(self._quit_keys()) or "q"
        self._ask(f"A run is in progress. Stop it and quit? ({again} again: yes)", answered, quits=True)

    def _ask(self, question: str, answered: Callable[[bool | None], None], *, quits: bool) -> None:
        screen = QuitQuestion(question) if quits else ConfirmScreen(question)

        def closed(answer: bool | None) -> None:
            if self._question is screen:
                self._question = None
            answered(answer)

        self._question, self._question_quits = screen, quits
        self._dashboard.app.push_screen(screen, closed)

    def _question_open(self) -> bool:
        return self._question is not None and self._question in self._dashboard.app.screen_stack

    def _answer(self, answer: bool) -> None:
        """Close the open question (and what was opened over it) as if `answer` had been given."""
        question, self._question = self._question, None
        if question is not None and question in self._dashboard.app.screen_stack:
            question.pop_until_active()
            question.dismiss(answer)

    def _quit_keys(self) -> list[str]:
        """The keys that quit, as the footer and the key page show them (remapped ones as remapped)."""
        app = self._dashboard.app
        quitting = [(key, active.binding) for key, active in app.active_bindings.items()]
        return [
            app.get_key_display(Binding(key, binding.action))
            for binding_id in QUIT_BINDING_IDS
            for key, binding in quitting
            if binding.id == binding_id
        ]

    def run_ended(self) -> None:
        """A run or search has ended: a question about it is moot, and goes away."""
        self._answer(False)

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
        self.run_ended()
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
            if result.out_of_memory:
                detail = f" — {out_of_memory_sentence(result.out_of_memory)}"
            severity: SeverityLevel = "information" if status == "ok" else "warning" if status == "stopped" else "error"
            dashboard.notify(
                f"Run {result.run_id}: {status}{detail}", severity=severity, timeout=12 if result.out_of_memory else 6
            )
            if result.history_error:
                dashboard.notify(result.history_error, severity="warning", timeout=15)
            dashboard.painter.show_result(result)
        dashboard.painter.show_techniques()
        self.leave_if_quitting()
