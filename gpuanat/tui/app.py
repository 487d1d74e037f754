"""`gpuanat`'s dashboard app: the launching dashboard (`gpuanat.tui.screens.launch`) in the shell both dashboards
share (`gpuanat.tui.shell`), with the run backend it is given — the real one (`LocalRunBackend`) unless told
otherwise.

The app holds the dashboard's keys (`LAUNCH_BINDINGS`, declared with the screen) and hands each key's action to it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, ClassVar

from textual.binding import BindingType

from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.measure.samples import NvmlStatus
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.tui.run_backend import LocalRunBackend, RunBackend
from gpuanat.tui.screens.launch import LAUNCH_BINDINGS, PAINT_INTERVAL_S, SAMPLE_INTERVAL_S, LaunchDashboard
from gpuanat.tui.shell import DashboardApp


class GpuAnatApp(DashboardApp[LaunchDashboard]):
    TITLE = "gpuanat"
    BINDINGS: ClassVar[list[BindingType]] = [*LAUNCH_BINDINGS]

    def __init__(
        self,
        config: RunConfig,
        *,
        db_path: Path,
        backend: RunBackend | None = None,
        sampler_factory: Callable[[], tuple[Any, NvmlStatus]] = open_source,
        clock: Callable[[], float] = time.monotonic,
        paint_interval_s: float = PAINT_INTERVAL_S,
        sample_interval_s: float | None = SAMPLE_INTERVAL_S,
        keymap: dict[str, str] | None = None,
        untouched_fields: Collection[str] = (),
    ) -> None:
        """`backend` trains and records the runs (default: `LocalRunBackend` on the history at `db_path`); the other
        arguments are the dashboard screen's (`LaunchDashboard`): every source of data is injectable."""
        dashboard = LaunchDashboard(
            config,
            db_path=db_path,
            backend=backend if backend is not None else LocalRunBackend(db_path),
            sampler_factory=sampler_factory,
            clock=clock,
            paint_interval_s=paint_interval_s,
            sample_interval_s=sample_interval_s,
            untouched_fields=untouched_fields,
        )
        super().__init__(dashboard, keymap=keymap)

    # --- the launching dashboard's own keys, handed to it -------------------------------------------
    def action_run(self) -> None:
        self.dashboard.action_run()

    def action_stop(self) -> None:
        self.dashboard.action_stop()

    def action_fit(self) -> None:
        self.dashboard.action_fit()

    def action_tune(self) -> None:
        self.dashboard.action_tune()

    def action_toggle_technique(self, field: str) -> None:
        self.dashboard.action_toggle_technique(field)

    def action_step(self, field: str, direction: int) -> None:
        self.dashboard.action_step(field, direction)

    def action_why_unavailable(self) -> None:
        self.dashboard.action_why_unavailable()

    def action_cycle_gpus(self) -> None:
        self.dashboard.action_cycle_gpus()

    def action_cycle_distributed(self) -> None:
        self.dashboard.action_cycle_distributed()

    def action_toggle_timeline(self) -> None:
        self.dashboard.action_toggle_timeline()

    def action_toggle_operations(self) -> None:
        self.dashboard.action_toggle_operations()

    def action_choose_data(self) -> None:
        self.dashboard.action_choose_data()
