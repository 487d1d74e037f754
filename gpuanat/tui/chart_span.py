"""What span of a run the dashboards' live charts show: the recent minutes, or the whole run (`z` toggles).

A run watched for days would squeeze its last hour into a few columns: by default the charts show the last
`RECENT_WINDOW_S` (at full rate, from each series' ring of recent samples) once the run is longer than that, and the
whole run — each column's min..max from the series' bounded whole-run summary, so a peak hours ago stays in
sight — when the user zooms out. A run shorter than the recent window is shown whole either way, as it always was.
The title says which ("last 5 min" / "whole run, 72h00m"); the x-axis says the time since the run's first sample.

The recent window moves on in steps of `RECENT_STEP_S`, not at every sample: between steps only the newest
columns change, and a chart over SSH sends only those (issue #18's bytes to the terminal).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from gpuanat.tui.series import TimeSeries
from gpuanat.tui.widgets.line_chart import LineChart, format_duration

RECENT_WINDOW_S = 300.0
"""The recent view: the last 5 minutes (1,200 samples at 4 Hz, within each series' ring of recent samples)."""
RECENT_STEP_S = 60.0
"""The recent window's start moves on by this much at a time: it shows between 5 and 6 minutes."""


@dataclass(frozen=True)
class ChartSpan:
    """What the charts that share the time axis are set to."""

    window: tuple[float, float] | None
    whole_run: bool
    """Draw each column's min..max (`LineChart.whole_run`)."""
    view: str
    """Said after each chart's title."""
    origin_s: float | None
    """The run's first sample: the x-axis counts from it."""


def chart_span(
    series: Iterable[TimeSeries], whole_run: bool, short_run_window: tuple[float, float] | None
) -> ChartSpan:
    """The span to show of `series` (one time axis); `short_run_window`: the window of a run shorter than the recent
    view, as the dashboard showed it before there were views (None: each chart spans its own data)."""
    shown = [one for one in series if one.first_t_s is not None and one.last_t_s is not None]
    if not shown:
        return ChartSpan(short_run_window, False, "", None)
    first_s = min(one.first_t_s for one in shown if one.first_t_s is not None)
    last_s = max(one.last_t_s for one in shown if one.last_t_s is not None)
    run_s = last_s - first_s
    if whole_run:
        return ChartSpan((first_s, last_s), True, f"whole run, {format_duration(run_s)}", first_s)
    if run_s <= RECENT_WINDOW_S:
        return ChartSpan(short_run_window, False, "", None)
    steps = math.floor((run_s - RECENT_WINDOW_S) / RECENT_STEP_S)
    start_s = first_s + steps * RECENT_STEP_S
    return ChartSpan((start_s, last_s), False, f"last {RECENT_WINDOW_S / 60:.0f} min", first_s)


def show_span(charts: Iterable[LineChart], span: ChartSpan) -> None:
    """Set the charts on the dashboards' one time axis to `span` (a chart by step keeps its own axis)."""
    for chart in charts:
        if chart.shares_time_axis:
            chart.window = span.window
            chart.whole_run = span.whole_run
            chart.axis_origin_s = span.origin_s
            chart.view = span.view
