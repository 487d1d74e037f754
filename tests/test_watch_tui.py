"""The watch dashboard (`gpuanat watch PID` without --json): SVG snapshots of the H100 recording replayed as a
watched process, and the real app, headless, watching a real process through the real sampler thread."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest
from test_first_minute import screen_text
from textual.binding import Binding
from watch_replay import STEPS, TRACE, make_watch_app, replay

from gpuanat.core.measure.process_tree import HostOnlySource
from gpuanat.core.measure.samples import NvmlStatus
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.watch.target import resolve_target
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.watch_app import WatchApp
from gpuanat.tui.widgets.memory_bar import MemoryBar
from gpuanat.tui.widgets.process_panel import ProcessPanel

recorded = pytest.mark.skipif(not (TRACE.exists() and STEPS.exists()), reason="H100 recordings not committed")


@recorded
def test_watch_dashboard_with_the_published_anatomy(snap_compare, tmp_path):
    app = make_watch_app(tmp_path / "h.sqlite", tmp_path / "proc")

    async def run_before(pilot) -> None:
        replay(app, until_elapsed_s=3.0)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


@recorded
def test_watch_dashboard_of_a_process_that_does_not_publish_80x24(snap_compare, tmp_path):
    app = make_watch_app(tmp_path / "h.sqlite", tmp_path / "proc")

    async def run_before(pilot) -> None:
        app.theme = "ansi-dark"
        replay(app, until_elapsed_s=3.0, published=False)
        await pilot.pause()

    assert snap_compare(app, terminal_size=(80, 24), run_before=run_before)


@recorded
def test_the_app_is_ready_only_once_its_dashboard_has_mounted(tmp_path):
    """What drives the app (an autopilot, a snapshot's `run_before`) finds the dashboard's session and sampler set up
    at once: the dashboard is its mode's base screen, whose mount the app awaits before it is ready."""
    app = make_watch_app(tmp_path / "h.sqlite", tmp_path / "proc")
    seen: list[bool] = []

    async def auto_pilot(pilot) -> None:
        seen.append(app.dashboard.session is not None and app.dashboard.is_mounted)
        app.exit()

    app.run(headless=True, auto_pilot=auto_pilot, size=(120, 40))
    assert seen == [True]


def test_watch_mode_has_no_launch_or_technique_keys():
    watch_keys = {binding.id for binding in WatchApp.BINDINGS if isinstance(binding, Binding)}
    launch_only = {binding.id for binding in GpuAnatApp.BINDINGS if isinstance(binding, Binding)} - watch_keys
    assert {"run", "stop", "fit", "precision", "batch_up", "grad_checkpointing"} <= launch_only
    assert "save_watched" in watch_keys and all(binding.description for binding in WatchApp.BINDINGS)


@pytest.mark.asyncio
async def test_the_dashboard_watches_a_real_process_saves_it_and_sees_it_exit(tmp_path):
    child = subprocess.Popen(
        [sys.executable, "-c", "b = b'x' * (64 * 1024 * 1024)\nwhile True: pass"], start_new_session=True
    )
    db_path = tmp_path / "history.sqlite"
    nvml = NvmlStatus(
        available=False, reason="no NVML in this test", driver_version=None, cuda_driver_version=None, gpu_names=()
    )
    try:
        started = time.monotonic()  # the child has its 64 MiB (a loaded machine starts Python slowly)
        while psutil.Process(child.pid).memory_info().rss < 64 * 1024 * 1024:
            assert time.monotonic() < started + 30, "the child never held its 64 MiB"
            time.sleep(0.05)
        app = WatchApp(
            resolve_target(child.pid),
            db_path=db_path,
            interval_s=0.1,
            paint_interval_s=0.1,
            sampler_factory=lambda: (HostOnlySource(per_process=True), nvml),
        )
        async with app.run_test(size=(120, 40)) as pilot:
            deadline = time.monotonic() + 30
            while app.dashboard.last_record is None or not app.dashboard.last_record.get("processes"):
                assert time.monotonic() < deadline, "no record reached the dashboard"
                await pilot.pause(0.1)
            assert app.dashboard.last_record["rss_bytes"] >= 64 * 1024 * 1024
            # no NVML: whether other processes use the GPU is unknown, not "none" (issue #17)
            assert "other processes on the GPU  unknown" in str(app.query_one(ProcessPanel).render())
            # and the GPU charts, which can never fill, say why instead of waiting (issue #48, point 11)
            await pilot.pause(0.2)
            shown = screen_text(app)
            assert shown.count("no GPU samples: no NVML in this test") == 2, shown  # memory and utilization
            # and so does the memory bar's measured row, whose reading can never come either
            measured_row = next(line for line in shown.splitlines() if line.lstrip().startswith("measured"))
            assert "no GPU readings: no NVML in this test" in measured_row, shown
            footer_keys = {binding.key for (_, binding, enabled, _) in app.screen.active_bindings.values()}
            assert "s" in footer_keys and "r" not in footer_keys
            await pilot.press("r", "g", "p")  # launch and technique keys of the other dashboard do nothing here
            await pilot.press("s")
            while app.dashboard.saved_run_id is None:
                assert time.monotonic() < deadline, "the save was not confirmed"
                await pilot.pause(0.1)
            bar = app.query_one(MemoryBar)
            assert bar._unavailable["weights_bytes"].startswith("not published")
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
            while not app.dashboard.exited:
                assert time.monotonic() < deadline + 30, "the dashboard did not notice the exit"
                await pilot.pause(0.1)
            await pilot.pause(0.3)
            assert "has exited" in app.dashboard.state_text
            await pilot.press("q")
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    with HistoryStore(db_path) as store:
        (run,) = store.runs()
        samples = store.samples(run.id)
    assert (run.kind, run.status) == ("watched", "exited")
    assert samples and run.result.peak_rss_bytes >= 64 * 1024 * 1024
    assert not psutil.pid_exists(child.pid) or psutil.Process(child.pid).status() == psutil.STATUS_ZOMBIE


@pytest.mark.asyncio
async def test_samples_that_leave_the_picture_as_it_was_repaint_nothing(tmp_path, monkeypatch):
    """Issue #18: over SSH every repainted cell costs bytes. The H100 recording replayed, then its last reading
    delivered again (same values, same time): every series grows, nothing on screen changes, so no widget is
    repainted, whole or in part."""
    import dataclasses

    from textual.widget import Widget

    from gpuanat.tui.widgets.cached_rows import CachedRows

    app = make_watch_app(tmp_path / "h.sqlite", tmp_path / "proc")
    async with app.run_test(size=(120, 40)) as pilot:
        replay(app, until_elapsed_s=3.0)
        await pilot.pause()
        widgets = list(app.query(CachedRows))
        assert {type(widget).__name__ for widget in widgets} >= {"LineChart", "MemoryBar", "ProcessPanel", "StatusLine"}
        last = app.dashboard.sample_now()
        app.dashboard.paint()
        await pilot.pause()
        whole_refreshes = []
        refresh = Widget.refresh

        def counted(widget, *regions, **flags):
            if isinstance(widget, CachedRows) and not regions:
                whole_refreshes.append(widget.id)
            return refresh(widget, *regions, **flags)

        monkeypatch.setattr(Widget, "refresh", counted)
        for widget in widgets:
            widget.repainted_cells = 0
        versions = {name: series.version for name, series in app.dashboard.series.items()}
        for _ in range(3):
            app.dashboard.receive_sample(dataclasses.replace(last))
            app.dashboard.paint()
            await pilot.pause()
        assert app.dashboard.series["device_used"].version == versions["device_used"] + 3
        assert whole_refreshes == []
        assert {widget.id: widget.repainted_cells for widget in widgets if widget.repainted_cells} == {}


@recorded
@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_the_process_panel_renders_only_its_changed_lines_as_the_whole_text_would(tmp_path, monkeypatch, size):
    """The panel makes rows of only the lines a sample changed, and takes the layout's height from its lines: at
    every sample of the recording its rows and height are those of its whole text rendered afresh (at 80 columns the
    command wraps)."""
    from gpuanat.tui.widgets import cached_rows, process_panel

    app = make_watch_app(tmp_path / "h.sqlite", tmp_path / "proc")
    async with app.run_test(size=size) as pilot:
        replay(app, until_elapsed_s=1.0)
        await pilot.pause()
        panel = app.query_one(ProcessPanel)
        rendered_lines = []

        def counted(make_rows):
            def make(widget, text, width, *place):
                rendered_lines.append(text.plain)
                return make_rows(widget, text, width, *place)

            return make

        monkeypatch.setattr(process_panel, "text_rows", counted(process_panel.text_rows))
        monkeypatch.setattr(process_panel, "text_line_row", counted(process_panel.text_line_row))
        rendered_per_sample = []
        for _ in range(12):
            rendered_lines.clear()
            app.dashboard.sample_now()
            app.dashboard.paint()
            await pilot.pause()
            text, width = panel.render(), panel.size.width
            assert panel.size.height == cached_rows.text_height(panel, text, width)
            whole = cached_rows.text_rows(panel, text, width, panel.size.height)
            assert [panel.render_line(y) for y in range(panel.size.height)] == whole
            assert len(rendered_lines) < len(text.plain.splitlines()) / 2, rendered_lines
            rendered_per_sample.append(len(rendered_lines))
        assert sum(rendered_per_sample) > 0


@recorded
@pytest.mark.asyncio
async def test_an_update_renders_only_the_lines_it_sends_and_the_same_chops(tmp_path, monkeypatch):
    """Of the widgets under a partial update, only the rows between their first and last line sent are rendered (not
    every line under the update's bounding box); the chops sent are Textual's own."""
    from textual.geometry import Region
    from textual.widget import Widget

    from gpuanat.tui import textual_internals as partial_update

    app = make_watch_app(tmp_path / "h.sqlite", tmp_path / "proc")
    async with app.run_test(size=(120, 40)) as pilot:
        replay(app, until_elapsed_s=3.0)
        await pilot.pause()
        compositor = partial_update.screen_compositor(app.screen)
        rendered_rows = []
        render_lines = Widget.render_lines

        def counted(widget, crop):
            rendered_rows.append(crop.height)
            return render_lines(widget, crop)

        monkeypatch.setattr(Widget, "render_lines", counted)
        sent = {1, 6, 30}.__contains__  # a chart's legend, the process tree, the memory bar
        crop = Region(0, 1, 120, 30)
        textual_chops = partial_update.TEXTUAL_RENDER_CHOPS(compositor, crop, sent)
        textual_rows, rendered_rows[:] = sum(rendered_rows), []
        chops = partial_update.render_chops(compositor, crop, sent)
        assert [dict(line) for line in chops] == [dict(line) for line in textual_chops]
        assert any(line for line in (chops[1], chops[6], chops[30])) and not any(chops[2].values())
        assert sum(rendered_rows) < textual_rows / 2, (sum(rendered_rows), textual_rows)
        assert partial_update.render_sent_lines_only() and type(compositor)._render_chops is partial_update.render_chops
