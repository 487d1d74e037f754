"""The questions about a run in progress ("Stop run N?", "Stop it and quit?") in the real dashboard, headless, over
real tiny-BERT runs on the CPU (issue #48, point 2): one question at a time, a second ctrl+c answers the quit question
yes, the dashboard paints beneath a question, and a question about a run that has ended goes away."""

from __future__ import annotations

import asyncio
import re

import psutil
import pytest
from test_first_minute import screen_text
from test_tui import (
    TINY,
    assert_the_child_gone_and_its_run_stopped,
    make_app,
    start_run_until_it_trains,
    wait_for,
)

from gpuanat.tui.screens.confirm import ConfirmScreen

SHOWN_STEP = re.compile(r"step (\d+)/")


def questions(app) -> list[ConfirmScreen]:
    return [screen for screen in app.screen_stack if isinstance(screen, ConfirmScreen)]


def question_text(screen: ConfirmScreen) -> str:
    return " ".join(str(label.render()) for label in screen.query("Label"))


def shown_step(app) -> int | None:
    """The step the top line shows on screen (as the terminal gets it), if any."""
    match = SHOWN_STEP.search(screen_text(app).splitlines()[0])
    return int(match.group(1)) if match else None


@pytest.mark.asyncio
@pytest.mark.parametrize("again", ["ctrl+c", "q"])
async def test_ctrl_c_or_q_again_answers_the_quit_question_yes(db_path, again):
    app = make_app(db_path, TINY.replace(samples=100_000))
    async with app.run_test(size=(120, 40)) as pilot:
        await start_run_until_it_trains(app, pilot)
        child = psutil.Process(app.dashboard.run_in_progress.pid)
        await pilot.press("ctrl+c")
        (question,) = questions(app)
        text = question_text(question)
        assert "Stop it and quit?" in text and "(q or ^c again: yes)" in text, text
        await pilot.press(again)
        await pilot.pause()
        assert len(questions(app)) <= 1  # never two stacked
        await wait_for(pilot, lambda: not app.is_running, timeout_s=60, what="the app to exit")
    await asyncio.sleep(0)
    assert_the_child_gone_and_its_run_stopped(child, db_path)


@pytest.mark.asyncio
async def test_one_question_at_a_time_the_dashboard_paints_beneath_and_it_goes_when_the_run_ends(db_path):
    app = make_app(db_path, TINY.replace(samples=4 * 1500))  # 1,500 steps: seconds on one thread, even under load
    async with app.run_test(size=(120, 40)) as pilot:
        await start_run_until_it_trains(app, pilot)
        await pilot.press("s")
        (stop_question,) = questions(app)
        assert "Stop run" in question_text(stop_question)
        await pilot.press("ctrl+c")  # quitting while asked to stop: the quit question instead, not on top of it
        await wait_for(
            pilot,
            lambda: any("Stop it and quit?" in question_text(question) for question in questions(app)),
            timeout_s=30,
            what="the quit question",
        )
        (quit_question,) = questions(app)
        assert "Stop it and quit?" in question_text(quit_question)
        step_when_asked = shown_step(app)
        assert step_when_asked is not None
        await wait_for(
            pilot,
            lambda: (shown_step(app) or 0) > step_when_asked,
            timeout_s=60,
            what="the top line to move on beneath the question",
        )
        await wait_for(pilot, lambda: app.dashboard.run_in_progress is None, what="the run to end on its own")
        await pilot.pause()
        assert questions(app) == []
        assert app.is_running  # nobody answered: the dashboard stays
        assert app.dashboard.last_result.status == "ok"
