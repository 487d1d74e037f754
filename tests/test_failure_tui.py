"""An out-of-memory failure in the dashboards, and memory by module (`b`), on a failure recorded on a GPU.

The H200's failure in an optimizer step (benchmarks/oom/optimizer_step.py, its probe's events in
benchmarks/results/h200/oom/optimizer_events.jsonl) is replayed through the launching dashboard's run backend
(`recorded_backend.RecordedOomBackend`: the events as a run delivers them, then the result gpuanat makes of them) and
as the events of a process `gpuanat watch` follows (a real process, the real watch session). The apps are real,
headless (Pilot); this machine has no NVML, so the memory at the failure is what the probe read then. The history
pane's `b` reads the H200's recorded history of out-of-memory runs (tests/data/h200_oom_history.sqlite).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from recorded_backend import OOM_EVENTS, RecordedOomBackend, oom_config
from test_first_minute import screen_text
from test_tui import wait_for

from gpuanat.core.measure.anatomy import stack_total_bytes
from gpuanat.core.measure.process_tree import HostOnlySource
from gpuanat.core.measure.samples import NvmlStatus
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.report import format_bytes
from gpuanat.core.vocabulary.protocol import MODULES_REST, OutOfMemory, decode
from gpuanat.core.watch.target import resolve_target
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.screens.history import HistoryScreen
from gpuanat.tui.screens.modules import ModulesScreen, module_rows
from gpuanat.tui.shell import DashboardApp
from gpuanat.tui.watch_app import WatchApp
from gpuanat.tui.widgets.failure_line import FailureLine, out_of_memory_sentence
from gpuanat.tui.widgets.memory_bar import MemoryBar

H200_OOM_HISTORY = Path(__file__).resolve().parent / "data" / "h200_oom_history.sqlite"
"""Out-of-memory runs recorded on an H200 (benchmarks/oom/oom_check.py)."""
NO_NVML = NvmlStatus(
    available=False, reason="no NVML on this machine", driver_version=None, cuda_driver_version=None, gpu_names=()
)


def oom_app(tmp_path, *, hold: bool) -> tuple[GpuAnatApp, RecordedOomBackend]:
    """The launching dashboard configured as the recorded run, whose `r` replays the failure (held before its result
    with `hold`: the caller releases it, or the dashboard's exit waits for the run); no sampler thread, a frozen
    clock."""
    backend = RecordedOomBackend(tmp_path, hold=hold)
    app = GpuAnatApp(
        oom_config(),
        db_path=tmp_path / "h.sqlite",
        backend=backend,
        sampler_factory=lambda: (HostOnlySource(per_process=True), NO_NVML),
        sample_interval_s=None,
        paint_interval_s=3600,
        clock=lambda: 1_000.0,
    )
    return app, backend


async def run_until_it_fails(app: GpuAnatApp, pilot) -> None:
    """r, once the machine is probed; returns when the dashboard has painted the failure."""
    await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
    await pilot.press("r")

    def failed() -> bool:
        app.dashboard.paint()  # the paint tick, which the test drives
        return app.dashboard.failure_line.failure is not None

    await wait_for(pilot, failed, timeout_s=30, what="the failure on screen")
    await pilot.pause()


def the_sentence(failure: OutOfMemory) -> str:
    """What the line must say of the recorded failure, from its own figures."""
    assert failure.failed_allocation_bytes is not None and failure.device_free_bytes is not None
    return (
        f"out of memory in the optimizer step ({failure.operation}), step {failure.step}: "
        f"tried {format_bytes(failure.failed_allocation_bytes)}, {format_bytes(failure.device_free_bytes)} free"
    )


def assert_the_failure_shown(app: DashboardApp, failure: OutOfMemory) -> dict[str, int | None]:
    """The failure line says what failed and the largest tensor; the bar shows every band at the failing allocation,
    from the readings the probe took then (they add up to NVML's device used then). Returns the bar's bands."""
    shown = words(screen_text(app))
    assert words(the_sentence(failure)) in shown, shown
    assert failure.largest_tensors
    largest = failure.largest_tensors[0]
    assert f"largest tensor: {largest.band} of {largest.module}, {format_bytes(largest.bytes)}" in shown, shown
    bands = dict(app.query_one(MemoryBar).current)
    probe = failure.bands
    assert probe is not None
    assert bands["weights_bytes"] == probe.weights_bytes
    assert bands["gradients_bytes"] == probe.gradients_at_forward_end_bytes
    assert bands["optimizer_state_bytes"] == probe.optimizer_state_at_forward_end_bytes
    assert bands["activations_bytes"] == probe.activations_bytes
    assert failure.nvml_device_used_bytes is not None and failure.device_total_bytes is not None
    assert stack_total_bytes(bands) == failure.nvml_device_used_bytes
    assert bands["free_bytes"] == failure.device_total_bytes - failure.nvml_device_used_bytes
    return bands


async def assert_memory_by_module_at_the_failure(app: DashboardApp, pilot, failure: OutOfMemory) -> ModulesScreen:
    """`b` opens the modules at the failing allocation: every module the probe listed, largest first, the rest last,
    their columns the bands."""
    await pilot.press("b")
    await pilot.pause()
    screen = app.screen
    assert isinstance(screen, ModulesScreen)
    assert "at the failing allocation" in screen.shown.title
    assert failure.bands is not None and failure.bands.modules
    rows = screen.rows
    assert sorted(row["module"] for row in rows) == sorted(row.module for row in failure.bands.modules)
    assert rows[-1]["module"] == MODULES_REST
    totals = [row["total_bytes"] for row in rows[:-1]]
    assert totals == sorted(totals, reverse=True)
    assert sum(row["parameters_bytes"] for row in rows) == failure.bands.weights_bytes
    assert sum(row["optimizer_state_bytes"] for row in rows) == pytest.approx(failure.bands.optimizer_state_bytes, 1e-4)
    shown = words(screen_text(app))
    assert largest_module_first(rows) in shown and "(the rest)" in shown and words(the_sentence(failure))[:40] in shown
    return screen


def words(text: str) -> str:
    """`text` with each run of white space one space, and without a view's border: as a screen shows it, wrapped."""
    return " ".join(text.replace("│", " ").split())


def largest_module_first(rows: list[dict]) -> str:
    return rows[0]["module"] or "(the model)"


@pytest.mark.asyncio
async def test_a_recorded_gpu_out_of_memory_shows_what_failed_and_the_memory_then(tmp_path):
    app, backend = oom_app(tmp_path, hold=True)
    failure = backend.failure
    assert failure is not None
    try:
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await run_until_it_fails(app, pilot)
            # the run has failed, its result not recorded yet: the line, the bar, the top line say so
            live_bands = assert_the_failure_shown(app, failure)
            assert app.dashboard.run_state_text == f"run 1: out of memory at step {failure.step}"
            screen = await assert_memory_by_module_at_the_failure(app, pilot, failure)
            live_rows = screen.rows
            await pilot.press("b")  # b again: closed
            assert not isinstance(app.screen, ModulesScreen)
            backend.release.set()
            await wait_for(pilot, lambda: app.dashboard.last_result is not None, what="the result")
            await pilot.pause()
            # the run has ended: its result holds the same bands, and the dashboard keeps showing the failure
            result = app.dashboard.last_result
            assert result is not None and result.status == "oom" and result.bands is not None
            assert assert_the_failure_shown(app, failure) == live_bands == result.bands.values()
            assert app.query_one(FailureLine).failure == result.out_of_memory
            assert app.dashboard.run_state_text.startswith("idle · last run oom")
            assert any(
                words(notice.message) == words(f"Run 1: oom — {the_sentence(failure)}") and notice.severity == "error"
                for notice in app.notices
            )
            screen = await assert_memory_by_module_at_the_failure(app, pilot, failure)
            assert screen.rows == live_rows and "run 1 (oom)" in screen.shown.title
    finally:
        backend.release.set()  # a failed check must not leave the run waiting


@pytest.mark.asyncio
@pytest.mark.parametrize("exits_first", [False, True], ids=["seen-alive", "exited-before-a-sample"])
async def test_a_watched_process_that_runs_out_of_memory_shows_what_failed_and_the_memory_then(tmp_path, exits_first):
    """The recorded events published by a real process: read at the next sample while it lives, or — as a process
    that runs out of memory often does — it exits first, and the watch's last record brings them."""
    events = [decode(line) for line in OOM_EVENTS.read_text().splitlines()]
    failure = next(event.out_of_memory for event in events if getattr(event, "out_of_memory", None) is not None)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
    try:
        app = WatchApp(
            resolve_target(child.pid),
            db_path=tmp_path / "h.sqlite",
            interval_s=None,
            paint_interval_s=3600,
            sampler_factory=lambda: (HostOnlySource(per_process=True), NO_NVML),
        )
        async with app.run_test(size=(120, 40)) as pilot:
            app.dashboard.sample_now()
            app.dashboard.paint()
            assert app.query_one(FailureLine).failure is None
            session = app.dashboard.session
            assert session is not None
            session.add_events(child.pid, events)
            if exits_first:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
            app.dashboard.sample_now()
            app.dashboard.paint()
            await pilot.pause()
            assert app.dashboard.exited == exits_first
            assert_the_failure_shown(app, failure)
            assert "✗ out of memory" in screen_text(app)  # a watched run has no run id
            await assert_memory_by_module_at_the_failure(app, pilot, failure)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


@pytest.mark.asyncio
async def test_b_in_the_history_shows_a_recorded_run_s_modules_at_its_failure(tmp_path):
    """The recorded H200 history of out-of-memory runs: `b` on a run in the history pane shows its modules at the
    failing allocation, as its result holds them, and what failed."""
    shutil.copy(H200_OOM_HISTORY, tmp_path / "h.sqlite")
    with HistoryStore(tmp_path / "h.sqlite", read_only=True) as store:
        runs = store.runs()
    failed = [run for run in runs if run.result.modules and run.result.out_of_memory]
    assert failed, "the recording holds a run with its modules at an out-of-memory failure"
    run = failed[-1]
    app, _ = oom_app(tmp_path, hold=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("h")
        ids = app.screen.shown_run_ids  # the cursor starts on the newest
        await pilot.press(*["up"] * (len(ids) - 1 - ids.index(run.id)), "b")
        await pilot.pause()
        screen = app.screen
        assert isinstance(screen, ModulesScreen) and not screen.follows_dashboard
        assert screen.shown.title.startswith(f"run {run.id} (oom), at the failing allocation")
        assert screen.rows == module_rows(run.result.modules)
        assert words(out_of_memory_sentence(run.result.out_of_memory)) in words(screen_text(app))
        await pilot.press("b")
        assert isinstance(app.screen, HistoryScreen)
