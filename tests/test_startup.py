"""The start-up breakdown's arithmetic (gpuanat.core.measure.startup); real runs' breakdowns are checked in
test_run_cpu.py."""

from __future__ import annotations

import time

import pytest

from gpuanat.core.measure.startup import (
    WALL_PARTS,
    process_started_monotonic_s,
    startup_line,
    time_to_first_step_s,
    wall_breakdown,
)

POINTS = {
    "requested": 100.0,
    "spawned": 100.25,
    "started": 100.32,
    "imported": 104.32,
    "cuda ready": 105.0,
    "model built": 106.5,
    "dataset built": 106.6,
    "trainer ready": 107.0,
    "first step": 109.0,
    "last step": 119.0,
    "trained": 119.1,
    "exited": 119.2,
    "recorded": 119.25,
}


def test_every_part_is_the_time_between_its_points():
    breakdown = wall_breakdown(POINTS)
    assert list(breakdown) == [part for part, _ in WALL_PARTS]
    assert breakdown["gpuanat"] == pytest.approx(0.25)
    assert breakdown["imports"] == pytest.approx(4.0)
    assert breakdown["first step"] == pytest.approx(2.0)
    assert sum(breakdown.values()) == pytest.approx(POINTS["recorded"] - POINTS["requested"])
    assert time_to_first_step_s(POINTS) == pytest.approx(9.0)


def test_a_point_not_reached_gives_its_time_to_the_next_part():
    # an older training process that reports no milestones: only the parent's points and the steps' times
    points = {name: POINTS[name] for name in ("requested", "spawned", "first step", "last step", "exited")}
    breakdown = wall_breakdown(points)
    assert breakdown == pytest.approx({"gpuanat": 0.25, "first step": 8.75, "training": 10.0, "child exit": 0.2})
    assert time_to_first_step_s({"requested": 1.0}) is None
    assert startup_line(breakdown, None) is None  # a run that never stepped has no start-up line


def test_the_summary_line_names_the_start_up_parts_only():
    breakdown = wall_breakdown(POINTS)
    line = startup_line(breakdown, time_to_first_step_s(POINTS))
    assert line == (
        "9.0 s to the first step (gpuanat 0.2, child start 0.1, imports 4.0, CUDA init 0.7, model 1.5, "
        "dataset 0.1, trainer init 0.4, first step 2.0)"
    )


def test_this_process_started_before_now_on_the_monotonic_clock():
    started_s = process_started_monotonic_s()
    assert started_s is not None and started_s <= time.monotonic()
    # pytest has been running a while: its start is seconds ago, not boot or the future
    assert time.monotonic() - started_s < 3600
