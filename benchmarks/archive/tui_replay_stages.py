"""Where the watch replay's CPU goes, stage by stage: `benchmarks/tui_replay.py watch` with the CPU time of the calling
thread (`time.thread_time`) summed around the paint tick, the chart and panel updates, Textual's compositor refresh and
the sampler thread's record, written per second of the run when it ends (to `TIMED_OUT`, default
/tmp/tui_replay_stages.txt). Run it in a pseudo-terminal as `tui_cost.py --replay` runs tui_replay.py. `BENCH` is the
benchmarks folder of the code measured (that of a copy of another commit, with PYTHONPATH at that copy, to compare).
Used for docs/cost.md, "The watch's CPU".
"""

from __future__ import annotations

import atexit
import collections
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, os.environ.get("BENCH", str(Path(__file__).resolve().parent.parent)))

import tui_replay
from textual.screen import Screen
from textual.widget import Widget

from gpuanat.tui.series import TimeSeries
from gpuanat.tui.watch_app import WatchApp
from gpuanat.tui.widgets import cached_rows, line_chart
from gpuanat.tui.widgets.cached_rows import CachedRows
from gpuanat.tui.widgets.line_chart import LineChart
from gpuanat.tui.widgets.memory_bar import MemoryBar
from gpuanat.tui.widgets.process_panel import ProcessPanel

spent_s: collections.Counter[str] = collections.Counter()
calls: collections.Counter[str] = collections.Counter()


def timed(owner: Any, name: str, label: str) -> None:
    original: Callable[..., Any] = getattr(owner, name)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started_s = time.thread_time()
        try:
            return original(*args, **kwargs)
        finally:
            spent_s[label] += time.thread_time() - started_s
            calls[label] += 1

    setattr(owner, name, wrapper)


STAGES = [
    (WatchApp, "paint", "paint"),
    (WatchApp, "_add_record", "paint/_add_record"),
    (MemoryBar, "update_bands", "paint/_add_record/bar.update_bands"),
    (LineChart, "refresh_data", "paint/chart.refresh_data"),
    (LineChart, "_build_plot_rows", "paint/chart.plot"),
    (LineChart, "_plot_rows", "paint/chart.plot/_plot_rows"),
    (line_chart, "line_cells", "paint/chart.plot/_plot_rows/full line_cells"),
    (TimeSeries, "bucket", "paint/chart.plot/bucket"),
    (LineChart, "_title_row", "paint/chart.title"),
    (ProcessPanel, "show", "paint/panel.show"),
    (ProcessPanel, "build_rows", "paint/panel.show/build_rows"),
    (ProcessPanel, "render", "paint/panel.show/render"),
    (CachedRows, "repaint_changes", "paint/repaint_changes (all)"),
    (cached_rows, "changed_regions", "paint/changed_regions"),
    (Widget, "refresh", "paint/Widget.refresh (all)"),
    (Screen, "_on_timer_update", "screen._on_timer_update"),
    (Screen, "_compositor_refresh", "screen._on_timer_update/_compositor_refresh"),
    (WatchApp, "_on_sample", "sampler thread: _on_sample"),
]
for owner, name, label in STAGES:
    timed(owner, name, label)
started_s, started_cpu_s = time.perf_counter(), time.process_time()


def report() -> None:
    wall_s = time.perf_counter() - started_s
    lines = [f"wall {wall_s:.1f}s process cpu {100 * (time.process_time() - started_cpu_s) / wall_s:.2f}%"]
    for label in sorted(spent_s):
        lines.append(
            f"{label:55s} {1000 * spent_s[label] / wall_s:7.2f} ms/s  "
            f"{1000 * spent_s[label] / max(1, calls[label]):.3f} ms/call  {calls[label]}"
        )
    Path(os.environ.get("TIMED_OUT", "/tmp/tui_replay_stages.txt")).write_text("\n".join(lines) + "\n")


atexit.register(report)
tui_replay.main()
