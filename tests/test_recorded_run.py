"""The launching dashboard driven as a person would (Pilot presses r) over a run recorded on an H100: the recorded
backend (`recorded_backend`) delivers the run's start, its probe's events and its result through the same hooks and
messages as a live run's, and the dashboard paints them."""

from __future__ import annotations

import pytest
from recorded_backend import TRACE, RecordedRunBackend, recorded_config

from gpuanat.core.measure.replay import ReplaySource
from gpuanat.core.measure.samples import NvmlStatus
from gpuanat.tui.app import GpuAnatApp

NVML = NvmlStatus(
    available=True,
    reason=None,
    driver_version="580.159.04",
    cuda_driver_version=13000,
    gpu_names=("NVIDIA H100 80GB HBM3",),
)


def recorded_app(db_path, backend: RecordedRunBackend) -> GpuAnatApp:
    return GpuAnatApp(
        recorded_config(),
        db_path=db_path,
        backend=backend,
        sampler_factory=lambda: (ReplaySource(TRACE), NVML),
        sample_interval_s=None,
        paint_interval_s=0.05,
    )


async def wait_until(pilot, condition, what: str, *, timeout_s: float = 30.0) -> None:
    waited_s = 0.0
    while not condition():
        assert waited_s < timeout_s, f"never: {what}"
        await pilot.pause(0.05)
        waited_s += 0.05


@pytest.mark.asyncio
async def test_r_runs_the_recorded_run_and_its_steps_and_result_land(db_path):
    backend = RecordedRunBackend()
    app = recorded_app(db_path, backend)
    async with app.run_test(size=(120, 40)) as pilot:
        dashboard = app.dashboard
        await wait_until(pilot, lambda: dashboard.capabilities is not None, "the capabilities")
        assert dashboard.run_state_text == "idle"
        await pilot.press("r")
        await wait_until(pilot, lambda: dashboard.last_result is not None, "the run's result")
        assert backend.runs == 1 and dashboard.run_in_progress is None
        result = dashboard.last_result
        assert result.run_id == 12 and result.status == "ok" and result.steps == 60
        assert len(dashboard.series["throughput"]) > 0  # the recorded steps' samples/s reached the chart
        assert any(notice.message == "Run 12: ok, steady 99.8 samples/s" for notice in app.notices)
        assert dashboard.run_state_text == "idle · last run ok"


@pytest.mark.asyncio
async def test_the_run_in_progress_shows_the_recorded_steps_as_they_come(db_path):
    backend = RecordedRunBackend(step_pause_s=0.05)
    app = recorded_app(db_path, backend)
    async with app.run_test(size=(120, 40)) as pilot:
        dashboard = app.dashboard
        await wait_until(pilot, lambda: dashboard.capabilities is not None, "the capabilities")
        await pilot.press("r")
        await wait_until(
            pilot,
            lambda: dashboard.run_in_progress is not None and dashboard.run_in_progress.last_step is not None,
            "a step",
        )
        live = dashboard.run_in_progress
        assert live.run_id == 12 and live.pid == 2348
        assert dashboard.run_state_text.startswith("run 12: step ") and "/60 · " in dashboard.run_state_text
        await wait_until(pilot, lambda: dashboard.last_result is not None, "the run's result")
        assert dashboard.run_in_progress is None and dashboard.last_result.status == "ok"
        assert live.last_step is not None and live.last_step.step == 60  # every recorded step, in order


@pytest.mark.asyncio
async def test_a_search_over_a_recording_ends_saying_why(db_path):
    """f needs real trial runs: the recorded backend refuses, and the dashboard says so and is idle again."""
    app = recorded_app(db_path, RecordedRunBackend())
    async with app.run_test(size=(120, 40)) as pilot:
        dashboard = app.dashboard
        await wait_until(pilot, lambda: dashboard.capabilities is not None, "the capabilities")
        await pilot.press("f")
        await wait_until(pilot, lambda: any("fit stopped" in n.message for n in app.notices), "fit's end")
        assert dashboard.run_in_progress is None
        assert any("a recorded run cannot be searched" in notice.message for notice in app.notices)
