"""How busy the GPU really is (issue #51), in the dashboards and in `gpuanat watch`'s records: the real apps, headless,
fed through the real sampler with the H100 samples gpuanat's NvmlSource recorded on GEMM-, element-wise- and
launch-bound steps (tests/data/gpm_h100_workloads.jsonl: NVML GPM, clocks, throttle reasons, power).

Regenerate the snapshot with `pytest tests/test_busy_view.py --snapshot-update` (pinned Textual 8.2.8).
"""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest
from recorded_backend import CAPABILITIES
from test_first_minute import screen_text
from watch_replay import replayed_session, replayed_watch_app

from gpuanat.core.measure.gpm import throttle_names
from gpuanat.core.measure.replay import ReplaySource
from gpuanat.core.measure.samples import ACTIVITY_READINGS, GpuSample, NvmlStatus, Sample
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.watch.session import WatchSession
from gpuanat.core.watch.target import WatchTarget
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.run_backend import LocalRunBackend
from gpuanat.tui.watch_app import WatchApp
from gpuanat.tui.widgets.gpu_activity import GpuActivityLine

WORKLOADS = Path(__file__).resolve().parent / "data" / "gpm_h100_workloads.jsonl"
NVML = NvmlStatus(
    available=True,
    reason=None,
    driver_version="580.159.04",
    cuda_driver_version=13000,
    gpu_names=("NVIDIA H100 80GB HBM3",),
)
NO_GPM = "this GPU has no GPM counters (NVML GPM needs a Hopper or later GPU)"
"""What `GpmReader` says on a GPU without GPM."""


def recorded() -> list[Sample]:
    source = ReplaySource(WORKLOADS)
    return [source.read([]) for _ in range(len(source))]


RECORDED = recorded()


def step_samples() -> dict[str, int]:
    """The index of a sample in the middle of each kind of step, found from the readings themselves: GEMM-bound
    (tensor pipes busy), element-wise-bound (SMs busy, tensor pipes idle, DRAM busy), launch-bound (kernels running
    part of the time, SMs idle)."""
    gpus = [sample.gpus[0] for sample in RECORDED]

    def middle(indices: list[int]) -> int:
        assert indices, "the trace has no such step"
        return indices[len(indices) // 2]

    return {
        "gemm": middle([i for i, gpu in enumerate(gpus) if (gpu.tensor_active_percent or 0) > 90]),
        "elementwise": middle(
            [i for i, gpu in enumerate(gpus) if (gpu.sm_active_percent or 0) > 90 and gpu.tensor_active_percent == 0]
        ),
        "launch": middle(
            [
                i
                for i, gpu in enumerate(gpus)
                if 10 < (gpu.gpu_util_percent or 0) < 60 and (gpu.sm_active_percent or 0) < 1
            ]
        ),
    }


def make_app(db_path: Path, trace: Path = WORKLOADS) -> GpuAnatApp:
    return GpuAnatApp(
        RunConfig(),
        db_path=db_path,
        sampler_factory=lambda: (ReplaySource(trace), NVML),
        backend=LocalRunBackend(db_path, capabilities_probe=lambda: CAPABILITIES),
        clock=lambda: 1_000.0,
        sample_interval_s=None,
        paint_interval_s=3600,
    )


class Replay:
    """The recorded samples through the dashboard's sampler, one at a time, in order."""

    def __init__(self, app: GpuAnatApp, pilot) -> None:
        self.app, self.pilot, self.taken = app, pilot, 0

    async def until(self, index: int) -> GpuSample:
        """Samples up to `index` taken and painted; its GPU."""
        while self.app.dashboard.capabilities is None:
            await self.pilot.pause()
        while self.taken <= index:
            self.app.dashboard.sample_now()
            self.taken += 1
        self.app.dashboard.paint()
        await self.pilot.pause()
        return RECORDED[index].gpus[0]


def activity_row(app: GpuAnatApp) -> str:
    (row,) = [line.strip() for line in screen_text(app).splitlines() if line.strip().startswith("GPU 0 busy")]
    return row


def whole(value: float | None) -> int:
    assert value is not None
    return round(value)


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
async def test_the_dashboard_says_how_busy_the_gpu_really_is_on_each_kind_of_step(tmp_path, size):
    steps = step_samples()
    app = make_app(tmp_path / "h.sqlite")
    async with app.run_test(size=size) as pilot:
        replay = Replay(app, pilot)
        # GEMM-bound: busy and the tensor pipes busy too; the H100 at its power cap says so
        gpu = await replay.until(steps["gemm"])
        row = activity_row(app)
        assert f"busy {whole(gpu.gpu_util_percent)}% · tensor {whole(gpu.tensor_active_percent)}%" in row
        assert whole(gpu.tensor_active_percent) > 90
        assert throttle_names(gpu.clocks_event_reasons) == ["software power cap"]
        assert row.endswith("power cap")
        assert f"{whole(gpu.power_w)} W" in row  # the power stays at 80 columns, beside the throttle reason
        # element-wise: the SMs busy, the tensor pipes idle, DRAM busy
        gpu = await replay.until(steps["elementwise"])
        row = activity_row(app)
        assert f"busy {whole(gpu.gpu_util_percent)}% · tensor 0%" in row
        if size[0] >= 120:
            assert f"SM {whole(gpu.sm_active_percent)}% · DRAM {whole(gpu.dram_bandwidth_percent)}%" in row
            assert f"{whole(gpu.temperature_c)}°C · {gpu.sm_clock_mhz} MHz" in row
        assert "power cap" not in row
        # launch-bound: kernels run part of the time, the SMs are all but idle
        gpu = await replay.until(steps["launch"])
        row = activity_row(app)
        assert f"busy {whole(gpu.gpu_util_percent)}% · tensor 0% · SM 0%" in row
        assert 10 < whole(gpu.gpu_util_percent) < 60
        assert len(row) <= size[0] - 2


@pytest.mark.asyncio
async def test_where_gpm_is_unavailable_the_row_says_tensor_dash_and_its_tooltip_says_why(tmp_path):
    # The recorded samples as a GPU without GPM gives them: no GPM readings, the reason instead.
    lines = []
    for line in WORKLOADS.read_text().splitlines():
        sample = json.loads(line)
        for gpu in sample["gpus"]:
            for name in ("sm_active_percent", "sm_occupancy_percent", "tensor_active_percent"):
                gpu.pop(name, None)
            gpu.pop("tensor_16bit_active_percent", None)
            gpu.pop("dram_bandwidth_percent", None)
            gpu["gpm_unavailable"] = NO_GPM
        lines.append(json.dumps(sample))
    trace = tmp_path / "no_gpm.jsonl"
    trace.write_text("\n".join(lines) + "\n")
    app = make_app(tmp_path / "h.sqlite", trace)
    async with app.run_test(size=(80, 24)) as pilot:
        gpu = await Replay(app, pilot).until(step_samples()["gemm"])
        row = activity_row(app)
        assert f"busy {whole(gpu.gpu_util_percent)}% · tensor —" in row
        assert "SM" not in row and "DRAM" not in row
        assert app.dashboard.query_one(GpuActivityLine).tooltip == NO_GPM


@pytest.mark.asyncio
async def test_a_trace_recorded_without_gpm_or_clocks_shows_no_activity_row(tmp_path):
    old_trace = Path(__file__).resolve().parent / "data" / "nvml_trace_h100.jsonl"
    app = make_app(tmp_path / "h.sqlite", old_trace)
    async with app.run_test(size=(80, 24)) as pilot:
        await Replay(app, pilot).until(20)
        line = app.dashboard.query_one(GpuActivityLine)
        assert line.rows_shown == 0 and not line.display
        assert "GPU 0 busy" not in screen_text(app)


def test_the_activity_row_at_80x24_during_the_gemm_step(snap_compare, tmp_path):
    app = make_app(tmp_path / "h.sqlite")

    async def run_before(pilot) -> None:
        await Replay(app, pilot).until(step_samples()["gemm"])

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


def watch_session(proc_root: Path, pid: int) -> WatchSession:
    """The watch's session of process `pid` (a directory of that name under `proc_root`), NVML's samples given."""
    target = WatchTarget(pid=pid, name="python3", command="", create_time_s=0.0, username=None)
    return replayed_session(target, NVML, proc_root)


def test_watch_records_carry_each_gpus_activity_as_the_sampler_read_it(tmp_path):
    """The records `gpuanat watch PID --json` prints, made by the watch's session from the recorded samples."""
    samples = RECORDED
    session = watch_session(tmp_path, 4242)
    records = [json.loads(json.dumps(session.handle(sample))) for sample in samples]  # as --json writes them
    for record, sample in zip(records, samples, strict=True):
        (entry,) = record["gpus"]
        gpu = sample.gpus[0]
        for name in ACTIVITY_READINGS:
            assert entry[name] == getattr(gpu, name), name
        assert entry["throttle_reasons"] == throttle_names(gpu.clocks_event_reasons)
        assert (entry["power_w"], entry["temperature_c"]) == (gpu.power_w, gpu.temperature_c)
    steps = step_samples()
    gemm = records[steps["gemm"]]["gpus"][0]
    assert gemm["tensor_active_percent"] > 90 and gemm["throttle_reasons"] == ["software power cap"]
    launch = records[steps["launch"]]["gpus"][0]
    assert launch["sm_active_percent"] < 1 and launch["device_util_percent"] > 10


BERT_TRACE = Path(__file__).resolve().parent.parent / "benchmarks/results/h100/gpm/bert_trace.jsonl"
"""gpuanat's --trace-out of bert-large bf16 batch 64 on the H100: NVML's busy near 100%, the tensor pipes about 30%."""
BERT_PID = 775
"""The training process, as NVML listed it in the trace."""


def make_bert_watch_app(db_path: Path, proc_root: Path) -> WatchApp:
    """The watch dashboard of the bert run's training process, fed its recorded trace through the real sampler."""
    first_t_s = json.loads(BERT_TRACE.read_text().splitlines()[0])["t_s"]
    target = WatchTarget(
        pid=BERT_PID, name="python3", command="python3 -m gpuanat.worker", create_time_s=0.0, username=None
    )
    return replayed_watch_app(db_path, proc_root, target, lambda: ReplaySource(BERT_TRACE), NVML, lambda: first_t_s)


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
async def test_the_watch_dashboard_shows_the_watched_gpus_tensor_pipes_beside_busy(tmp_path, size):
    source = ReplaySource(BERT_TRACE)
    samples = [source.read([]) for _ in range(len(source))]
    training = [i for i, sample in enumerate(samples) if (sample.gpus[0].gpu_util_percent or 0) >= 99]
    index = training[len(training) // 2]
    gpu = samples[index].gpus[0]
    app = make_bert_watch_app(tmp_path / "h.sqlite", tmp_path / "proc")
    async with app.run_test(size=size) as pilot:
        for _ in range(index + 1):
            app.dashboard.sample_now()
        app.dashboard.paint()
        await pilot.pause()
        row = activity_row(app)
        from gpuanat.tui.widgets.line_chart import LineChart

        assert app.dashboard.query_one("#util-chart", LineChart).series_names[-1] == "tensor"
        assert app.dashboard.series["tensor_active"].last == gpu.tensor_active_percent
    # NVML's "busy" says a kernel ran; the tensor pipes were active about a third of the time
    assert f"busy {whole(gpu.gpu_util_percent)}% · tensor {whole(gpu.tensor_active_percent)}%" in row
    assert 20 < whole(gpu.tensor_active_percent) < 40
    assert f"SM {whole(gpu.sm_active_percent)}%" in row
    assert row.endswith("power cap") == (throttle_names(gpu.clocks_event_reasons) == ["software power cap"])
    assert len(row) <= size[0] - 2


def test_watch_metrics_export_the_watched_gpus_activity_power_clock_and_throttle(tmp_path):
    """`gpuanat watch PID --metrics`: the series Prometheus scrapes from the watch's latest record (the bert run's
    training process mid-run, its recorded H100 sample made into a record by the watch's session) carry that GPU's
    readings: tensor pipes, SMs, DRAM, power, energy, SM clock, throttle reasons."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from gpuanat.core.export.metrics import metric_families
    from gpuanat.core.export.watch_metrics import WatchMetrics

    session = watch_session(tmp_path, BERT_PID)
    source = ReplaySource(BERT_TRACE)
    samples = [source.read([]) for _ in range(len(source))]
    capped = [i for i, sample in enumerate(samples) if sample.gpus[0].clocks_event_reasons == 4]
    assert capped, "the recorded run drew its power cap"
    for sample in samples[: capped[len(capped) // 2] + 1]:
        record = session.handle(sample)
    gpu = sample.gpus[0]
    watch_metrics = WatchMetrics({0: "GPU-h100"})
    watch_metrics.observe(json.loads(json.dumps(record)))  # as --json writes it

    class Source:
        def collect(self):
            return metric_families(watch_metrics.snapshots(), hostname="box", job="watch")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Source())
    values = {
        (sample.name, sample.labels.get("reason")): sample.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for sample in family.samples
    }
    assert values[("gpuanat_tensor_active_percent", None)] == pytest.approx(gpu.tensor_active_percent)
    assert values[("gpuanat_sm_active_percent", None)] == pytest.approx(gpu.sm_active_percent)
    assert values[("gpuanat_dram_bandwidth_percent", None)] == pytest.approx(gpu.dram_bandwidth_percent)
    assert values[("gpuanat_gpu_power_watts", None)] == pytest.approx(gpu.power_w)
    assert values[("gpuanat_gpu_energy_joules_total", None)] == pytest.approx(gpu.energy_mj / 1000)
    assert values[("gpuanat_sm_clock_hertz", None)] == pytest.approx(gpu.sm_clock_mhz * 1e6)
    assert values[("gpuanat_clocks_throttled", None)] == 1.0
    assert values[("gpuanat_clocks_throttle_reason", "software power cap")] == 1.0


@pytest.mark.asyncio
async def test_the_activity_rows_figures_change_at_most_once_a_second_a_throttle_reason_at_once(tmp_path):
    """At the watch's 4 Hz the power's watts move at every sample; the row repaints them once a second of the samples'
    own time (GPM reads once a second), but a throttle reason that comes or goes shows with its sample."""
    from gpuanat.tui.screens.dashboard import ACTIVITY_REPAINT_INTERVAL_S

    steps = step_samples()
    start = steps["gemm"] - 40  # before the GEMM step's power cap to its middle, and on
    app = make_app(tmp_path / "h.sqlite")
    async with app.run_test(size=(120, 40)) as pilot:
        replay = Replay(app, pilot)
        await replay.until(start)
        rows = []
        for index in range(start + 1, start + 41):
            await replay.until(index)
            rows.append((RECORDED[index], activity_row(app)))
    changes = [(sample, row) for (_, before), (sample, row) in itertools.pairwise(rows) if row != before]
    assert len(changes) >= 5  # the figures move through the step
    last_t_s, last_capped = None, False
    for sample, row in changes:
        capped = row.endswith("power cap")
        assert capped == (throttle_names(sample.gpus[0].clocks_event_reasons) == ["software power cap"])
        if last_t_s is not None and sample.t_s - last_t_s < ACTIVITY_REPAINT_INTERVAL_S:
            assert capped != last_capped, "a change within a second that is not a throttle reason's"
        last_t_s, last_capped = sample.t_s, capped
    moved = [
        (round(before.gpus[0].power_w), before.gpus[0].sm_clock_mhz)
        != (round(now.gpus[0].power_w), now.gpus[0].sm_clock_mhz)
        for (before, _), (now, _) in itertools.pairwise(rows)
    ]
    assert sum(moved) > 2 * len(changes)  # the samples' watts and clocks moved more often than the row


@pytest.mark.asyncio
async def test_the_utilization_chart_plots_the_tensor_pipes_beside_busy_where_gpm_reads(tmp_path):
    """The GEMM step's samples: the chart's "tensor" series holds what GPM read, beside NVML's utilization; a trace
    recorded without GPM keeps the chart's one series."""
    from gpuanat.tui.widgets.line_chart import LineChart

    app = make_app(tmp_path / "h.sqlite")
    async with app.run_test(size=(120, 40)) as pilot:
        gpu = await Replay(app, pilot).until(step_samples()["gemm"])
        chart = app.dashboard.query_one("#util-chart", LineChart)
        assert chart.series_names == ("GPU util", "tensor")
        title = chart.render_line(0).text
    assert "tensor" in title and f"{gpu.tensor_active_percent:.0f}" in title.split("tensor", 1)[1]
    old = make_app(tmp_path / "old.sqlite", Path(__file__).resolve().parent / "data" / "nvml_trace_h100.jsonl")
    async with old.run_test(size=(120, 40)) as pilot:
        await Replay(old, pilot).until(20)
        assert old.dashboard.query_one("#util-chart", LineChart).series_names == ("GPU util",)


@pytest.mark.asyncio
@pytest.mark.parametrize("height", [34, 38, 40, 50])
async def test_four_charts_share_the_column_once_the_loss_is_logged(tmp_path, height):
    """On the H100 a run's dashboard at 120×40 (the GPU's activity row, a techniques panel with --data) left the charts
    15 rows: four charts at a minimum of 4 rows overflowed it and Textual gave the memory chart all of it, the
    utilization, throughput and loss charts none. Each chart gets its share, and they fit the column."""
    import threading

    from gpuanat.core.measure.live_run import LiveRun
    from gpuanat.core.vocabulary.protocol import Hello, Step
    from gpuanat.tui.widgets.line_chart import LineChart

    app = make_app(tmp_path / "h.sqlite")
    async with app.run_test(size=(120, height)) as pilot:
        replay = Replay(app, pilot)
        await replay.until(10)
        live = LiveRun(config=RunConfig(), stop_requested=threading.Event(), run_id=1, pid=999, gpu_indices=(0,))
        app.dashboard.follow_run(live)
        app.dashboard.receive_event(Hello(pid=999, versions={}, device="cuda", device_name="H100", config={}))
        for step in range(1, 40):  # a loss logged every 10 steps, as Trainer logs
            logged = step - step % 10 or None
            app.dashboard.receive_event(
                Step(step, 16 * step, 1000 * step, 0.3, 0.3 * step, loss=10 - (logged or 0) / 10, loss_step=logged)
            )
        await replay.until(60)
        await pilot.pause()
        column = app.dashboard.query_one("#charts").region
        shown = {chart.id: chart.region for chart in app.dashboard.query(LineChart) if chart.display}
    assert list(shown) == ["memory-chart", "util-chart", "throughput-chart", "loss-chart"]
    assert sum(region.height for region in shown.values()) <= column.height
    assert all(region.height >= 3 and region.bottom <= column.bottom for region in shown.values())
