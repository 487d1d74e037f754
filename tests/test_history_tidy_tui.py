"""The dashboard's history kept tidy (issue #52): `t` tags the selected runs, `d` deletes them after a modal question
(no keeps them), `e` expands a tune's trials folded into one row, `/` filters by tag; each key a declarative binding
in the footer and on the `?` page. The real app headless (Pilot) on a real history, writing through its real
worker threads; a hostile tag is drawn escaped."""

from __future__ import annotations

import pytest
from hostile import raw_in_terminal_output
from test_run_names import cpu_dashboard
from textual.app import App

from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.tui.screens.confirm import ConfirmScreen
from gpuanat.tui.screens.history import HistoryScreen
from gpuanat.tui.screens.keys import KeysScreen
from gpuanat.tui.screens.rename import TagScreen
from gpuanat.tui.textual_internals import screen_compositor

HOSTILE_TAG = "[b]x[/b] owned"
"""Markup, drawn as typed (the input box takes no control characters: `history --tag` shows those escaped,
tests/test_history_tidy.py)."""


def frame(app: App) -> str:
    """The screen's text, after checking that a full repaint sends the terminal nothing raw."""
    compositor = screen_compositor(app.screen)
    sent = compositor.render_full_update().render_segments(app.console)
    assert not raw_in_terminal_output(sent), raw_in_terminal_output(sent)
    return "\n".join("".join(segment.text for segment in strip) for strip in compositor.render_strips())


def fill(db) -> tuple[list[int], int, list[int]]:
    """Two runs of their own, then a tune of three trials (the second the fastest): as `execute_run` records them."""
    with HistoryStore(db) as store:
        plain = []
        for index in range(2):
            run_id = store.create_run({"preset": "tiny", "batch_size": 4, "device": "cpu"}, name=f"plain {index}")
            store.add_steps(run_id, [{"step": 1, "elapsed_s": 0.1}])
            store.update_result(run_id, RunResult(run_id=run_id, status="ok", samples_per_second=10.0), status="ok")
            plain.append(run_id)
        search_id = store.create_search("tune", "tune tiny")
        trials = []
        for index, rate in enumerate([100.0, 150.0, 120.0], start=1):
            run_id = store.create_run(
                {"preset": "tiny", "batch_size": 4 * index, "device": "cpu"}, name=f"tune {index}", search_id=search_id
            )
            store.update_result(
                run_id, RunResult(run_id=run_id, status="ok", steady_samples_per_second=rate), status="ok"
            )
            trials.append(run_id)
    return plain, search_id, trials


def stored(db) -> dict[int, tuple[str, ...]]:
    with HistoryStore(db, read_only=True) as store:
        return {run.id: run.tags for run in store.runs()}


@pytest.mark.asyncio
async def test_the_history_tags_deletes_after_asking_and_expands_a_search(db_path):
    plain, search_id, trials = fill(db_path)
    app = cpu_dashboard(db_path)
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await pilot.press("h")
        screen = app.screen
        assert isinstance(screen, HistoryScreen)
        shown = frame(app)
        assert all(word in shown for word in ("Tag", "Delete", "Expand"))  # in the footer
        assert screen.shown_keys == [str(plain[0]), str(plain[1]), f"s{search_id}"]
        assert f"tune tiny · 3 trials, best: run {trials[1]}" in shown

        await pilot.press("e")  # the cursor starts on the newest row: the search, expanded
        assert screen.shown_keys == [*map(str, plain), *map(str, trials)]
        assert screen.cursor_run_id == trials[1]
        await pilot.press("e")  # on a trial: folded again
        assert screen.shown_keys == [str(plain[0]), str(plain[1]), f"s{search_id}"]

        await pilot.press("up", "up", "space", "space", "t")  # the two plain runs selected
        assert isinstance(app.screen, TagScreen)
        await pilot.press(*HOSTILE_TAG, "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.screen is screen
        assert stored(db_path) == {plain[0]: (HOSTILE_TAG,), plain[1]: (HOSTILE_TAG,), **dict.fromkeys(trials, ())}
        assert HOSTILE_TAG in frame(app)  # drawn as typed, in the tags column: never parsed as markup
        await pilot.press("slash", *"owned", "enter")  # the filter finds the tag
        assert screen.shown_keys == [str(plain[0]), str(plain[1])]
        await pilot.press("escape")

        await pilot.press("d")  # the two selected runs: asked first, listed
        assert isinstance(app.screen, ConfirmScreen)
        question = frame(app)
        assert "Delete 2 runs with their steps, samples, tags and logs?" in question
        assert f"run {plain[0]} · " in question and " · “plain 1” · ok" in question
        await pilot.press("n")
        await app.workers.wait_for_complete()
        assert app.screen is screen and len(stored(db_path)) == 5

        await pilot.press("d", "y")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert sorted(stored(db_path)) == trials
        assert screen.shown_keys == [f"s{search_id}"] and screen.selected == []

        await pilot.press("d")  # the folded search: every trial
        assert "Delete 3 runs" in frame(app)
        await pilot.press("y")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert stored(db_path) == {} and screen.shown_keys == []

        await pilot.press("question_mark")  # the key page, over the history, lists its keys
        assert isinstance(app.screen, KeysScreen)
        listed = {what for rows in app.screen.rows.values() for _keys, what in rows}
        assert {"Tag", "Delete", "Expand", "Rename"} <= listed
        assert app.is_running and app.return_code is None


@pytest.mark.asyncio
async def test_a_run_being_recorded_is_not_deleted_from_the_dashboard(db_path):
    plain, _, _ = fill(db_path)
    with HistoryStore(db_path) as recorder:  # this process records a run now: alive, running
        live = recorder.create_run({"preset": "tiny"}, name="live")
        app = cpu_dashboard(db_path)
        async with app.run_test(size=(160, 40), notifications=True) as pilot:
            await pilot.press("h", "d", "y")  # the cursor starts on the newest: the live run
            await app.workers.wait_for_complete()
            await pilot.pause()
            assert isinstance(app.screen, HistoryScreen) and str(live) in app.screen.shown_keys
            assert any("still being recorded" in notice.message for notice in app.notices)
        assert live in stored(db_path)
        recorder.update_result(live, RunResult(run_id=live, status="ok"), status="ok")
    assert plain[0] in stored(db_path)
