"""SVG snapshots of the main screens, fed by data recorded on an H100 and a frozen clock.

The NVML trace (tests/data/nvml_trace_h100.jsonl) plays through the real sampler code (ReplaySource,
Sampler.sample_once); the run's step events are the ones the real probe sent during that same run
(tests/data/h100_trace_run_steps.jsonl), decoded by the real protocol code; the history holds the real
results of the H100 sweep (benchmarks/results/h100/sweep.json).
Regenerate with `pytest tests/test_app_snapshots.py --snapshot-update` (pinned Textual 8.2.8).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from recorded_backend import CAPABILITIES

from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.measure.replay import ReplaySource
from gpuanat.core.measure.samples import NvmlStatus
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.protocol import ModelInfo, Step, decode
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.run_backend import LocalRunBackend
from gpuanat.tui.widgets.anatomy_timeline import AnatomyTimeline
from gpuanat.tui.widgets.line_chart import CHART_REPAINT_INTERVAL_S

DATA = Path(__file__).resolve().parent / "data"
TRACE = DATA / "nvml_trace_h100.jsonl"
STEPS = DATA / "h100_trace_run_steps.jsonl"
BS32_TRACE = DATA / "nvml_trace_h100_bs32.jsonl"
BS32_STEPS = DATA / "h100_bs32_run_steps.jsonl"
"""bert-large bf16 batch 32 on the H100, recorded by benchmarks/diagnosis_check.sh: steps with their phases."""
SERIES = DATA / "h100_sweep_vanilla_fp16_series.json"
"""Step records and NVML samples of the sweep's vanilla and fp16 runs, as the H100 history held them."""
SWEEP = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "h100" / "sweep.json"
SIZE = (120, 40)
FROZEN_T_S = 1_000.0

pytestmark = pytest.mark.skipif(
    not all(path.exists() for path in (TRACE, STEPS, SWEEP, SERIES, BS32_TRACE, BS32_STEPS)),
    reason="H100 recordings not committed yet",
)


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """The history pane shows local times: pin the zone so the snapshots do not depend on the machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def h100_environment() -> tuple[dict, Capabilities, NvmlStatus]:
    trace_run = json.loads(STEPS.read_text().splitlines()[0])
    capabilities = CAPABILITIES  # the H100 the run was recorded on
    nvml = NvmlStatus(
        available=True,
        reason=None,
        driver_version="580.159.04",
        cuda_driver_version=13000,
        gpu_names=("NVIDIA H100 80GB HBM3",),
    )
    return trace_run, capabilities, nvml


class ReplayClock:
    """The app's clock, frozen while a recording is replayed, moved on by hand (`advance`)."""

    def __init__(self, now_s: float) -> None:
        self.now_s = now_s

    def __call__(self) -> float:
        return self.now_s

    def advance(self, seconds: float) -> None:
        self.now_s += seconds


def make_app(db_path: Path, config: RunConfig, trace: Path = TRACE) -> GpuAnatApp:
    _, capabilities, nvml = h100_environment()
    clock = ReplayClock(FROZEN_T_S)
    return GpuAnatApp(
        config,
        db_path=db_path,
        sampler_factory=lambda: (ReplaySource(trace), nvml),
        backend=LocalRunBackend(db_path, capabilities_probe=lambda: capabilities),
        clock=clock,
        sample_interval_s=None,
        paint_interval_s=3600,
    )


SWEEP_STARTED_AT = 1_795_294_194.0
"""2026-11-21 20:49:54 UTC, when the H100 sweep began (benchmarks/results/h100/progress.txt)."""


def fill_history(db_path: Path) -> None:
    series = json.loads(SERIES.read_text())
    with HistoryStore(db_path) as store:
        for index, row in enumerate(json.loads(SWEEP.read_text())):
            run_id = store.create_run(row["config"], name=row["name"], created_at=SWEEP_STARTED_AT + 60 * index)
            store.update_result(run_id, RunResult.from_json({**row, "run_id": run_id}), status=row["status"])
            recorded = series.get(row["name"])
            if recorded is not None:
                store.set_environment(run_id, recorded["environment"])
                store.add_steps(run_id, recorded["steps"])
                store.add_samples(run_id, recorded["samples"])


def replay_run(app: GpuAnatApp, until_elapsed_s: float, steps_path: Path = STEPS) -> None:
    """The recorded run as the dashboard saw it `until_elapsed_s` into training: NVML samples and the
    probe's events up to then."""
    meta, *lines = steps_path.read_text().splitlines()
    meta = json.loads(meta)
    samples = sum(1 for elapsed_s in meta["elapsed_at_sample"] if elapsed_s <= until_elapsed_s)
    app.dashboard.follow_run(
        LiveRun(
            config=RunConfig.from_json(meta["config"]),
            stop_requested=threading.Event(),
            run_id=meta["run_id"],
            pid=meta["pid"],
        )
    )
    app.dashboard.receive_event(ModelInfo(**meta["model"]))
    steps = [decode(line) for line in lines]
    assert all(isinstance(step, Step) for step in steps)
    # in the order they happened: each sample, then the steps that ended before the next, one paint each
    sample_times_s = meta["elapsed_at_sample"][:samples]
    for index in range(samples):
        app.dashboard.sample_now()
        next_s = sample_times_s[index + 1] if index + 1 < samples else until_elapsed_s
        for step in steps:
            if sample_times_s[index] <= step.elapsed_s < next_s or (index == 0 and step.elapsed_s < sample_times_s[0]):
                app.dashboard.receive_event(step)
        app.dashboard.paint()


def h100_run_app(db_path: Path) -> GpuAnatApp:
    meta, _, _ = h100_environment()
    return make_app(db_path, RunConfig.from_json(meta["config"]))


async def replayed(app: GpuAnatApp, pilot) -> None:
    """The dashboard once its capabilities are known, 3 s into the recorded H100 run."""
    while app.dashboard.capabilities is None:
        await pilot.pause()
    replay_run(app, until_elapsed_s=3.0)
    # the frozen clock moved on by a chart interval, as a second later: the charts draw the last samples too
    app.dashboard.clock.advance(CHART_REPAINT_INTERVAL_S)
    app.dashboard.paint()
    await pilot.pause()


def test_the_step_strip_during_the_h100_batch_32_run(snap_compare, tmp_path):
    """Under the memory bar: the last 20 steps' time by phase, NVML's busy share and the bottleneck — the recorded
    bert-large bf16 batch-32 run, 4 s into training: backward (with the Trainer's wait for the GPU) most of each step,
    a kernel running nearly all the time: gpu-bound."""
    from gpuanat.tui.widgets.step_strip import StepStrip

    meta = json.loads(BS32_STEPS.read_text().splitlines()[0])
    app = make_app(tmp_path / "h.sqlite", RunConfig.from_json(meta["config"]), trace=BS32_TRACE)

    async def replayed_bs32(pilot) -> None:
        while app.dashboard.capabilities is None:
            await pilot.pause()
        replay_run(app, until_elapsed_s=4.0, steps_path=BS32_STEPS)
        app.dashboard.clock.advance(CHART_REPAINT_INTERVAL_S)
        app.dashboard.paint()
        await pilot.pause()
        strip = str(app.query_one(StepStrip).render())
        busy = int(strip.split("GPU busy ")[1].split("%")[0])
        assert strip.startswith("step 12") and "gpu-bound" in strip and busy >= 80, strip

    assert snap_compare(app, terminal_size=SIZE, run_before=replayed_bs32)


def test_dashboard_during_the_h100_run(snap_compare, tmp_path):
    app = h100_run_app(tmp_path / "h.sqlite")
    assert snap_compare(app, terminal_size=SIZE, run_before=lambda pilot: replayed(app, pilot))


def test_history_pane(snap_compare, tmp_path):
    fill_history(tmp_path / "h.sqlite")
    app = make_app(tmp_path / "h.sqlite", RunConfig())
    assert snap_compare(app, terminal_size=SIZE, press=["h"])


def test_compare_view(snap_compare, tmp_path):
    fill_history(tmp_path / "h.sqlite")
    app = make_app(tmp_path / "h.sqlite", RunConfig())
    # the cursor starts on the newest run (row 11); vanilla is row 1 and fp16 row 4
    assert snap_compare(app, terminal_size=SIZE, press=["h", *["up"] * 10, "space", "down", "down", "space", "enter"])


def test_dashboard_fits_80x24_in_ansi_colours(snap_compare, tmp_path):
    """An SSH session's default terminal: the compact layout, under the terminal's own 16/256 colours."""
    app = h100_run_app(tmp_path / "h.sqlite")

    async def run_before(pilot) -> None:
        app.theme = "ansi-dark"
        await replayed(app, pilot)

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def test_the_anatomy_over_time_of_the_h100_run(snap_compare, tmp_path):
    """`v`: the bands of the recorded H100 run over its steps, each at its peak and its end — the activations rise
    and fall every step, the optimizer state appears after step 1 (issue #17)."""
    app = h100_run_app(tmp_path / "h.sqlite")

    async def run_before(pilot) -> None:
        await replayed(app, pilot)
        await pilot.press("v")
        await pilot.pause()
        timeline = app.query_one(AnatomyTimeline)
        points = timeline.points
        assert points and points[0].step == 1 and points[0].bands["optimizer_state_bytes"] == 0
        assert points[1].bands["optimizer_state_bytes"] > 0  # created by the first optimizer step
        peaks = [point for point in points if point.at_peak]
        ends = [point for point in points if not point.at_peak]
        assert all(peak.bands["activations_bytes"] > 1 << 30 for peak in peaks[1:])  # 4.6 GiB at each peak
        assert all(end.bands["activations_bytes"] == 0 for end in ends)

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


@pytest.mark.asyncio
async def test_history_sorts_and_filters_as_htop_does(tmp_path):
    """The H100 sweep's 11 runs: `>` sorts by the next column (time, largest first), `I` inverts, `/` filters by
    name/techniques, escape clears the filter; the selection and compare work on what is shown."""
    from gpuanat.tui.screens.history import HistoryScreen

    fill_history(tmp_path / "h.sqlite")
    app = make_app(tmp_path / "h.sqlite", RunConfig())
    async with app.run_test(size=SIZE) as pilot:
        await pilot.press("h")
        screen = app.screen
        assert isinstance(screen, HistoryScreen) and screen.shown_run_ids == list(range(1, 12))
        rows = {row["id"]: row for row in screen.run_rows}
        await pilot.press("greater_than_sign")
        assert screen.sort_key == "time_s" and screen.descending
        times = [rows[run_id]["time_s"] for run_id in screen.shown_run_ids if rows[run_id]["time_s"] is not None]
        assert times == sorted(times, reverse=True) and len(times) >= 8
        await pilot.press("I")
        times = [rows[run_id]["time_s"] for run_id in screen.shown_run_ids if rows[run_id]["time_s"] is not None]
        assert times == sorted(times)
        assert "▲" in str(screen.query_one("#history-table").columns["time_s"].label)
        await pilot.press("slash", *"fp16")
        shown = screen.shown_run_ids
        assert 0 < len(shown) < 11
        assert all("fp16" in f"{rows[i]['name']} {rows[i]['techniques']}".lower() for i in shown)
        await pilot.press("enter")  # keeps the filter, back in the table
        assert screen.filter_text == "fp16" and screen.query_one("#history-table").has_focus
        await pilot.press("escape")  # clears it
        assert screen.filter_text == "" and len(screen.shown_run_ids) == 11
        await pilot.press("less_than_sign")  # back to the run order
        assert screen.sort_key == "id" and screen.shown_run_ids == list(range(1, 12))
        await pilot.press("space", "up", "space", "enter")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, HistoryScreen)


def test_at_80x24_three_unavailable_techniques_keep_every_row_and_the_top_line_whole(snap_compare, tmp_path):
    """Issue #48, point 10: a CPU box without NVML at 80×24, fp16, tf32 and expandable segments chosen (none can run
    there): one line says how many are unavailable and that u says why, every technique row stays (or its key in the
    folded line), and the top line is shortened at a word, not cut."""
    from test_keys_page import cpu_app, until_probed

    app = cpu_app(tmp_path, RunConfig(device="cpu", preset="tiny", seq_len=64, samples=64))

    async def run_before(pilot) -> None:
        await until_probed(app, pilot)
        await pilot.press("p", "t", "x")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


async def out_of_memory_replayed(app: GpuAnatApp, pilot) -> None:
    """The dashboard once the H200's recorded failure has been replayed and its result recorded (no toast left)."""
    from test_failure_tui import run_until_it_fails
    from test_tui import wait_for

    await run_until_it_fails(app, pilot)
    await wait_for(pilot, lambda: app.dashboard.last_result is not None, what="the result")
    app.clear_notifications()
    await pilot.pause()


def test_the_dashboard_after_an_out_of_memory_failure_recorded_on_an_h200(snap_compare, tmp_path):
    """At 80×24: above the bar, what failed (the optimizer step, 64 MiB tried, 27 MiB free) and the largest tensor,
    on two rows; the bar shows the memory at the failing allocation, every band from the probe's readings then."""
    from test_failure_tui import oom_app

    app, _ = oom_app(tmp_path, hold=False)
    assert snap_compare(app, terminal_size=(80, 24), run_before=lambda pilot: out_of_memory_replayed(app, pilot))


def test_memory_by_module_at_an_out_of_memory_failure_recorded_on_an_h200(snap_compare, tmp_path):
    """`b` at 80×24 after the H200's failure: what failed, then each module's activations, parameters, gradients and
    optimizer state at the failing allocation, largest first, "(the rest)" last; long paths wrap at their dots."""
    from test_failure_tui import oom_app

    app, _ = oom_app(tmp_path, hold=False)

    async def run_before(pilot) -> None:
        await out_of_memory_replayed(app, pilot)
        await pilot.press("b")
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)
