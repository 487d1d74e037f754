"""LineChart: named time series over a whole run, drawn as lines in braille dots with the Line API.

Layout (rows): a title line with a legend of the series and their latest values; the plot, with the
formatted maximum and zero on a y-axis label column; an x-axis line with the run's elapsed time.

Each plot cell is one braille glyph of 2 × 4 dots, so a line has twice the columns' resolution across and four
times the rows' up; each point is joined to the previous one by the dots between, so a step reads as a line, not
as scattered dots. Series are lines, not areas, so one never hides another (the compare view overlays runs); where
two share a cell, the cell takes the colour of the later series.

Cheap to repaint: rows are computed once per (size, data version, settings) and served from a cache;
`refresh_data()` rebuilds them only when a series' version changed, and repaints only the cells that changed
(`CachedRows`): a new sample that leaves the picture as it was sends nothing to the terminal. Given the paint's
time, it redraws the plot at most once per `CHART_REPAINT_INTERVAL_S` (the legend's latest values follow every
paint): over SSH the plot is most of what a dashboard sends. Colours come from COMPONENT_CLASSES.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual.reactive import reactive
from textual.strip import Strip

from gpuanat.core.printable import printable
from gpuanat.tui.series import TimeSeries
from gpuanat.tui.text_fit import fit_words
from gpuanat.tui.widgets.braille_cells import GLYPHS, draw_cells, first_difference, line_cells
from gpuanat.tui.widgets.cached_rows import CachedRows

LEGEND_SWATCH = "█"
SERIES_STYLE_COUNT = 4
"""Series i is drawn with component class `line-chart--series-{i % SERIES_STYLE_COUNT}`."""
AXIS_STEP = 1.125
"""The time axis spans the next of 1 s × AXIS_STEP**n at or above the samples' span: while the samples fill it,
each column keeps its time span, so a new sample changes only the cells of the column it lands in, instead of
stretching every column (a repaint of the whole plot, over SSH, at every sample). The samples fill 89-100% of it."""
CHART_REPAINT_INTERVAL_S = 1.0
"""The plot (and x-axis) of a chart fed at each paint is redrawn at most this often: the samples keep arriving at the
sampling rate into the series, the legend's latest values show each paint, and the plot catches up within this time,
or as soon as the samples not drawn yet span more than one column. Four times fewer plot repaints at 0.25 s sampling
(issue #18: ≤ 5 KiB/s to the terminal over SSH)."""


def axis_span_s(span_s: float) -> float:
    """The span of the time axis for samples spanning `span_s` (one function of it, so charts that share a window
    share an axis)."""
    if span_s <= 1.0:
        return 1.0 if span_s > 0 else 0.0  # one instant: bucket() shows its value across
    return AXIS_STEP ** math.ceil(math.log(span_s) / math.log(AXIS_STEP) - 1e-9)


def format_duration(seconds: float) -> str:
    """Elapsed time for the x-axis: 45s, 12m05s, 3h07m."""
    total_s = max(0, round(seconds))
    if total_s < 60:
        return f"{total_s}s"
    if total_s < 3600:
        return f"{total_s // 60}m{total_s % 60:02d}s"
    return f"{total_s // 3600}h{total_s % 3600 // 60:02d}m"


def _default_format(value: float) -> str:
    return f"{value:.3g}"


class LineChart(CachedRows):
    """Named `TimeSeries` on one shared time axis, first sample to last, with a y-axis from 0 to the max."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "line-chart--title",
        "line-chart--axis",
        "line-chart--empty",
        "line-chart--paused",
        *(f"line-chart--series-{index}" for index in range(SERIES_STYLE_COUNT)),
    }

    DEFAULT_CSS = """
    LineChart {
        height: 10;
        min-height: 3;
        & > .line-chart--title { color: $text; text-style: bold; }
        & > .line-chart--axis { color: $text-muted; }
        & > .line-chart--empty { color: $text-muted; text-style: italic; }
        & > .line-chart--paused { color: $warning; text-style: bold; }
        & > .line-chart--series-0 { color: $primary; }
        & > .line-chart--series-1 { color: $warning; }
        & > .line-chart--series-2 { color: $success; }
        & > .line-chart--series-3 { color: $error; }
        &:ansi > .line-chart--axis { color: ansi_bright_black; }
        &:ansi > .line-chart--empty { color: ansi_bright_black; }
    }
    """

    shares_time_axis: ClassVar[bool] = True
    """Whether a dashboard puts the chart on its one time axis (`window`); a chart by step does not."""

    # Not repainted whole when set: the watchers below repaint the cells that change.
    title: reactive[str] = reactive("", repaint=False)
    y_max: reactive[float | None] = reactive(None, repaint=False)
    """Fixed top of the y-axis (e.g. device total memory); None scales to the highest value shown."""
    window: reactive[tuple[float, float] | None] = reactive(None, repaint=False)
    """The time span shown, shared by the charts of one dashboard (one time axis); None spans this chart's data."""
    whole_run: reactive[bool] = reactive(False, repaint=False)
    """Draw each column's min..max of the run (`TimeSeries.envelope`) instead of a line through its values."""
    view: reactive[str] = reactive("", repaint=False)
    """The span shown, said after the title ("last 5 min", "whole run, 72h00m"); empty: nothing said."""
    axis_origin_s: reactive[float | None] = reactive(None, repaint=False)
    """The x-axis says the time since this (the run's first sample) when set, and the plot starts at the window's
    start (a view of the run's last minutes); else the axis counts from its start, which the data may move earlier."""
    paused: reactive[bool] = reactive(False, repaint=False)
    """Freeze the display on the data it showed when paused; new samples keep arriving underneath."""

    def __init__(
        self,
        title: str = "",
        *,
        y_max: float | None = None,
        formatter: Callable[[float], str] = _default_format,
        empty_message: str = "waiting for samples…",
        name: str | None = None,
        id: str | None = None,
        classes: str | None = None,
        disabled: bool = False,
    ) -> None:
        super().__init__(name=name, id=id, classes=classes, disabled=disabled)
        self.set_reactive(LineChart.title, title)
        self.set_reactive(LineChart.y_max, y_max)
        self._formatter = formatter
        self.empty_message = empty_message
        self._series: dict[str, TimeSeries] = {}
        self._frozen: dict[str, TimeSeries] | None = None
        self._formatter_version = 0
        self._plot_inputs: tuple[object, ...] | None = None
        """(window, data versions) the plot is drawn from, set when `refresh_data` finds a redraw due: new samples
        and a new window leave the plot as it is until then. None: draw from the data as it is now."""
        self._plot_drawn_s: float | None = None
        """The paint time (`refresh_data`'s `now_s`) the plot was last drawn at."""
        self._plot_cache: tuple[tuple[object, ...], list[Strip], float, float] | None = None
        """(what they depend on, the plot and x-axis rows, the newest sample's time, the time span of one column)."""
        self._drawn_cells: (
            tuple[
                tuple[object, ...], dict[int, list[float | None]], list[list[int]], list[list[int | None]], list[Strip]
            ]
            | None
        ) = None
        """(axes, values per dot column, cell bits, cell owners, rows) of the plot drawn last: a plot drawn again on
        the same axes draws only the columns whose values changed."""
        self.plot_builds = 0
        """How many times the plot rows were built (tests check the chart rate)."""

    @property
    def formatter(self) -> Callable[[float], str]:
        """Formats y values for the axis and legend, with units (bytes -> "12.3 GiB")."""
        return self._formatter

    @formatter.setter
    def formatter(self, formatter: Callable[[float], str]) -> None:
        self._formatter = formatter
        self._formatter_version += 1
        self.repaint_changes()

    @property
    def series_names(self) -> tuple[str, ...]:
        return tuple(self._series)

    def set_series(self, name: str, series: TimeSeries) -> None:
        """Show `series` under `name` (added after the others, or replacing the one of that name)."""
        self._series[name] = series
        self.refresh_data()

    def refresh_data(self, now_s: float | None = None) -> None:
        """Repaint what changed on screen if any shown series changed since the last paint; call it at the app's
        paint tick with the paint's time `now_s` (the app's clock) to redraw the plot at most once per
        `CHART_REPAINT_INTERVAL_S`, or without it to redraw it now."""
        if self.paused:
            return
        if now_s is None or self._plot_due(now_s):
            self._plot_inputs = (self.window, self._data_key(self._series))
            self._plot_drawn_s = now_s
        self.repaint_changes()

    def _plot_due(self, now_s: float) -> bool:
        """Whether the plot is to be redrawn at a paint at `now_s`: never drawn, drawn `CHART_REPAINT_INTERVAL_S`
        ago, or the samples not drawn yet span more than one column."""
        if self._plot_cache is None or self._plot_drawn_s is None:
            return True
        if now_s - self._plot_drawn_s >= CHART_REPAINT_INTERVAL_S:
            return True
        _, _, drawn_last_t_s, column_s = self._plot_cache
        last_t_s = max(
            (series.last_t_s for series in self._series.values() if series.last_t_s is not None), default=drawn_last_t_s
        )
        return last_t_s - drawn_last_t_s > column_s

    def watch_paused(self, paused: bool) -> None:
        self._frozen = {name: series.copy() for name, series in self._series.items()} if paused else None
        self.repaint_changes()

    def watch_title(self) -> None:
        self.repaint_changes()

    def watch_y_max(self) -> None:
        self.repaint_changes()

    def watch_window(self) -> None:
        self.repaint_changes()

    def watch_view(self) -> None:
        self.repaint_changes()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._plot_cache = None  # the theme changed: colours baked into the plot rows are stale
        self._drawn_cells = None

    @staticmethod
    def _data_key(series: Mapping[str, TimeSeries]) -> tuple[tuple[str, int, int], ...]:
        return tuple((name, id(one), one.version) for name, one in series.items())

    def rows_key(self) -> tuple[object, ...]:
        shown = self._frozen if self._frozen is not None else self._series
        legend = tuple((name, series.last) for name, series in shown.items())
        return (self.title, self.view, legend, self._plot_key(shown))

    def _plot_key(self, shown: Mapping[str, TimeSeries]) -> tuple[object, ...]:
        """What the plot and x-axis rows depend on besides the size: between redraws (`refresh_data`), the window
        and data they were drawn from."""
        inputs = (
            self._plot_inputs
            if self._plot_inputs is not None and self._frozen is None
            else (self.window, self._data_key(shown))
        )
        shown_as = (self.whole_run, self.axis_origin_s)
        return (self.y_max, self.paused, self.empty_message, self._formatter_version, shown_as, *inputs)

    def build_rows(self, width: int, height: int) -> list[Strip]:
        return self._build_rows(width, height, self._frozen if self._frozen is not None else self._series)

    def _style(self, component: str) -> Style:
        return self.component_style(component)

    def _series_color_style(self, index: int) -> Style:
        return self._style(f"line-chart--series-{index % SERIES_STYLE_COUNT}")

    def _finish(self, segments: list[Segment], width: int) -> Strip:
        return Strip(segments).adjust_cell_length(width, self._base_style)

    def _build_rows(self, width: int, height: int, shown: Mapping[str, TimeSeries]) -> list[Strip]:
        if width <= 0 or height <= 0:
            return []
        key = (width, height, *self._plot_key(shown))
        if self._plot_cache is None or self._plot_cache[0] != key:
            if self._frozen is None:  # kept until a redraw is due
                self._plot_inputs = (self.window, self._data_key(shown))
                key = (width, height, *self._plot_key(shown))
            plot_rows, last_t_s, column_s = self._build_plot_rows(width, height, shown)
            self._plot_cache = (key, plot_rows, last_t_s, column_s)
            self.plot_builds += 1
        return [self._title_row(width, shown), *self._plot_cache[1]]

    def _build_plot_rows(
        self, width: int, height: int, shown: Mapping[str, TimeSeries]
    ) -> tuple[list[Strip], float, float]:
        """The rows below the title, the newest sample's time and the time span of one column."""
        rows: list[Strip] = []
        plot_height = height - 2 if height >= 3 else height - 1
        with_data = {name: series for name, series in shown.items() if series}
        if not with_data:
            blank = Strip.blank(width, self._base_style)
            message = self._finish([Segment(f" {self.empty_message}", self._style("line-chart--empty"))], width)
            message_row = max(1, height // 2)
            rows.extend(message if row == message_row else blank for row in range(1, height))
            return rows, -math.inf, 0.0  # the first sample is drawn at once

        t_start_s = min(series.first_t_s for series in with_data.values() if series.first_t_s is not None)
        t_end_s = last_t_s = max(series.last_t_s for series in with_data.values() if series.last_t_s is not None)
        if self.window is not None:  # from its start when it is a view of the run (`axis_origin_s`)
            t_start_s = self.window[0] if self.axis_origin_s is not None else min(self.window[0], t_start_s)
            t_end_s = max(self.window[1], t_end_s)
        t_end_s = t_start_s + axis_span_s(t_end_s - t_start_s)
        raw_max = max(series.max for series in with_data.values() if series.max is not None)
        label_candidates = [raw_max, 0.0] if self.y_max is None else [self.y_max, 0.0]
        label_width = min(max(len(self.formatter(value)) for value in label_candidates) + 1, max(1, width // 3))
        plot_width = max(0, width - label_width - 1)

        columns_by_series = {  # two values a cell: the braille cell's two dot columns
            index: series.envelope(plot_width * 2, t_start_s, t_end_s)
            if self.whole_run
            else series.bucket(plot_width * 2, t_start_s, t_end_s)
            for index, series in enumerate(shown.values())
            if series
        }
        top = self.y_max
        if top is None:
            top = max(
                (value for columns in columns_by_series.values() for value in columns if value is not None), default=0.0
            )
        rows.extend(self._plot_rows(width, plot_height, label_width, plot_width, top, columns_by_series))
        if height >= 3:
            rows.append(self._x_axis_row(width, label_width, plot_width, *self.x_axis_labels(t_start_s, t_end_s)))
        return rows, last_t_s, (t_end_s - t_start_s) / plot_width if plot_width > 0 else math.inf

    def _title_row(self, width: int, shown: Mapping[str, TimeSeries]) -> Strip:
        title_style = self._style("line-chart--title")
        axis_style = self._style("line-chart--axis")
        paused = "  ⏸ paused" if self.paused else ""
        legend = [
            (index, printable(name), "—" if series.last is None else self.formatter(series.last))
            for index, (name, series) in enumerate(shown.items())
        ]
        names_width = sum(len(name) + 4 for _, name, _ in legend)  # "  █ name"
        values_width = sum(len(value) + 1 for _, _, value in legend)
        # Narrow charts keep the series names whole: the latest values go first, then the title's last words.
        title = printable(f"{self.title} · {self.view}" if self.view else self.title)
        with_values = 1 + len(title) + len(paused) + names_width + values_width <= width
        if not with_values:
            title = fit_words(title, width - 1 - len(paused) - names_width)
        segments = [Segment(f" {title}", title_style)]
        if paused:
            segments.append(Segment(paused, self._style("line-chart--paused")))
        for index, name, value in legend:
            segments.append(Segment("  ", axis_style))
            segments.append(Segment(LEGEND_SWATCH, self._series_color_style(index)))
            segments.append(Segment(f" {name}", axis_style))
            if with_values:
                segments.append(Segment(f" {value}", title_style))
        return self._finish(segments, width)

    def _plot_rows(
        self,
        width: int,
        plot_height: int,
        label_width: int,
        plot_width: int,
        top: float,
        columns_by_series: dict[int, list[float | None]],
    ) -> list[Strip]:
        if plot_height <= 0:
            return []
        key = (width, plot_height, label_width, plot_width, top, tuple(columns_by_series), self._formatter_version)
        drawn = self._drawn_cells if self._drawn_cells is not None and self._drawn_cells[0] == key else None
        if drawn is None:
            bits_rows, owner_rows = line_cells(columns_by_series, top, plot_height, plot_width)
            rows = self._cell_rows(width, plot_height, label_width, top, columns_by_series, bits_rows, owner_rows)
        else:
            # The same axes: only the cells from the first column whose values changed on are drawn again (at each
            # sample, the newest column or two), and only the rows those change are made again.
            _, drawn_columns, drawn_bits, drawn_owners, drawn_rows = drawn
            first_x = min(
                (first_difference(drawn_columns[index], values) for index, values in columns_by_series.items()),
                default=plot_width * 2,
            )
            first_column = first_x // 2
            if first_column >= plot_width:
                return drawn_rows
            bits_rows = [row[:first_column] + [0] * (plot_width - first_column) for row in drawn_bits]
            owner_rows = [row[:first_column] + [None] * (plot_width - first_column) for row in drawn_owners]
            draw_cells(bits_rows, owner_rows, columns_by_series, top, first_column)
            changed = [
                bits_rows[row][first_column:] != drawn_bits[row][first_column:]
                or owner_rows[row][first_column:] != drawn_owners[row][first_column:]
                for row in range(plot_height)
            ]
            made = self._cell_rows(
                width, plot_height, label_width, top, columns_by_series, bits_rows, owner_rows, changed
            )
            rows = [
                new if row_changed else old for new, old, row_changed in zip(made, drawn_rows, changed, strict=True)
            ]
        self._drawn_cells = (key, columns_by_series, bits_rows, owner_rows, rows)
        return rows

    def _cell_rows(
        self,
        width: int,
        plot_height: int,
        label_width: int,
        top: float,
        columns_by_series: dict[int, list[float | None]],
        bits_rows: list[list[int]],
        owner_rows: list[list[int | None]],
        only: list[bool] | None = None,
    ) -> list[Strip]:
        """The plot's rows from its cells, with the y-axis labels; `only`: make just the rows marked (the others are
        left blank, to be replaced by the caller)."""
        base = self._base_style
        axis_style = self._style("line-chart--axis")
        series_styles: dict[int | None, Style] = {
            index: base + Style(color=self._series_color_style(index).color) for index in columns_by_series
        }
        top_label = self.formatter(top)
        zero_label = self.formatter(0.0)
        rows = []
        blank_label = f"{'':>{label_width}}│"
        for row, (row_bits, row_owners) in enumerate(zip(bits_rows, owner_rows, strict=True)):
            if only is not None and not only[row]:
                rows.append(Strip([]))
                continue
            label = blank_label
            if row == 0:
                label = f"{top_label[-label_width:]:>{label_width}}┤"
            elif row == plot_height - 1:
                label = f"{zero_label[-label_width:]:>{label_width}}┤"
            segments = [Segment(label, axis_style)]
            glyphs = "".join([GLYPHS[bits] for bits in row_bits])
            # One segment per run of cells of one series (or none): usually a handful a row.
            start = 0
            run_owner = row_owners[0] if row_bits and row_bits[0] else None
            for column in range(1, len(row_bits)):
                owner = row_owners[column] if row_bits[column] else None
                if owner != run_owner:
                    segments.append(Segment(glyphs[start:column], series_styles.get(run_owner, base)))
                    start, run_owner = column, owner
            if glyphs:
                segments.append(Segment(glyphs[start:], series_styles.get(run_owner, base)))
            rows.append(self._finish(segments, width))
        return rows

    def x_axis_labels(self, start_s: float, end_s: float) -> tuple[str, str]:
        """The x-axis's two ends, for an axis from `start_s` to `end_s`: the run's elapsed time."""
        origin_s = start_s if self.axis_origin_s is None else self.axis_origin_s
        return format_duration(start_s - origin_s), format_duration(end_s - origin_s)

    def _x_axis_row(self, width: int, label_width: int, plot_width: int, start: str, end: str) -> Strip:
        fill = plot_width - len(start) - len(end) - 3
        if fill >= 1:
            axis = f"{' ' * label_width}└ {start} {'─' * fill} {end}"
        else:
            axis = f"{' ' * label_width}└{'─' * plot_width}"
        return self._finish([Segment(axis, self._style("line-chart--axis"))], width)
