"""The launching dashboard's technique keys: each changes the configured run, which the app shows at once.

g, p, o, +/- and the others toggle or step one technique (`changed_config`); G chooses how many GPUs, D the
distributed technique across them. A value that cannot train is said when it is chosen, not when r runs it.

A mixin, as `DashboardActions` is, because Textual calls a key's action by its name on the App
(`action_toggle_technique`).
"""

from __future__ import annotations

from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.measure.samples import NvmlStatus
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.techniques import changed_config, next_distributed, next_gpu_count
from gpuanat.core.vocabulary.validation import validate_values
from gpuanat.tui.dashboard_actions import DashboardActions
from gpuanat.tui.run_control import RunControl


class TechniqueActions(DashboardActions):
    """Mixed into the App that has the attributes below and a `_show_techniques()`."""

    config: RunConfig
    nvml: NvmlStatus | None
    live: LiveRun | None
    _run_control: RunControl

    def _show_techniques(self) -> None:
        """Show the configured run: its techniques and its predicted memory."""

    def _change_config(self, config: RunConfig) -> None:
        self.config = config
        self._show_techniques()
        if self.live is None:  # the prepared process must suit the run (its GPUs): kept when it does
            self._run_control.prepare_worker(config)

    def action_toggle_technique(self, field: str) -> None:
        self._change_config(changed_config(self.config, field))
        try:  # a value that cannot train (Liger on a classifier, QLoRA without adapters) is said at once, not at `r`
            validate_values(self.config)
        except ConfigError as error:
            self.notify(str(error), severity="warning", timeout=6)

    def action_step(self, field: str, direction: int) -> None:
        self._change_config(changed_config(self.config, field, direction))

    def _gpu_count(self) -> int:
        return len(self.nvml.gpu_names) if self.nvml is not None and self.nvml.available else 0

    def action_cycle_gpus(self) -> None:
        if self.config.device != "cuda" or self._gpu_count() < 2:
            self.notify(
                f"One GPU here ({self._gpu_count()} listed by NVML): nothing to choose."
                if self.config.device == "cuda"
                else "CPU runs use no GPU.",
                timeout=4,
            )
            return
        self._change_config(next_gpu_count(self.config, self._gpu_count()))

    def action_cycle_distributed(self) -> None:
        following = next_distributed(self.config)
        if following is None:
            self.notify("A distributed technique needs several GPUs: choose them with G first.", timeout=4)
            return
        self._change_config(following)
