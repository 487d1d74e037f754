"""TimeSeries downsampling and the LineChart / MemoryBar widgets, rendered headless through App.run_test."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest
from textual.app import App, ComposeResult

from gpuanat.core.measure.anatomy import BAND_NAMES
from gpuanat.core.store.report import format_bytes
from gpuanat.tui.series import Reduce, TimeSeries
from gpuanat.tui.widgets.braille_cells import BRAILLE_BLANK
from gpuanat.tui.widgets.line_chart import LineChart, axis_span_s, format_duration
from gpuanat.tui.widgets.memory_bar import BAND_GLYPHS, BAND_LABELS, MemoryBar, band_component_class, split_cells

GIB = 1024**3
MIB = 1024**2
BERT_LARGE_BANDS = {
    "other_processes_bytes": 0,
    "cuda_context_bytes": 527 * MIB,
    "weights_bytes": 1340583944,
    "gradients_bytes": 1340575752,
    "optimizer_state_bytes": 2681153076,
    "activations_bytes": 3415548828,
    "temporaries_and_cache_bytes": 1900 * MIB,
}
H100_TOTAL_BYTES = 81559 * MIB


def ramp(count: int, step_s: float = 1.0, capacity: int = 2048, reduce: Reduce = "max") -> TimeSeries:
    series = TimeSeries(capacity, reduce)
    for index in range(count):
        series.append(index * step_s, float(index))
    return series


# --- TimeSeries ----------------------------------------------------------------------------------


def test_series_stays_bounded_and_covers_the_whole_run():
    series = ramp(100_000, step_s=0.25, capacity=64)
    assert 32 <= len(series) <= 64
    assert series.sample_count == 100_000
    points = series.points()
    assert points[0] == (0.0, pytest.approx(points[0][1]))
    assert points[0][0] == series.first_t_s == 0.0
    # The last stored point starts within one stride of the last sample: nothing recent is lost.
    assert series.last_t_s - points[-1][0] < series.stride * 0.25
    assert [t for t, _ in points] == sorted(t for t, _ in points)
    columns = series.bucket(40)
    assert all(value is not None for value in columns)
    assert columns[-1] == 99_999.0  # max rule: the latest peak survives any amount of merging


def test_series_keeps_peaks_when_downsampling_with_max():
    series = TimeSeries(capacity=16)
    for index in range(1000):
        series.append(float(index), 1000.0 if index == 333 else 1.0)
    assert len(series) <= 16
    assert max(value for _, value in series.points()) == 1000.0


def test_series_mean_rule_averages_and_keeps_weights_equal():
    series = ramp(1024, capacity=16, reduce="mean")
    assert len(series) <= 16
    # Every stored point covers `stride` consecutive integers, so its mean is the middle of them.
    for t_s, value in series.points():
        assert value == pytest.approx(t_s + (series.stride - 1) / 2)
    assert series.max == 1023.0


def test_bucket_of_a_known_ramp():
    series = ramp(100)  # value == t, 0..99
    assert series.bucket(10) == [float(10 * column + 9) for column in range(9)] + [99.0]
    means = ramp(100, reduce="mean").bucket(10)
    assert means == pytest.approx([10 * column + 4.5 for column in range(9)] + [94.5])


def test_bucket_holds_between_samples_and_is_none_outside_the_series():
    series = TimeSeries()
    series.append(10.0, 5.0)
    series.append(30.0, 7.0)
    assert series.bucket(5, 0.0, 50.0) == [None, 5.0, 5.0, 7.0, None]
    assert TimeSeries().bucket(3) == [None, None, None]
    assert series.bucket(0) == []
    single = TimeSeries()
    single.append(3.0, 2.0)
    assert single.bucket(4) == [2.0, 2.0, 2.0, 2.0]


def test_series_last_max_version_copy_clear():
    series = TimeSeries()
    assert series.last is None and series.max is None and len(series) == 0 and not series
    series.append(0.0, 3.0)
    series.append(1.0, 9.0)
    series.append(2.0, 4.0)
    assert (series.last, series.max, len(series)) == (4.0, 9.0, 3)
    snapshot = series.copy()
    series.append(3.0, 20.0)
    assert snapshot.max == 9.0 and len(snapshot) == 3
    version = series.version
    series.clear()
    assert len(series) == 0 and series.version > version
    with pytest.raises(ValueError):
        snapshot.append(1.0, 0.0)  # time may not go backwards


# --- LineChart -----------------------------------------------------------------------------------


class ChartApp(App[None]):
    def __init__(self, chart: LineChart, height: int = 10) -> None:
        super().__init__()
        self.chart = chart
        self.chart.styles.height = height

    def compose(self) -> ComposeResult:
        yield self.chart


def run_app(app: App[None], check: Callable[..., Awaitable[None]], size: tuple[int, int] = (80, 24)) -> None:
    async def main() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            await check(pilot)

    asyncio.run(main())


def chart_rows(chart: LineChart) -> list[str]:
    return [chart.render_line(y).text for y in range(chart.size.height)]


def is_dot(cell: str) -> bool:
    """A braille cell with at least one dot."""
    return BRAILLE_BLANK < ord(cell) <= BRAILLE_BLANK + 0xFF


def last_drawn(chart: LineChart, y: int):
    """The last segment of row `y` that is not blank."""
    return [segment for segment in chart.render_line(y) if segment.text.strip()][-1]


def bytes_label(value: float) -> str:
    return format_bytes(int(value))


def test_line_chart_rows_axis_and_top():
    chart = LineChart("GPU memory", formatter=bytes_label)
    memory = TimeSeries()
    for index in range(121):
        memory.append(index * 0.5, index / 120 * 8 * GIB)

    async def check(pilot) -> None:
        chart.set_series("this run", memory)
        await pilot.pause()
        rows = chart_rows(chart)
        assert len(rows) == 10 and all(len(row) == 80 for row in rows)
        assert rows[0].startswith(" GPU memory") and "this run 8.00 GiB" in rows[0]
        assert rows[1].startswith(" 8.00 GiB┤")  # formatted max on the top plot row
        assert rows[8].startswith("    0 MiB┤")
        # 60 s of samples: the axis spans the next step of its ladder, so that new samples fill it column by column
        assert rows[9].strip().startswith("└ 0s") and rows[9].rstrip().endswith(format_duration(axis_span_s(60.0)))
        assert format_duration(axis_span_s(60.0)) == "1m02s"
        # A line, in braille: the ramp's last (highest) point is a dot in the top row's last drawn column, its first
        # a dot in the bottom row's first column; the rows between hold the rising line, one cell high each.
        plot = rows[1:9]
        last = len(plot[0].rstrip()) - 1
        assert last >= 75 and is_dot(plot[0][last]) and not is_dot(plot[-1][last])
        assert is_dot(plot[-1][10]) and not is_dot(plot[0][10])
        assert all(sum(is_dot(cell) for cell in row[10:]) >= 1 for row in plot)
        # Cached: an unchanged chart hands back the very same strips.
        assert chart.render_line(4) is chart.render_line(4)

    run_app(ChartApp(chart), check)


def test_line_chart_fixed_y_max_and_two_layered_series():
    chart = LineChart("GPU memory", formatter=bytes_label, y_max=16 * GIB)
    device, run = TimeSeries(), TimeSeries()
    for index in range(60):
        device.append(float(index), 12 * GIB)
        run.append(float(index), 6 * GIB)

    async def check(pilot) -> None:
        chart.set_series("device used", device)
        chart.set_series("this run", run)
        await pilot.pause()
        rows = chart_rows(chart)
        assert rows[1].startswith(" 16.00 GiB┤")
        plot = rows[1:9]
        # 8 rows of 4 dots for 16 GiB, 31 steps: device used (12 GiB) is a flat line at dot 23 from the bottom, 8
        # from the top, in row 2; this run (6 GiB) at dot 12, 19 from the top, in row 4 — two lines, each in its
        # own colour, neither hiding the other.
        last = max(len(row.rstrip()) for row in plot) - 1
        line_rows = [index for index, row in enumerate(plot) if is_dot(row[last])]
        assert line_rows == [2, 4]
        colours = {y: last_drawn(chart, y + 1).style.color for y in line_rows}
        assert colours == {
            2: chart.get_component_rich_style("line-chart--series-0").color,
            4: chart.get_component_rich_style("line-chart--series-1").color,
        }

    run_app(ChartApp(chart), check)


def test_line_chart_pause_freezes_the_display():
    chart = LineChart("throughput", formatter=lambda value: f"{value:.1f}/s")
    rate = ramp(50, reduce="mean")

    async def check(pilot) -> None:
        chart.set_series("samples/s", rate)
        await pilot.pause()
        before = chart_rows(chart)
        chart.paused = True
        await pilot.pause()
        paused = chart_rows(chart)
        assert "paused" in paused[0]
        for index in range(50, 200):
            rate.append(float(index), 500.0)
        chart.refresh_data()
        await pilot.pause()
        assert chart_rows(chart)[1:] == paused[1:] == before[1:]
        chart.paused = False
        chart.refresh_data()
        await pilot.pause()
        live = chart_rows(chart)
        assert "paused" not in live[0] and live[1].startswith(" 500.0/s┤")

    run_app(ChartApp(chart), check)


def test_line_chart_redraws_its_plot_at_most_at_the_chart_rate():
    """Issue #18: fed at each 0.25 s paint, a chart redraws its plot at most once per CHART_REPAINT_INTERVAL_S (the
    legend's value follows every paint), and at once when the samples not drawn yet span more than one column."""
    from gpuanat.tui.widgets.line_chart import CHART_REPAINT_INTERVAL_S

    chart = LineChart("GPU utilization", formatter=lambda value: f"{value:.0f}%")
    util = ramp(400)

    async def check(pilot) -> None:
        chart.set_series("util", util)
        chart.refresh_data(now_s=0.0)
        await pilot.pause()
        builds, plot = chart.plot_builds, chart_rows(chart)[1:]
        for paint in range(1, 4):  # three paints within the second, each with a new sample
            util.append(399 + paint * 0.25, 1000.0 + paint)
            chart.refresh_data(now_s=paint * 0.25)
            await pilot.pause()
            assert chart.plot_builds == builds and chart_rows(chart)[1:] == plot
            assert f"{1000 + paint}%" in chart_rows(chart)[0]
        chart.refresh_data(now_s=CHART_REPAINT_INTERVAL_S)
        await pilot.pause()
        assert chart.plot_builds == builds + 1 and chart_rows(chart)[1:] != plot
        builds = chart.plot_builds
        util.append(460.0, 5.0)  # 60 s later: many columns on
        chart.refresh_data(now_s=CHART_REPAINT_INTERVAL_S + 0.25)
        await pilot.pause()
        assert chart.plot_builds == builds + 1

    run_app(ChartApp(chart), check)


def test_line_chart_redraws_only_the_changed_columns_as_a_whole_redraw_would():
    """On unchanged axes a new sample redraws only the cells from the first column whose values changed, and remakes
    only the rows those change: at every sample the rows are those of the plot drawn from scratch (two series that
    cross, a gap, a jump), and most rows are the same objects as before."""
    import random

    chart = LineChart("GPU utilization", y_max=100, formatter=lambda value: f"{value:.0f}%")
    rng = random.Random(7)
    device, process = TimeSeries(), TimeSeries()

    async def check(pilot) -> None:
        chart.window = (0.0, 60.0)  # one time axis throughout
        chart.set_series("device", device)
        chart.set_series("process", process)
        kept = 0
        for step in range(120):
            t_s = step * 0.5
            device.append(t_s, 50 + 40 * rng.random() if step % 30 < 25 else 100.0)
            if not 40 <= step < 50:  # a gap in one series
                process.append(t_s, min(100.0, max(0.0, device.last - 20 + 40 * rng.random())))
            before = [chart.render_line(y) for y in range(chart.size.height)]
            chart.refresh_data()
            await pilot.pause()
            drawn = [chart.render_line(y) for y in range(chart.size.height)]
            kept += sum(row is old for row, old in zip(drawn[1:-1], before[1:-1], strict=True))
            chart._drawn_cells = chart._plot_cache = chart._built_key = None  # from scratch
            assert [chart.render_line(y) for y in range(chart.size.height)] == drawn, step
        assert kept > 120 * (chart.size.height - 2) / 2

    run_app(ChartApp(chart), check)


def test_partial_updates_send_the_changed_span_only():
    """A span at the end of a widget's line segment is sent from its first cell, not the segment's (issue #18)."""
    from rich.console import Console
    from rich.segment import Segment
    from textual._compositor import ChopsUpdate
    from textual.strip import Strip

    from gpuanat.tui.textual_internals import render_segments

    console = Console(color_system="truecolor", force_terminal=True)
    strip = Strip([Segment("legend 12%", None), Segment("全", None)])
    update = ChopsUpdate([{0: strip}], [(0, 7, 10)], [[12]])
    sent = render_segments(update, console)
    assert sent.startswith("\x1b[1;8H") and "12%" in sent and "legend" not in sent and "全" not in sent
    inside_wide = ChopsUpdate([{0: strip}], [(0, 11, 12)], [[12]])  # a cut inside a wide glyph: from its segment
    assert render_segments(inside_wide, console) == "\x1b[1;11H全"


def test_changed_span_is_the_first_to_the_last_changed_cell():
    """The span a row repaints, found from its text and style runs, is the one a cell-by-cell comparison finds:
    rows of random glyphs and styles (equal styles as distinct objects included), cut into random segments."""
    import random

    from rich.segment import Segment
    from rich.style import Style
    from textual.strip import Strip

    from gpuanat.tui.widgets.cached_rows import changed_span

    styles = [None, Style(color="red"), Style(color="red"), Style(bold=True), Style(color="blue")]
    rng = random.Random(18)

    def strip_of(cells: list[tuple[str, Style | None]]) -> Strip:
        segments, x = [], 0
        while x < len(cells):  # a segment: up to 4 cells of one style
            end = x + 1
            while end < min(len(cells), x + 4) and cells[end][1] is cells[x][1]:
                end += 1
            segments.append(Segment("".join(glyph for glyph, _ in cells[x:end]), cells[x][1]))
            x = end
        return Strip(segments)

    def cell_by_cell(before: list, after: list) -> tuple[int, int] | None:
        changed = [x for x, (was, now) in enumerate(zip(before, after, strict=True)) if was != now]
        return (changed[0], changed[-1] + 1) if changed else None

    spans = []
    for _ in range(3000):
        before = [(rng.choice("ab ⠁"), rng.choice(styles)) for _ in range(rng.randint(1, 14))]
        after = list(before)
        for _ in range(rng.randint(0, 3)):
            after[rng.randrange(len(after))] = (rng.choice("ab ⠁"), rng.choice(styles))
        span = changed_span(strip_of(before), strip_of(after))
        assert span == cell_by_cell(before, after), (before, after)
        spans.append(span)
    assert None in spans and any(span and span[1] - span[0] > 1 for span in spans)
    wide = Strip([Segment("全", None)])  # a glyph two cells wide: the row whole
    assert changed_span(wide, Strip([Segment("字", None)])) == (0, 2)


def test_line_chart_follows_a_theme_change():
    chart = LineChart("GPU memory", formatter=bytes_label)

    async def check(pilot) -> None:
        chart.set_series("device used", ramp(30))
        await pilot.pause()
        line_row = next(y for y in range(1, 9) if is_dot(chart.render_line(y).text.rstrip()[-1]))
        before = last_drawn(chart, line_row).style.color
        pilot.app.theme = "ansi-dark"
        await pilot.pause()
        after = last_drawn(chart, line_row).style.color
        assert after != before
        assert after == chart.get_component_rich_style("line-chart--series-0").color

    run_app(ChartApp(chart), check)


def test_line_chart_empty_state():
    chart = LineChart("GPU utilization")

    async def check(pilot) -> None:
        chart.set_series("GPU util", TimeSeries())
        await pilot.pause()
        rows = chart_rows(chart)
        assert sum("waiting for samples…" in row for row in rows) == 1

    run_app(ChartApp(chart), check)


def test_format_duration():
    assert [format_duration(s) for s in (0, 45.4, 725, 11220)] == ["0s", "45s", "12m05s", "3h07m"]


# --- MemoryBar -----------------------------------------------------------------------------------


class BarApp(App[None]):
    def compose(self) -> ComposeResult:
        yield MemoryBar()


def bar_rows(bar: MemoryBar) -> list[str]:
    return [bar.render_line(y).text for y in range(bar.size.height)]


def test_band_tables_cover_the_anatomy():
    assert list(BAND_LABELS) == list(BAND_NAMES) == list(BAND_GLYPHS)
    assert {band_component_class(band) for band in BAND_NAMES} <= MemoryBar.COMPONENT_CLASSES


def test_split_cells_is_proportional_and_keeps_small_bands():
    assert split_cells([1, 1, 2], 4, 8) == [2, 2, 4]
    cells = split_cells([1, 500, 499], 1000, 50)
    assert cells[0] == 1 and sum(cells) == 50 and abs(cells[1] - 25) <= 1
    assert split_cells([10, 10], 40, 20) == [5, 5]  # scaled to a larger total: the rest stays empty
    assert split_cells([0, 0], 0, 10) == [0, 0]


def test_memory_bar_legend_values_and_proportional_bar():
    bands = dict(BERT_LARGE_BANDS, free_bytes=H100_TOTAL_BYTES - sum(BERT_LARGE_BANDS.values()))
    peak = {band: value * 2 for band, value in bands.items()}

    async def check(pilot) -> None:
        bar = pilot.app.query_one(MemoryBar)
        bar.update_bands(bands, peak, H100_TOTAL_BYTES, {})
        await pilot.pause()
        rows = bar_rows(bar)
        assert len(rows) == 1 + 1 + len(BAND_NAMES) + 1
        assert rows[0].startswith("measured ")
        legend = rows[2 : 2 + len(BAND_NAMES)]
        assert [row[3 : 3 + 20].strip() for row in legend] == [BAND_LABELS[band] for band in BAND_NAMES]
        weights_row = legend[BAND_NAMES.index("weights_bytes")]
        assert format_bytes(bands["weights_bytes"]) in weights_row
        assert format_bytes(peak["weights_bytes"]) in weights_row
        assert "of 79.65 GiB" in rows[-1]
        # Each non-zero band is one run of cells in the bar, in band order, proportional to its bytes.
        segments = [segment for segment in bar.render_line(0) if segment.text.strip()][1:]
        drawn = [band for band in BAND_NAMES if bands[band]]
        assert len(segments) == len(drawn)
        bar_width = 80 - 10
        for band, segment in zip(drawn, segments, strict=True):
            assert set(segment.text) == {BAND_GLYPHS[band]}
            assert segment.style.color == bar.get_component_rich_style(band_component_class(band)).color
            expected = bands[band] / H100_TOTAL_BYTES * bar_width
            assert abs(len(segment.text) - expected) <= 1, band
        assert sum(len(segment.text) for segment in segments) == bar_width

    run_app(BarApp(), check)


def test_memory_bar_unmeasured_bands_show_dash_and_reason():
    reason = "not measurable with torch.compile on CPU"

    async def check(pilot) -> None:
        bar = pilot.app.query_one(MemoryBar)
        bar.update_bands(
            {"weights_bytes": 4 * GIB, "activations_bytes": None},
            None,
            None,
            {"activations_bytes": reason, "free_bytes": "no GPU"},
        )
        await pilot.pause()
        rows = bar_rows(bar)
        activations = rows[2 + BAND_NAMES.index("activations_bytes")]
        assert "—" in activations and reason in activations
        assert "—" in rows[2 + BAND_NAMES.index("free_bytes")]
        assert set(rows[0][10:]) == {BAND_GLYPHS["weights_bytes"]}  # scaled to the known sum: all weights
        assert reason in str(bar.tooltip)

    run_app(BarApp(), check)


def test_memory_bar_predicted_bar_shares_the_scale():
    predicted = dict(BERT_LARGE_BANDS, activations_bytes=2 * BERT_LARGE_BANDS["activations_bytes"])

    async def check(pilot) -> None:
        bar = pilot.app.query_one(MemoryBar)
        bar.update_bands(BERT_LARGE_BANDS, None, None, {})
        bar.update_predicted(predicted)
        await pilot.pause()
        rows = bar_rows(bar)
        assert len(rows) == 12 and rows[1].startswith("predicted ")
        assert "predicted" in rows[2]
        measured_cells = len(rows[0][10:].rstrip())
        assert measured_cells < len(rows[1][10:].rstrip()) == 70
        bar.update_predicted(None)
        await pilot.pause()
        assert bar.size.height == 11

    run_app(BarApp(), check)


def test_memory_bar_repeated_readings_do_not_rebuild_and_themes_restyle():
    async def check(pilot) -> None:
        bar = pilot.app.query_one(MemoryBar)
        bar.update_bands(BERT_LARGE_BANDS, None, H100_TOTAL_BYTES, {})
        await pilot.pause()
        first = bar.render_line(0)
        bar.update_bands(dict(BERT_LARGE_BANDS), None, H100_TOTAL_BYTES, {})  # the paint tick, nothing new
        assert bar.render_line(0) is first
        pilot.app.theme = "ansi-dark"
        await pilot.pause()
        weights = bar.get_component_rich_style(band_component_class("weights_bytes")).color
        assert bar.render_line(0) is not first
        assert any(segment.style.color == weights for segment in bar.render_line(0))

    run_app(BarApp(), check)


def test_memory_bar_draws_a_causal_lms_logits_as_a_band_of_their_own():
    """llama-3.2-1b on the H100 (benchmarks/results/h100/llm_runs: bf16, batch 2, seq 1024): 8.30 GiB of activations,
    of which 1002 MiB of logits, measured and predicted. Both bars carve the logits out of the activations."""
    from gpuanat.tui.widgets.memory_bar import LOGITS_COMPONENT, LOGITS_GLYPH

    logits = 2 * 1024 * 128_256 * 4
    bands = {
        "cuda_context_bytes": 758 * MIB,
        "weights_bytes": 4_943_257_856,
        "gradients_bytes": 0,
        "optimizer_state_bytes": 9_886_515_784,
        "activations_bytes": 8_912_000_000,
        "temporaries_and_cache_bytes": 2_830_000_000,
    }
    predicted = dict(bands, activations_bytes=8_920_000_000, temporaries_and_cache_bytes=None)

    async def check(pilot) -> None:
        bar = pilot.app.query_one(MemoryBar)
        bar.update_bands(bands, None, H100_TOTAL_BYTES, {})
        bar.update_predicted(predicted)
        bar.update_logits(logits, logits, logits // 2)
        await pilot.pause()
        bar_width = 80 - 10
        for row, expected_logits in ((0, logits), (1, logits // 2)):
            segments = [segment for segment in bar.render_line(row) if segment.text.strip()][1:]
            glyphs = [segment.text[0] for segment in segments]
            at = glyphs.index(LOGITS_GLYPH)
            assert (
                segments[at - 1].style.color
                == bar.get_component_rich_style(band_component_class("activations_bytes")).color
            )  # right after the activations
            assert segments[at].style.color == bar.get_component_rich_style(LOGITS_COMPONENT).color
            assert abs(len(segments[at].text) - expected_logits / H100_TOTAL_BYTES * bar_width) <= 1
            activations = (bands if row == 0 else predicted)["activations_bytes"] - expected_logits
            assert abs(len(segments[at - 1].text) - activations / H100_TOTAL_BYTES * bar_width) <= 1
        rows = bar_rows(bar)
        logits_row = rows[3 + BAND_NAMES.index("activations_bytes") + 1]
        assert LOGITS_GLYPH in logits_row and "of which logits" in logits_row and "1002 MiB" in logits_row

    run_app(BarApp(), check)


def test_memory_bar_columns_never_touch_on_a_141_gb_card():
    """An H200 shows 131.03 GiB free: the now and peak columns must not run together ("131.03 GiB131.03 GiB")."""
    total = 143_771 * MIB
    bands = {"cuda_context_bytes": 758 * MIB, "weights_bytes": 4 * GIB, "free_bytes": total - 758 * MIB - 4 * GIB}

    async def check(pilot) -> None:
        bar = pilot.app.query_one(MemoryBar)
        bar.update_bands(bands, bands, total, {})
        bar.update_predicted({"weights_bytes": 4 * GIB, "free_bytes": 1023 * GIB})
        await pilot.pause()
        rows = bar_rows(bar)
        assert any("135.66 GiB" in row for row in rows)
        assert not [row for row in rows if "GiB1" in row or "MiB1" in row], rows

    run_app(BarApp(), check)
