"""Actions both dashboards share — the launching one (`GpuAnatApp`) and the watching one (`WatchApp`):
help, pausing the charts, the history pane, the compare view, the command palette's list of keys, and the
compact layout for short terminals."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import Iterable
from functools import cached_property
from pathlib import Path
from typing import Any

from textual import events
from textual.app import App, SystemCommand
from textual.binding import Binding
from textual.markup import escape as escape_markup
from textual.notifications import SeverityLevel
from textual.screen import Screen

from gpuanat.core.printable import printable
from gpuanat.core.run.stop_signals import STOP_SIGNALS, detach_from_terminal
from gpuanat.core.store.history import RENAME_DEADLINE_S, HistoryStore
from gpuanat.core.store.history_errors import HistoryError, write_with_backoff
from gpuanat.core.vocabulary.techniques import TECHNIQUES_BY_FIELD
from gpuanat.tui.screens.compare import CompareScreen
from gpuanat.tui.screens.history import HistoryScreen
from gpuanat.tui.screens.keys import CYCLING_ACTIONS, TECHNIQUE_ACTION, KeysScreen, key_rows
from gpuanat.tui.widgets.gpu_lanes import GpuLanes, Lane
from gpuanat.tui.widgets.line_chart import LineChart
from gpuanat.tui.widgets.memory_bar import MemoryBar
from gpuanat.tui.widgets.status_line import StatusLine

FIRST_BINDINGS = [
    Binding("question_mark", "help", "Help", id="help", key_display="?"),
    Binding("q", "quit", "Quit", id="quit"),
    Binding("ctrl+c", "quit", "Quit", id="quit_ctrl_c", show=False, priority=True),
]
"""First in both footers, so that help and quit show at any width (htop's F1 Help comes first too); ctrl+c quits as
in nvitop and htop — asking first while a run is live, like q."""
SHARED_BINDINGS = [
    Binding("h", "history", "History", id="history"),
    Binding("enter", "compare", "Compare", id="compare", show=False),
    Binding("space", "pause", "Pause charts", id="pause", show=False),
    Binding("ctrl+l", "redraw", "Redraw the whole screen", id="redraw", show=False, priority=True),
]
"""Keys of both dashboards (launching and watching), with the actions below."""
HANGUP_RECORDING_TIMEOUT_S = 60.0
"""After a hangup, how long a stopping run may take to be recorded before the dashboard leaves anyway (the
run's stop itself takes at most about 12 s; the history finalises what is left on its next open)."""
COMPACT_BELOW_ROWS = 34
"""Shorter terminals (80×24 over SSH) get the compact layout (the screen's `-compact` class)."""


def _palette_help(binding: Binding) -> str:
    """The command palette's line under a key's name: what a technique key does, else the key's own words."""
    technique = TECHNIQUE_ACTION.match(binding.action)
    field = technique.group(1) if technique else CYCLING_ACTIONS.get(binding.action)
    info = TECHNIQUES_BY_FIELD.get(field) if field else None
    return f"gpuanat · {info.help}" if info else f"gpuanat · {binding.description.lower()}"


class DashboardActions(App[None]):
    """Mixed into an App that has `db_path`, `compare_selection` and `charts_paused`."""

    db_path: Path
    compare_selection: list[int]
    charts_paused: bool
    stop_signal: int | None = None
    """The stop signal (SIGINT, SIGTERM, SIGHUP) that ended the dashboard, if one did."""

    # The dashboard's widgets are composed once: found once, not by a walk of the DOM at every paint tick.
    @cached_property
    def _charts(self) -> list[LineChart]:
        return list(self.query(LineChart))

    @cached_property
    def _charts_by_id(self) -> dict[str, LineChart]:
        return {chart.id: chart for chart in self._charts if chart.id is not None}

    @cached_property
    def _memory_bar(self) -> MemoryBar:
        return self.query_one(MemoryBar)

    @cached_property
    def _gpu_lanes(self) -> GpuLanes:
        return self.query_one(GpuLanes)

    @cached_property
    def _status_line(self) -> StatusLine:
        return self.query_one(StatusLine)

    def notify(
        self,
        message: str,
        *,
        title: str = "",
        severity: SeverityLevel = "information",
        timeout: float | None = None,
        markup: bool = False,
    ) -> None:
        """Every notification as plain text: it quotes names, paths and children's errors, which are data (their
        controls escaped, their brackets shown), and gpuanat's own words keep their brackets too. `markup` is
        Textual's signature, and ignored."""
        super().notify(
            printable(message, keep="\n"), title=printable(title), severity=severity, timeout=timeout, markup=False
        )

    def _listen_for_stop_signals(self) -> None:
        """SIGTERM, SIGHUP (the SSH connection dropped) and a SIGINT sent from outside end the dashboard as
        q does, without asking: a run in progress is stopped and recorded first. Only on the main thread, where
        the dashboard runs for real; tests drive it from theirs."""
        with contextlib.suppress(RuntimeError, ValueError):
            loop = asyncio.get_running_loop()
            for sig in STOP_SIGNALS:
                loop.add_signal_handler(sig, self._on_stop_signal, sig)

    def _forget_stop_signals(self) -> None:
        with contextlib.suppress(RuntimeError, ValueError):
            loop = asyncio.get_running_loop()
            for sig in STOP_SIGNALS:
                loop.remove_signal_handler(sig)

    def _on_stop_signal(self, signum: int) -> None:
        if self.stop_signal is not None:
            return
        self.stop_signal = signum
        if signum == signal.SIGHUP:
            detach_from_terminal()
            threading.Thread(target=self._leave_after_hangup, name="gpuanat-hangup", daemon=True).start()
        self.stop_and_quit()

    def _leave_after_hangup(self) -> None:
        """The terminal is gone, and Textual's teardown, which restores it, can wait forever on a writer that
        died with it (seen with Textual 8.2.8): once what is in progress is recorded, the process leaves."""
        self.finish_recording(HANGUP_RECORDING_TIMEOUT_S)
        os._exit(128 + signal.SIGHUP)

    def stop_and_quit(self) -> None:
        """Quit without asking, after stopping and recording whatever is in progress."""
        self.exit()

    def finish_recording(self, timeout_s: float) -> None:
        """Block (off the event loop) until what is in progress has been recorded, at most `timeout_s`."""

    def paint(self) -> None:
        """Move what the threads delivered into the widgets (the app's paint tick)."""

    def _start_paint_tick(self, interval_s: float) -> None:
        """Paint every `interval_s` while the app runs. Once shutdown begins its screens are taken down
        before its timers stop, so a tick then would find no widgets."""

        def tick() -> None:
            if self.is_running:
                self.paint()

        self.set_interval(interval_s, tick)

    def on_resize(self, event: events.Resize) -> None:
        self._fit_layout(event.size.height)

    def _fit_layout(self, rows: int) -> None:
        compact = rows < COMPACT_BELOW_ROWS
        if compact != self.dashboard_screen.has_class("-compact"):
            # On the dashboard's own screen, also when a dialog or the history is on top while the terminal resizes.
            self.dashboard_screen.set_class(compact, "-compact")
            self._layout_changed(compact)
            self._fit_memory_legend()

    @property
    def dashboard_screen(self) -> Screen[Any]:
        """The dashboard itself: the bottom of the screen stack, under any dialog or pane."""
        return self.screen_stack[0]

    @property
    def compact(self) -> bool:
        """Whether the dashboard has the compact layout of short terminals."""
        return self.dashboard_screen.has_class("-compact")

    def _layout_changed(self, compact: bool) -> None:
        """What the app's own widgets do beyond the `-compact` class."""

    def _show_lanes(self, lanes: list[Lane]) -> None:
        """One lane per GPU of a run on several; in the compact layout the memory bar then drops its legend, so that
        eight lanes fit at 80×24 (each lane says its GPU's memory, and the bar rank 0's)."""
        self._gpu_lanes.update_lanes(lanes)
        self._fit_memory_legend()

    def _fit_memory_legend(self) -> None:
        several = len(self._gpu_lanes.lanes) > 1
        self._memory_bar.show_legend(not (several and self.compact))

    def action_toggle_timeline(self) -> None:
        """The memory and utilization charts, or in their place the anatomy timeline: the bands over the last steps."""
        self.screen.toggle_class("-timeline")
        shown = self.screen.has_class("-timeline")
        self.notify(
            "Anatomy over time: each step at its peak and its end (v: the charts)."
            if shown
            else "Charts (v: the anatomy over time).",
            timeout=3,
        )

    def action_pause(self) -> None:
        self.charts_paused = not self.charts_paused
        for chart in self._charts:
            chart.paused = self.charts_paused
        self.notify("Charts paused (space resumes)." if self.charts_paused else "Charts live.", timeout=2)

    def action_redraw(self) -> None:
        """Draw every cell again, as ctrl+l does in a shell: a terminal that lost what it showed (a garbled SSH
        session, a browser tab that attaches to `gpuanat serve`'s dashboard) gets all of it."""
        self.refresh(repaint=True, layout=True)

    def action_help(self) -> None:
        """gpuanat's key page: every key in use, grouped, each technique with what it does."""
        self.push_screen(KeysScreen(key_rows(self)))

    def _runs(self) -> list[Any]:
        with HistoryStore(self.db_path, read_only=True) as store:
            return store.runs()

    def action_history(self) -> None:
        def chosen(run_ids: list[int] | None) -> None:
            if run_ids:
                self.compare_selection = run_ids
                self.action_compare()

        try:
            runs = self._runs()
        except HistoryError as error:  # an unusable history is reported, the dashboard goes on
            self.notify(str(error), severity="error")
            return
        self.push_screen(HistoryScreen(runs, rename=self._rename_run), chosen)

    def _rename_run(self, run_id: int, name: str | None) -> bool:
        """The history pane's `n`: the run's new name saved, retried while the history is busy (a worker thread
        calls it). False when the run is not there."""
        with HistoryStore(self.db_path) as store:
            return write_with_backoff(lambda: store.set_name(run_id, name), deadline_s=RENAME_DEADLINE_S)

    def action_compare(self) -> None:
        try:
            with HistoryStore(self.db_path, read_only=True) as store:
                run_ids = self.compare_selection or [run.id for run in store.runs(limit=2)]
                if len(run_ids) < 2:
                    self.notify("Compare needs two recorded runs: run twice, or pick runs in history (h).")
                    return
                runs = [store.run(run_id) for run_id in run_ids]
                steps = {run_id: store.steps(run_id) for run_id in run_ids}
                samples = {run_id: store.samples(run_id) for run_id in run_ids}
        except HistoryError as error:
            self.notify(str(error), severity="error")
            return
        self.push_screen(CompareScreen([run for run in runs if run is not None], steps, samples))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for binding in self.BINDINGS:
            if isinstance(binding, Binding) and binding.description:
                # The palette parses help as markup: escaped, "pip install 'gpuanat[llm]'" keeps its brackets.
                yield SystemCommand(
                    f"{binding.description} ({binding.key_display or binding.key})",
                    escape_markup(_palette_help(binding)),
                    lambda b=binding: self.run_action(b.action),
                )
