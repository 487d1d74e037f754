"""Where a run's wall time goes, from the request to the recorded result: the start-up breakdown.

The parent and the training process each note when they reach a point (`time.monotonic()`, one clock for every
process on Linux); a part is the time between two consecutive points. The same parts time a plain Trainer script
(benchmarks/plain_trainer.py), so that the two start-ups compare part by part.
"""

from __future__ import annotations

from collections.abc import Mapping

REQUESTED = "requested"
"""When the user asked: `gpuanat run`'s process start, or the moment the dashboard or a sweep starts the run."""
WALL_PARTS = (
    ("gpuanat", "spawned"),  # gpuanat's own start: its imports, capability check, GPUs chosen, run recorded
    ("child start", "started"),  # the training process's Python starting, up to its first line
    ("imports", "imported"),  # torch and transformers imported
    ("CUDA init", "cuda ready"),  # the GPU chosen and CUDA initialised
    ("model", "model built"),
    ("dataset", "dataset built"),
    ("trainer init", "trainer ready"),  # TrainingArguments and the Trainer (or Accelerate's prepare)
    ("first step", "first step"),  # on_train_begin, the DataLoader's first batch and the first step
    ("training", "last step"),  # the first step's end to the last's
    ("after training", "trained"),  # Trainer's end of training: its last log and metrics
    ("child exit", "exited"),  # the result event, the process's teardown (CUDA's included) and exit
    ("recording", "recorded"),  # the parent's result: its prediction and measurements assembled
)
"""(part, the point it ends at), in order."""
FIRST_STEP_PARTS = tuple(part for part, _ in WALL_PARTS[: WALL_PARTS.index(("first step", "first step")) + 1])
"""The parts of the start-up: up to the first step's end."""


def wall_breakdown(points: Mapping[str, float]) -> dict[str, float]:
    """Seconds of each part of `WALL_PARTS` from `points` (point name → monotonic seconds), in order. A point that was
    not reached (a run that failed early, an older training process) puts its part's time into the next part."""
    breakdown: dict[str, float] = {}
    last_s = points.get(REQUESTED)
    for part, end in WALL_PARTS:
        end_s = points.get(end)
        if end_s is None:
            continue
        if last_s is not None:
            breakdown[part] = max(0.0, end_s - last_s)
        last_s = end_s
    return breakdown


def time_to_first_step_s(points: Mapping[str, float]) -> float | None:
    """Seconds from the request to the first step's end; None when either is unknown."""
    requested_s, first_step_s = points.get(REQUESTED), points.get("first step")
    return None if requested_s is None or first_step_s is None else max(0.0, first_step_s - requested_s)


def startup_line(breakdown: Mapping[str, float], to_first_step_s: float | None) -> str | None:
    """ "14.2 s to the first step (gpuanat 0.3, imports 5.2, …)" for the summary; None when not measured."""
    if to_first_step_s is None:
        return None
    parts = ", ".join(f"{part} {breakdown[part]:.1f}" for part in FIRST_STEP_PARTS if part in breakdown)
    return f"{to_first_step_s:.1f} s to the first step ({parts})"


def startup_progress(
    points: Mapping[str, float], now_s: float
) -> tuple[list[tuple[str, float]], tuple[str, float] | None]:
    """While a run starts: the parts of its start-up that have passed, (part, seconds) in order, and the part under
    way with its seconds so far (None once the first step has ended, or before anything is known)."""
    passed = [(part, seconds) for part, seconds in wall_breakdown(points).items() if part in FIRST_STEP_PARTS]
    if "first step" in points:
        return passed, None
    reached_s = [points[point] for point in (REQUESTED, *(end for _, end in WALL_PARTS)) if point in points]
    current = next((part for part, end in WALL_PARTS if part in FIRST_STEP_PARTS and end not in points), None)
    if current is None or not reached_s:
        return passed, None
    return passed, (current, max(0.0, now_s - max(reached_s)))


def startup_status(points: Mapping[str, float], now_s: float) -> str:
    """ "starting · gpuanat 0.3 · child start 0.1 · imports 4.2 s…": the start-up so far, the part under way last."""
    passed, current = startup_progress(points, now_s)
    parts = [f"{part} {seconds:.1f}" for part, seconds in passed]
    if current is not None:
        parts.append(f"{current[0]} {current[1]:.1f} s…")
    return " · ".join(["starting", *parts])


def process_started_monotonic_s() -> float | None:
    """When this process started, on the monotonic clock, to 10 ms: Linux's start time of the process (clock ticks
    since boot, /proc/self/stat) against the boot-time clock. psutil's start time would not do: it adds the boot
    time, which Linux gives in whole seconds. None where there is no /proc."""
    import os
    import time

    try:
        with open("/proc/self/stat", "rb") as file:
            fields = file.read().rsplit(b")", 1)[1].split()
        started_since_boot_s = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22, starttime
        return time.monotonic() - max(0.0, time.clock_gettime(time.CLOCK_BOOTTIME) - started_since_boot_s)
    except (OSError, ValueError, IndexError, AttributeError):
        return None
