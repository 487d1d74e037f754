"""Charts of a long run: the recent minutes by default, the whole run with `z` (each column's min..max, so a peak
from an hour ago shows), and the series behind them bounded however many samples arrive."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import ClassVar

import pytest
from test_app_snapshots import h100_environment
from watch_replay import NVML, PID, TARGET, TRACE, replayed_watch_app

from gpuanat.core.measure.samples import HostProcess, Sample
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.run_backend import LocalRunBackend
from gpuanat.tui.series import RECENT_SAMPLES, TimeSeries
from gpuanat.tui.widgets.line_chart import LineChart

INTERVAL_S = 1.0
"""One sample a second (the recorded trace's samples, timestamps spread): 70 minutes in 4,200 samples."""
SAMPLES = 4200
PEAK_INDEX = SAMPLES - 3600
"""An hour before the end."""
PEAK_BYTES = 80_000_000_000


class LongRecordedSource:
    """The recorded H100 trace cycled, one sample every `INTERVAL_S` of its clock, with one spike of memory used
    (far above the trace's 10 GB) an hour before its end."""

    keeps_recorded_time: ClassVar[bool] = True

    def __init__(self) -> None:
        self._recorded = [Sample.from_json(json.loads(line)) for line in TRACE.read_text().splitlines() if line]
        self._index = 0
        self.t_s = self._recorded[0].t_s
        """The last sample's time: the app's clock."""

    def read(self, pids: Iterable[int]) -> Sample:
        sample = self._recorded[self._index % len(self._recorded)]
        gpus = sample.gpus
        if self._index == PEAK_INDEX:
            gpus = (dataclasses.replace(gpus[0], used_bytes=PEAK_BYTES), *gpus[1:])
        host = sample.host
        process = HostProcess(
            pid=PID, parent_pid=1, name="python3", cpu_percent=host.cpu_percent or 0.0, rss_bytes=host.rss_bytes or 0
        )
        self.t_s = self._recorded[0].t_s + self._index * INTERVAL_S
        self._index += 1
        return Sample(t_s=self.t_s, gpus=gpus, host=dataclasses.replace(host, processes=(process,)))

    def close(self) -> None:
        pass


def chart_lines(chart: LineChart) -> list[str]:
    return ["".join(segment.text for segment in chart.render_line(row)) for row in range(chart.size.height)]


def dots(line: str) -> int:
    return sum(1 for character in line if 0x2800 < ord(character) <= 0x28FF)


PEAK_LABEL = "74.51 GiB"
"""80 GB, the y-axis's top when the peak is plotted (the chart scales to the highest value shown)."""


@pytest.mark.asyncio
async def test_z_zooms_the_watch_charts_out_to_the_whole_run_and_back(tmp_path) -> None:
    clock_s = [0.0]
    app = replayed_watch_app(
        tmp_path / "h.sqlite", tmp_path / "proc", TARGET, LongRecordedSource, NVML, lambda: clock_s[0]
    )
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(SAMPLES):
            clock_s[0] = app.dashboard.sample_now().t_s
        app.dashboard.paint()
        await pilot.pause()
        memory = app.dashboard.query_one("#memory-chart", LineChart)

        recent = chart_lines(memory)
        assert "last 5 min" in recent[0]
        # The x-axis: the run's last 5-6 minutes (the window moves on a minute at a time), of 1h09m59s.
        assert "└ 1h04m " in recent[-1] and recent[-1].rstrip().endswith(" 1h10m"), recent[-1]
        assert PEAK_LABEL not in recent[1], "the peak an hour ago is outside the recent window"

        await pilot.press("z")
        await pilot.pause()
        whole = chart_lines(memory)
        assert "whole run, 1h09m" in whole[0], whole[0]
        assert "└ 0s " in whole[-1]
        assert f"{PEAK_LABEL}┤" in whole[1] and dots(whole[1]) > 0, "the hour-old peak of 80 GB shows in the whole run"
        assert "whole run" in chart_lines(app.dashboard.query_one("#util-chart", LineChart))[0]

        await pilot.press("z")
        await pilot.pause()
        assert "last 5 min" in chart_lines(memory)[0]


@pytest.mark.asyncio
async def test_z_zooms_the_launching_dashboards_charts_out_to_the_whole_run(tmp_path) -> None:
    """The same 70 minutes as the idle launching dashboard samples them (its `LiveCharts`): memory on the card's
    scale, so the hour-old peak is a column reaching 94% of the plot."""
    _, capabilities, nvml = h100_environment()
    source = LongRecordedSource()
    app = GpuAnatApp(
        RunConfig(),
        db_path=tmp_path / "h.sqlite",
        sampler_factory=lambda: (source, nvml),
        backend=LocalRunBackend(tmp_path / "h.sqlite", capabilities_probe=lambda: capabilities),
        clock=lambda: source.t_s,
        sample_interval_s=None,
        paint_interval_s=3600,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(SAMPLES):
            app.dashboard.sample_now()
        app.dashboard.paint()
        await pilot.pause()
        memory = app.dashboard.query_one("#memory-chart", LineChart)
        recent = chart_lines(memory)
        assert "(of 79.65 GiB) · last 5 min" in recent[0], recent[0]
        assert dots(recent[1]) == 0, "nothing near the card's top in the last minutes"

        await pilot.press("z")
        await pilot.pause()
        whole = chart_lines(memory)
        assert "whole run, 1h09m" in whole[0], whole[0]
        assert dots(whole[1]) > 0, "the hour-old peak reaches the plot's top row"
        assert "whole run, 1h09m" in chart_lines(app.dashboard.query_one("#throughput-chart", LineChart))[0]


def test_a_series_stays_bounded_after_many_pushes_and_keeps_its_extremes() -> None:
    series = TimeSeries()
    pushes = 400_000
    for index in range(pushes):
        value = 1000.0 if index == 7_777 else -5.0 if index == 123_456 else float(index % 50)
        series.append(index * 0.25, value)
        if index in (10_000, 100_000):
            assert len(series) <= series.capacity
    assert len(series) <= series.capacity
    assert series.sample_count == pushes
    assert series.recent_count == RECENT_SAMPLES
    whole = series.envelope(200, 0.0, pushes * 0.25)
    assert max(value for value in whole if value is not None) == 1000.0
    assert min(value for value in whole if value is not None) == -5.0
    # The recent minutes come from the ring at full rate: one column per raw sample.
    last_s = (pushes - 1) * 0.25
    recent = series.bucket(240, last_s - 60.0 + 0.25, last_s + 0.25)
    assert recent == [float(index % 50) for index in range(pushes - 240, pushes)]
