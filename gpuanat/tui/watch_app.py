"""`gpuanat watch PID`'s dashboard app: the watch dashboard (`gpuanat.tui.screens.watch`) in the shell both
dashboards share (`gpuanat.tui.shell`). The app holds the dashboard's keys (`WATCH_BINDINGS`) and hands each key's
action to it."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from textual.binding import BindingType

from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.measure.samples import NvmlStatus
from gpuanat.core.watch.session import WatchSession
from gpuanat.core.watch.target import WatchTarget
from gpuanat.tui.screens.watch import PAINT_INTERVAL_S, SAMPLE_INTERVAL_S, WATCH_BINDINGS, WatchDashboard
from gpuanat.tui.shell import DashboardApp


class WatchApp(DashboardApp[WatchDashboard]):
    TITLE = "gpuanat watch"
    BINDINGS: ClassVar[list[BindingType]] = [*WATCH_BINDINGS]

    def __init__(
        self,
        target: WatchTarget,
        *,
        db_path: Path,
        sampler_factory: Callable[[], tuple[Any, NvmlStatus]] = lambda: open_source(per_process=True),
        session_factory: Callable[[WatchTarget, NvmlStatus], WatchSession] | None = None,
        clock: Callable[[], float] = time.monotonic,
        paint_interval_s: float = PAINT_INTERVAL_S,
        interval_s: float | None = SAMPLE_INTERVAL_S,
        save_name: str | None = None,
        save_on_start: bool = False,
        trace_path: Path | None = None,
        keymap: dict[str, str] | None = None,
        on_record: Callable[[dict[str, Any]], None] | None = None,
    ) -> None:
        """The arguments are the watch dashboard's (`WatchDashboard`): every source is injectable."""
        dashboard = WatchDashboard(
            target,
            db_path=db_path,
            sampler_factory=sampler_factory,
            session_factory=session_factory,
            clock=clock,
            paint_interval_s=paint_interval_s,
            interval_s=interval_s,
            save_name=save_name,
            save_on_start=save_on_start,
            trace_path=trace_path,
            on_record=on_record,
        )
        super().__init__(dashboard, keymap=keymap)

    # --- the watch dashboard's own keys, handed to it -----------------------------------------------
    def action_save(self) -> None:
        self.dashboard.action_save()

    def action_toggle_operations(self) -> None:
        self.dashboard.action_toggle_operations()
