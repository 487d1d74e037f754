"""Every view at 80×24 (an SSH session's default), 120×40 and 200×50, by SVG snapshot, on the recorded H100 run and
history: the dashboard, the key page (`?`), the history pane, the compare view and the watch dashboard. The sizes the
other snapshot files already take (the dashboard at 120×40 and 80×24, history and compare at 120×40) are not
taken twice; memory by module (`b`) and an out-of-memory failure are at 80×24 in test_app_snapshots.py."""

from __future__ import annotations

import pytest
from test_app_snapshots import fill_history, h100_run_app, make_app, replayed

from gpuanat.core.vocabulary.config import RunConfig

COMPARE_KEYS = ["h", *["up"] * 10, "space", "down", "down", "space", "enter"]
"""Vanilla (row 1) against fp16 (row 4) of the recorded sweep: the cursor starts on the newest run (row 11)."""


@pytest.mark.parametrize("size", [(200, 50)], ids=["200x50"])
def test_the_dashboard_during_the_h100_run(snap_compare, tmp_path, size):
    app = h100_run_app(tmp_path / "h.sqlite")
    assert snap_compare(app, terminal_size=size, run_before=lambda pilot: replayed(app, pilot))


@pytest.mark.parametrize("size", [(80, 24), (120, 40), (200, 50)], ids=["80x24", "120x40", "200x50"])
def test_the_key_page(snap_compare, tmp_path, size):
    app = h100_run_app(tmp_path / "h.sqlite")

    async def run_before(pilot) -> None:
        await replayed(app, pilot)
        await pilot.press("question_mark")
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
def test_the_history_pane(snap_compare, tmp_path, size):
    fill_history(tmp_path / "h.sqlite")
    app = make_app(tmp_path / "h.sqlite", RunConfig())
    assert snap_compare(app, terminal_size=size, press=["h"])


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
def test_the_compare_view(snap_compare, tmp_path, size):
    fill_history(tmp_path / "h.sqlite")
    app = make_app(tmp_path / "h.sqlite", RunConfig())
    assert snap_compare(app, terminal_size=size, press=COMPARE_KEYS)


@pytest.mark.parametrize("size", [(80, 24), (200, 50)], ids=["80x24", "200x50"])
def test_the_watch_dashboard_of_a_published_run(snap_compare, tmp_path, size):
    from watch_replay import make_watch_app, replay

    app = make_watch_app(tmp_path / "h.sqlite", tmp_path / "proc")

    async def run_before(pilot) -> None:
        replay(app, until_elapsed_s=3.0)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)
