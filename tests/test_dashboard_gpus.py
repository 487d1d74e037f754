"""The dashboard on a machine with 2 GPUs, fed by what was recorded on the H200×2 machine.

The NVML trace (tests/data/h200x2_ddp_trace.jsonl, `gpuanat run --gpus 2 --distributed ddp --trace-out`) plays
through the real sampler code; the run's per-rank results are that run's (benchmarks/results/h200x2/multi/
results.jsonl, technique ddp), so each rank's bands and PIDs are the real ones.
Regenerate the snapshot with `pytest tests/test_dashboard_gpus.py --snapshot-update` (pinned Textual 8.2.8).
"""

from __future__ import annotations

import dataclasses
import json
import threading
from pathlib import Path

import pytest
from test_first_minute import screen_text

from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.measure.replay import ReplaySource
from gpuanat.core.measure.samples import NvmlStatus
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.protocol import Hello, ProbeBands, Ranked, Step
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.messages import RunFinished
from gpuanat.tui.run_backend import LocalRunBackend
from gpuanat.tui.widgets.gpu_lanes import GpuLanes
from gpuanat.tui.widgets.memory_bar import MemoryBar
from gpuanat.tui.widgets.status_line import StatusLine
from gpuanat.tui.widgets.techniques_panel import TechniquesPanel

DATA = Path(__file__).resolve().parent / "data"
TRACE = DATA / "h200x2_ddp_trace.jsonl"
RESULTS = Path(__file__).resolve().parent.parent / "benchmarks/results/h200x2/multi/results.jsonl"
SIZE = (120, 40)
FROZEN_T_S = 1_000.0
TRAINING_SAMPLES = 84
"""Samples of the trace up to the middle of training (both ranks at their peak from sample 80 on)."""


def ddp_result() -> dict:
    return next(row for row in map(json.loads, RESULTS.read_text().splitlines()) if row["technique"] == "ddp")


def make_app(
    db_path: Path, config: RunConfig, gpu_names: tuple[str, ...] = ("NVIDIA H200", "NVIDIA H200"), trace: Path = TRACE
):
    capabilities = Capabilities(
        torch_version="2.11.0+cu130",
        cuda_available=True,
        cuda_device_name="NVIDIA H200",
        cuda_compute_capability=(9, 0),
        cuda_total_memory_bytes=150_754_820_096,
        deepspeed_version="0.19.8",
        cuda_device_count=len(gpu_names),
    )
    nvml = NvmlStatus(
        available=True, reason=None, driver_version="580.159.04", cuda_driver_version=13000, gpu_names=gpu_names
    )
    return GpuAnatApp(
        config,
        db_path=db_path,
        sampler_factory=lambda: (ReplaySource(trace), nvml),
        backend=LocalRunBackend(db_path, capabilities_probe=lambda: capabilities),
        clock=lambda: FROZEN_T_S,
        sample_interval_s=None,
        paint_interval_s=3600,
    )


def replay_ddp_run(app: GpuAnatApp) -> None:
    """The ddp run as the dashboard saw it mid-training: both ranks' hellos and a measured step each (their
    recorded bands), and the trace's NVML samples up to then."""
    result = ddp_result()
    app.dashboard.follow_run(
        LiveRun(
            config=RunConfig.from_json(result["config"]),
            stop_requested=threading.Event(),
            run_id=result["run_id"],
            pid=999,
            gpu_indices=(0, 1),
        )
    )
    for rank in result["ranks"]:
        bands = rank["bands"]
        probe = ProbeBands(
            weights_bytes=bands["weights_bytes"],
            gradients_bytes=bands["gradients_bytes"],
            optimizer_state_bytes=bands["optimizer_state_bytes"],
            activations_bytes=bands["activations_bytes"],
            activations_method="allocator",
            batch_bytes=0,
            measured_at_step=3,
            optimizer_state_at_forward_end_bytes=bands["optimizer_state_bytes"],
            gradients_at_forward_end_bytes=0,
        )
        step = Step(
            step=3,
            samples=48,
            tokens=24_576,
            step_time_s=0.1,
            elapsed_s=1.0,
            bands=probe,
            reserved_bytes=rank["peak_reserved_bytes"],
        )
        hello = Hello(pid=rank["pid"], versions={}, device="cuda", device_name="NVIDIA H200", config={})
        for event in (hello, step):
            app.dashboard.receive_event(event if rank["rank"] == 0 else Ranked(rank["rank"], event))
    for _ in range(TRAINING_SAMPLES):
        app.dashboard.sample_now()
    app.dashboard.paint()


@pytest.mark.asyncio
async def test_G_and_D_choose_the_gpus_and_the_distributed_technique(tmp_path):
    app = make_app(tmp_path / "h.sqlite", RunConfig(precision="bf16", batch_size=16))
    async with app.run_test(size=SIZE) as pilot:
        while app.dashboard.capabilities is None:
            await pilot.pause()
        await pilot.press("G")
        assert (app.dashboard.config.gpus, app.dashboard.config.distributed) == ("2", "ddp")
        await pilot.press("D")
        assert app.dashboard.config.distributed == "fsdp"
        await pilot.press("D", "D", "D", "D")  # zero1, zero2, zero3, and round to ddp
        assert app.dashboard.config.distributed == "ddp"
        panel = app.query_one(TechniquesPanel).render()
        assert panel is not None
        await pilot.press("G")  # no third GPU: back to one, and one rank trains without a technique
        assert (app.dashboard.config.gpus, app.dashboard.config.distributed) == (None, "none")
        await pilot.press("D")
        assert app.dashboard.config.distributed == "none"
        assert any("several GPUs" in notification.message for notification in app.notices)


@pytest.mark.asyncio
async def test_on_one_gpu_G_says_there_is_nothing_to_choose(tmp_path):
    app = make_app(tmp_path / "h.sqlite", RunConfig(), gpu_names=("NVIDIA H100 80GB HBM3",))
    async with app.run_test(size=SIZE) as pilot:
        while app.dashboard.capabilities is None:
            await pilot.pause()
        await pilot.press("G")
        assert app.dashboard.config.gpus is None
        assert any("One GPU here" in notification.message for notification in app.notices)


@pytest.mark.asyncio
async def test_each_gpu_of_a_run_gets_a_lane_with_its_ranks_bands_and_nvml_reading(tmp_path):
    app = make_app(tmp_path / "h.sqlite", RunConfig(gpus="2", distributed="ddp", precision="bf16", batch_size=16))
    samples = [json.loads(line) for line in TRACE.read_text().splitlines()]
    async with app.run_test(size=SIZE) as pilot:
        while app.dashboard.capabilities is None:
            await pilot.pause()
        replay_ddp_run(app)
        await pilot.pause()
        lanes = app.query_one(GpuLanes).lanes
        assert [(lane.gpu_index, lane.rank) for lane in lanes] == [(0, 0), (1, 1)]
        shown = samples[TRAINING_SAMPLES - 1]["gpus"]
        for lane in lanes:
            assert lane.used_bytes == shown[lane.gpu_index]["used_bytes"]  # that GPU's own reading
            assert lane.bands["weights_bytes"] == ddp_result()["ranks"][lane.rank]["bands"]["weights_bytes"]
            # each rank's own process on its own GPU: context = its NVML use minus its reserved memory
            process = next(p for p in shown[lane.gpu_index]["processes"])
            rank = ddp_result()["ranks"][lane.rank]
            assert lane.bands["cuda_context_bytes"] == process["used_bytes"] - rank["peak_reserved_bytes"]
            assert all(value is None or value >= 0 for value in lane.bands.values())
        app.dashboard.post_message(RunFinished(RunResult.from_json(ddp_result())))
        await pilot.pause()
        finished = app.query_one(GpuLanes).lanes
        assert [lane.used_bytes for lane in finished] == [
            rank["device_memory_used_bytes"] for rank in ddp_result()["ranks"]
        ]


@pytest.mark.asyncio
@pytest.mark.parametrize(
    "config",
    [
        RunConfig(gpus="2", distributed="ddp", precision="bf16", batch_size=16),
        RunConfig(
            preset="llama-3.1-8b",
            gpus="2",
            distributed="fsdp",
            precision="bf16",
            batch_size=1,
            seq_len=2048,
            grad_checkpointing=True,
        ),
        RunConfig(precision="bf16", batch_size=16),
    ],
    ids=["ddp", "llama-fsdp", "one-gpu"],
)
async def test_the_predicted_bands_add_up_to_the_predicted_memory_a_gpu(tmp_path, config):
    """The predicted column's bands, the allocator's reserve beside the tensors included, sum to what the techniques
    panel predicts a GPU holds: one number, the same in both places (other processes unknown: "≥")."""
    app = make_app(tmp_path / "h.sqlite", config)
    async with app.run_test(size=(160, 60)) as pilot:  # room for every technique's row above the prediction
        while app.dashboard.capabilities is None:
            await pilot.pause()
        await pilot.pause()
        text = screen_text(app)
    panel = next(line for line in text.splitlines() if "predicted/GPU:" in line or "predicted peak:" in line)
    predicted = panel.split(":", 1)[1].split(" of ")[0].strip()
    used = next(line for line in text.splitlines() if line.strip().startswith("device used"))
    assert f"≥{predicted} " in used, (panel, used)


def test_dashboard_with_two_gpus(snap_compare, tmp_path):
    app = make_app(tmp_path / "h.sqlite", RunConfig(gpus="2", distributed="ddp", precision="bf16", batch_size=16))

    async def run_before(pilot) -> None:
        while app.dashboard.capabilities is None:
            await pilot.pause()
        replay_ddp_run(app)
        await pilot.pause()

    assert snap_compare(app, terminal_size=SIZE, run_before=run_before)


@pytest.mark.asyncio
async def test_eight_lanes_fit_80x24_with_the_memory_legend_folded_away(tmp_path):
    """A box of 8 GPUs at an SSH session's default size: every lane shows, one row each; the memory bar keeps its
    bar and device-used row and drops its legend (each lane says its GPU's memory), and takes it back at 120×40; at
    200×50 every lane's row is drawn whole (its GPU, rank and reading)."""
    app = make_app(
        tmp_path / "h.sqlite",
        RunConfig(gpus="8", distributed="ddp", precision="bf16", batch_size=16),
        gpu_names=("NVIDIA H200",) * 8,
    )
    result = ddp_result()
    eight = {
        **result,
        "ranks": [{**result["ranks"][index % 2], "rank": index, "gpu_index": index} for index in range(8)],
    }
    async with app.run_test(size=(80, 24)) as pilot:
        while app.dashboard.capabilities is None:
            await pilot.pause()
        app.dashboard.post_message(RunFinished(RunResult.from_json(eight)))
        await pilot.pause()
        lanes = app.query_one(GpuLanes)
        assert [lane.gpu_index for lane in lanes.lanes] == list(range(8))
        assert lanes.region.height == 8 and lanes.region.bottom <= 24 - 1  # above the footer
        assert app.query_one(MemoryBar).region.height == 2  # the bar and "device used"
        assert "8× NVIDIA H200" in str(app.query_one(StatusLine).render())
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert app.query_one(MemoryBar).region.height > 2
        await pilot.resize_terminal(200, 50)  # a large terminal: the same lanes, each row whole
        await pilot.pause()
        assert lanes.region.height == 8 and lanes.region.bottom <= 50 - 1
        drawn = [lanes.render_line(row).text for row in range(8)]
        for index, line in enumerate(drawn):
            assert line.startswith(f"GPU {index} r{index}") and "/" in line, line


@pytest.mark.asyncio
async def test_a_short_techniques_panel_folds_rows_at_their_defaults_and_keeps_the_gpus_and_the_prediction(tmp_path):
    """A decoder over 2 GPUs at 120×40 during a run (lanes and log below): its techniques do not all fit the panel's
    height, so the base rows at their defaults fold into one line, and the GPUs, the distributed technique and the
    prediction stay in sight; a technique changed by its key comes back as a row of its own."""
    config = RunConfig(
        preset="llama-3.1-8b",
        gpus="2",
        distributed="fsdp",
        precision="bf16",
        batch_size=1,
        seq_len=2048,
        grad_checkpointing=True,
    )
    app = make_app(tmp_path / "h.sqlite", config)
    async with app.run_test(size=SIZE) as pilot:
        while app.dashboard.capabilities is None:
            await pilot.pause()
        replay_ddp_run(app)
        await pilot.pause()
        text = screen_text(app)
        folded = next(line for line in text.splitlines() if "at defaults:" in line)
        # the last rows fold first; by their keys where their labels do not fit
        assert "exp. segments" in folded or folded.rstrip("│ ").endswith("…") or "x (? names them)" in folded
        rows = [line for line in text.splitlines() if "at defaults:" not in line]
        for shown in ("GPUs", "distributed", "predicted/GPU:", "Liger layers", "batch size"):
            assert any(shown in line for line in rows), shown
        assert not any("exp. segments" in line for line in rows)
        await pilot.press("x")  # expandable segments on: changed, so a row of its own again
        await pilot.pause()
        text = screen_text(app)
        rows = [line for line in text.splitlines() if "at defaults:" not in line]
        for shown in ("exp. segments", "GPUs", "distributed", "predicted/GPU:"):
            assert any(shown in line for line in rows), shown


@pytest.mark.asyncio
async def test_a_prediction_no_measurement_checked_says_so_beside_it_and_why_in_the_tooltip(tmp_path):
    """llama-3.1-8b under FSDP2 on 2 GPUs in bf16 was measured (docs/several-gpus.md); in fp32 it was not, and on 4
    H200s such a run held 47.42 GiB a GPU for 34.33 predicted: the panel marks that prediction "(unchecked)", and
    its tooltip says what no measurement covered."""
    config = RunConfig(
        preset="llama-3.1-8b",
        gpus="2",
        distributed="fsdp",
        precision="bf16",
        batch_size=1,
        seq_len=2048,
        grad_checkpointing=True,
    )
    for precision, unchecked in (("bf16", False), ("fp32", True)):
        app = make_app(tmp_path / f"{precision}.sqlite", dataclasses.replace(config, precision=precision))
        async with app.run_test(size=(160, 60)) as pilot:
            while app.dashboard.capabilities is None:
                await pilot.pause()
            await pilot.pause()
            panel = next(line for line in screen_text(app).splitlines() if "predicted/GPU" in line)
            tooltip = str(app.query_one(TechniquesPanel).tooltip or "")
        assert ("unchecked" in panel) is unchecked, panel
        assert ("decoders were measured in bf16 only" in tooltip) is unchecked, tooltip


H100X2_GPM_TRACE = DATA / "h100x2_ddp_gpm_trace.jsonl"
"""`gpuanat run --gpus 2 --distributed ddp --trace-out` on the H100 x2 with GPM read on both GPUs; its result:
benchmarks/results/h100x2/gpm_same_steps/run_ddp.json."""


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(80, 24), (120, 40)], ids=["80x24", "120x40"])
async def test_each_gpus_lane_says_its_own_tensor_activity(tmp_path, size):
    """Several GPUs at 80×24 show rank 0's activity row only; each lane says its GPU's busy and tensor figures."""
    result_path = RESULTS.parents[2] / "h100x2" / "gpm_same_steps" / "run_ddp.json"
    result = json.loads(result_path.read_text().splitlines()[-1])
    samples = [json.loads(line) for line in H100X2_GPM_TRACE.read_text().splitlines()]
    training = [
        index
        for index, sample in enumerate(samples)
        if all((gpu["gpu_util_percent"] or 0) > 50 and gpu.get("tensor_active_percent") for gpu in sample["gpus"])
    ]
    shown_at = training[len(training) // 2]
    config = RunConfig.from_json(result["config"])
    app = make_app(tmp_path / "h.sqlite", config, ("NVIDIA H100 80GB HBM3",) * 2, H100X2_GPM_TRACE)
    async with app.run_test(size=size) as pilot:
        while app.dashboard.capabilities is None:
            await pilot.pause()
        app.dashboard.follow_run(
            LiveRun(config=config, stop_requested=threading.Event(), run_id=1, pid=999, gpu_indices=(0, 1))
        )
        for _ in range(shown_at + 1):
            app.dashboard.sample_now()
        app.dashboard.paint()
        await pilot.pause()
        lanes = app.query_one(GpuLanes)
        drawn = [lanes.render_line(row).text for row in range(len(lanes.lanes))]
    assert len(drawn) == 2
    for index, line in enumerate(drawn):
        gpu = samples[shown_at]["gpus"][index]
        busy, tensor = round(gpu["gpu_util_percent"]), round(gpu["tensor_active_percent"])
        assert line.startswith(f"GPU {index} r{index}"), line
        tensor_text = f"· tensor {tensor}%" if size[0] >= 60 else f"t{tensor}%"
        assert f"{busy:3d}% {tensor_text}".replace("  ", " ") in " ".join(line.split()), line
        assert len(line.rstrip()) <= size[0]
