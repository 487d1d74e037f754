"""What a person meets in the first minute on a GPU box (issue #32), each at the size where it happened: the real
dashboard headless (Pilot) on the recorded H100 environment."""

from __future__ import annotations

import pytest
from test_app_snapshots import fill_history, make_app
from textual.widgets._toast import Toast

from gpuanat.core.run.config import RunConfig
from gpuanat.tui.screens.compare import CompareScreen
from gpuanat.tui.screens.history import HistoryScreen
from gpuanat.tui.screens.keys import KeysScreen


async def ready(app, pilot) -> None:
    while app.capabilities is None:
        await pilot.pause()


@pytest.mark.asyncio
async def test_enter_in_the_history_without_a_selection_compares_the_last_two_runs(tmp_path):
    fill_history(tmp_path / "h.sqlite")
    app = make_app(tmp_path / "h.sqlite", RunConfig())
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await pilot.press("h")
        assert isinstance(app.screen, HistoryScreen)
        last_two = sorted(app.screen.shown_run_ids)[-2:]
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        assert app.screen.comparison.run_ids == tuple(last_two)  # the older is the baseline


@pytest.mark.asyncio
async def test_one_selected_run_is_compared_with_the_latest_other(tmp_path):
    fill_history(tmp_path / "h.sqlite")
    app = make_app(tmp_path / "h.sqlite", RunConfig())
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await pilot.press("h")
        await pilot.press("up")  # the cursor starts on the latest run: one before it
        selected = app.screen._cursor_run_id()
        latest = max(app.screen.shown_run_ids)
        assert selected != latest
        await pilot.press("space", "enter")
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        assert app.screen.comparison.run_ids == (selected, latest)


@pytest.mark.asyncio
async def test_a_notification_does_not_cover_the_key_page(tmp_path):
    app = make_app(tmp_path / "h.sqlite", RunConfig())
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await ready(app, pilot)
        app.notify("a long notification that would cover the lines of the key page", timeout=30)
        await pilot.pause(0.2)
        assert [toast.display for toast in app.screen.query(Toast)] == [True]  # on the dashboard it shows
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, KeysScreen)
        assert app.screen.query(Toast) and not any(toast.display for toast in app.screen.query(Toast))
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert [toast.display for toast in app.screen.query(Toast)] == [True]  # still due: shown again
