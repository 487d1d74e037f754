"""The dashboard screen both dashboards share — the launching one (`LaunchDashboard`) and the watching one
(`WatchDashboard`): the keys they have in common (help, quit, history, compare, pausing the charts, redrawing), the
paint tick, and the compact layout for short terminals.

A dashboard is a `Screen`, the bottom of its app's stack: the history, compare and key pages go on top of it. The
app around it (`gpuanat.tui.shell`) is a thin shell: it builds the screen, routes the process's stop signals and the
terminal's size to it, and keeps the notifications said.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from textual.binding import Binding
from textual.screen import Screen

from gpuanat.core.measure.samples import GpuSample
from gpuanat.core.store.history import RENAME_DEADLINE_S, Deleted, HistoryStore
from gpuanat.core.store.history_errors import HistoryError, write_with_backoff
from gpuanat.core.store.history_listing import listed_runs
from gpuanat.tui.screens.compare import CompareScreen
from gpuanat.tui.screens.history import HistoryScreen
from gpuanat.tui.screens.keys import KeysScreen, key_rows
from gpuanat.tui.screens.modules import ModulesScreen, ModulesShown, shown_of_result
from gpuanat.tui.widgets.failure_line import FailureLine
from gpuanat.tui.widgets.gpu_activity import GpuActivity, GpuActivityLine, has_activity
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
    Binding("b", "modules", "Memory by module", id="modules", show=False),
    Binding("enter", "compare", "Compare", id="compare", show=False),
    Binding("space", "pause", "Pause charts", id="pause", show=False),
    Binding("z", "zoom", "Zoom: whole run", id="zoom"),
    Binding("ctrl+l", "redraw", "Redraw the whole screen", id="redraw", show=False, priority=True),
]
"""Keys of both dashboards (launching and watching), with the actions below."""
COMPACT_BELOW_ROWS = 34
"""Shorter terminals (80×24 over SSH) get the compact layout (the screen's `-compact` class)."""


ACTIVITY_REPAINT_INTERVAL_S = 1.0
"""The activity rows' figures change at most this often (sampler time), as the charts repaint: at 4 Hz the power's
watts moved at every sample and repainted the row (6 KB/s to the terminal on the H100 x2, benchmarks/results/
h100x2/watch_cost/)."""


class DashboardScreen(Screen[None]):
    """The charts, the memory bar and the GPU lanes of a dashboard, and the keys both dashboards have."""

    def __init__(self, *, db_path: Path) -> None:
        super().__init__()
        self.db_path = db_path
        self.compare_selection: list[int] = []
        """Runs picked in the history pane for the compare view (enter)."""
        self.charts_paused = False
        self.charts_whole_run = False
        """Whether the live charts show the whole run (`z`), or the recent minutes (`chart_span`)."""
        self._activity_shown: tuple[float | None, Any] = (None, None)
        """(sampler time, what changes the row's shape: its GPUs, throttle reasons, GPM's reason) last shown."""

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
    def status_line(self) -> StatusLine:
        return self.query_one(StatusLine)

    @cached_property
    def activity_line(self) -> GpuActivityLine:
        return self.query_one(GpuActivityLine)

    def show_activity(self, readings: Sequence[GpuSample | Mapping[str, Any]], t_s: float | None) -> None:
        """How busy these GPUs really are, one row each (`GpuActivityLine`); the compact layout keeps the first (rank
        0's: the lanes below say each GPU's utilization). Readings of a trace without GPM and clocks show no row.
        `t_s`, the readings' sampler time: the figures change at most once every `ACTIVITY_REPAINT_INTERVAL_S` of it
        (GPM reads once a second; power and clocks move at every sample), a throttle reason or a GPU at once."""
        shown = [reading for reading in readings if has_activity(reading)]
        activities = [GpuActivity.of(reading) for reading in shown[: 1 if self.compact else None]]
        shape = tuple((a.index, a.clocks_event_reasons, a.gpm_unavailable) for a in activities)
        last_t_s, last_shape = self._activity_shown
        if (
            shape == last_shape
            and t_s is not None
            and last_t_s is not None
            and t_s - last_t_s < ACTIVITY_REPAINT_INTERVAL_S
        ):
            return
        self._activity_shown = (t_s, shape)
        self.activity_line.show(activities)

    @cached_property
    def failure_line(self) -> FailureLine:
        return self.query_one(FailureLine)

    # --- hooks of the dashboards -------------------------------------------------------------------
    def stop_and_quit(self) -> None:
        """Quit without asking, after stopping and recording whatever is in progress."""
        self.app.exit()

    def finish_recording(self, timeout_s: float) -> None:
        """Block (off the event loop) until what is in progress has been recorded, at most `timeout_s`."""

    def paint(self) -> None:
        """Move what the threads delivered into the widgets (the dashboard's paint tick)."""

    def _layout_changed(self, compact: bool) -> None:
        """What the dashboard's own widgets do beyond the `-compact` class."""

    def modules_shown(self) -> ModulesShown:
        """What the memory-by-module view (`b`) shows of the dashboard's run."""
        raise NotImplementedError

    def _start_paint_tick(self, interval_s: float) -> None:
        """Paint every `interval_s` while the app runs. Once shutdown begins its screens are taken down
        before its timers stop, so a tick then would find no widgets."""

        def tick() -> None:
            if self.app.is_running:
                self.paint()

        self.set_interval(interval_s, tick)

    # --- layout ------------------------------------------------------------------------------------
    def fit_layout(self, rows: int) -> None:
        """The layout for a terminal of `rows` rows: compact below `COMPACT_BELOW_ROWS` (also while a dialog or the
        history is on top as the terminal resizes)."""
        compact = rows < COMPACT_BELOW_ROWS
        if compact != self.has_class("-compact"):
            self.set_class(compact, "-compact")
            self.failure_line.max_rows = 2 if compact else 3
            self._layout_changed(compact)
            self._fit_memory_legend()

    @property
    def compact(self) -> bool:
        """Whether the dashboard has the compact layout of short terminals."""
        return self.has_class("-compact")

    def _show_lanes(self, lanes: list[Lane]) -> None:
        """One lane per GPU of a run on several; in the compact layout the memory bar then drops its legend, so that
        eight lanes fit at 80×24 (each lane says its GPU's memory, and the bar rank 0's)."""
        self._gpu_lanes.update_lanes(lanes)
        self._fit_memory_legend()

    def _fit_memory_legend(self) -> None:
        several = len(self._gpu_lanes.lanes) > 1
        self._memory_bar.show_legend(not (several and self.compact))

    # --- actions -----------------------------------------------------------------------------------
    def action_quit(self) -> None:
        self.app.exit()

    def action_toggle_timeline(self) -> None:
        """The memory and utilization charts, or in their place the anatomy timeline: the bands over the last steps."""
        # The class goes to the screen on top: a pane over the dashboard takes it, the dashboard keeps its view.
        screen = self.app.screen
        screen.toggle_class("-timeline")
        shown = screen.has_class("-timeline")
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

    def action_zoom(self) -> None:
        """The live charts between the recent minutes and the whole run (each column's min..max), at once."""
        self.charts_whole_run = not self.charts_whole_run
        self.paint()
        self.notify("Charts: the whole run (z: recent)." if self.charts_whole_run else "Charts: recent.", timeout=2)

    def action_redraw(self) -> None:
        """Draw every cell again, as ctrl+l does in a shell: a terminal that lost what it showed (a garbled SSH
        session, a browser tab that attaches to `gpuanat serve`'s dashboard) gets all of it."""
        self.app.refresh(repaint=True, layout=True)

    def action_modules(self) -> None:
        """Memory by module: of the run under the history's cursor while the history is open, else of the dashboard's
        run (following it while open); again: closed."""
        top = self.app.screen
        if isinstance(top, ModulesScreen):
            top.dismiss()
            return
        if isinstance(top, HistoryScreen):
            run_id = top.cursor_run_id
            try:
                run = None if run_id is None else self._whole_run(run_id)
            except HistoryError as error:
                self.notify(str(error), severity="error")
                return
            if run is None:
                self.notify("No run in the history yet.", timeout=3)
                return
            self.app.push_screen(ModulesScreen(shown_of_result(run.result, run.id), follows_dashboard=False))
            return
        self.app.push_screen(ModulesScreen(self.modules_shown(), follows_dashboard=True))

    def paint_modules(self) -> None:
        """The memory-by-module view, while open on the dashboard's run, up to date (at the paint tick)."""
        top = self.app.screen
        if isinstance(top, ModulesScreen) and top.follows_dashboard:
            top.show(self.modules_shown())

    def action_help(self) -> None:
        """gpuanat's key page: every key in use, grouped, each technique with what it does."""
        self.app.push_screen(KeysScreen(key_rows(self.app)))

    def _runs(self) -> list[Any]:
        with HistoryStore(self.db_path, read_only=True) as store:
            return listed_runs(store)  # what the table shows of each run: ten thousand runs read in a blink

    def _whole_run(self, run_id: int) -> Any:
        """Run `run_id` read whole (the history screen's rows hold only what the table shows); None: not there."""
        with HistoryStore(self.db_path, read_only=True) as store:
            return store.run(run_id)

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
        self.app.push_screen(
            HistoryScreen(runs, rename=self._rename_run, tag=self._tag_runs, delete=self._delete_runs), chosen
        )

    def _rename_run(self, run_id: int, name: str | None) -> bool:
        """The history pane's `n`: the run's new name saved, retried while the history is busy (a worker thread
        calls it). False when the run is not there."""
        with HistoryStore(self.db_path) as store:
            return write_with_backoff(lambda: store.set_name(run_id, name), deadline_s=RENAME_DEADLINE_S)

    def _tag_runs(self, run_ids: list[int], tag: str) -> int:
        """The history pane's `t`, retried while the history is busy (a worker thread calls it)."""
        with HistoryStore(self.db_path) as store:
            return write_with_backoff(lambda: store.tag_runs(run_ids, tag), deadline_s=RENAME_DEADLINE_S)

    def _delete_runs(self, run_ids: list[int]) -> Deleted:
        """The history pane's `d`, once answered yes, retried while the history is busy (a worker thread calls it)."""
        with HistoryStore(self.db_path) as store:
            return write_with_backoff(lambda: store.delete_runs(run_ids), deadline_s=RENAME_DEADLINE_S)

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
        self.app.push_screen(CompareScreen([run for run in runs if run is not None], steps, samples))
