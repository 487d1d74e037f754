"""The launching dashboard's configured run: the technique keys (g, p, +, -, [, ], G, D, O, …), each of which changes
it and shows it at once, and the capability probe's answer, which may move it to the CPU.

The next run trains what is configured here; the prepared training process (`RunBackend.prepare`) follows each change
while no run is in progress.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuanat.core.vocabulary.config import DEFAULT_PROFILE_OPS_STEPS, RunConfig, workload_for_device
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.techniques import changed_config, next_distributed, next_gpu_count
from gpuanat.core.vocabulary.validation import machine_unsupported_reasons, validate_values
from gpuanat.tui.messages import CapabilitiesFound
from gpuanat.tui.screens.data import DataScreen

if TYPE_CHECKING:
    from gpuanat.tui.screens.launch import LaunchDashboard


class TechniqueKeys:
    """The keys that change the configured run (`LaunchDashboard.config`)."""

    def __init__(self, dashboard: LaunchDashboard, untouched_fields: frozenset[str]) -> None:
        """`untouched_fields` names the RunConfig fields the user left to the defaults: on the CPU, once the capability
        probe has answered, the workload among them is sized for it (`workload_for_device`)."""
        self._dashboard = dashboard
        self._untouched_fields = untouched_fields

    def change_config(self, config: RunConfig) -> None:
        """Make `config` the configured run, and show it."""
        dashboard = self._dashboard
        dashboard.config = config
        dashboard.painter.show_techniques()
        if dashboard.run_in_progress is None:  # the prepared process must suit the run (its GPUs): kept when it does
            dashboard.run_control.prepare_worker(config)

    def capabilities_found(self, message: CapabilitiesFound) -> None:
        """The capability probe answered: without CUDA the runs train on the CPU, sized for it where left to the
        defaults; the next training process is prepared."""
        dashboard = self._dashboard
        dashboard.capabilities = message.capabilities
        if message.failure:
            dashboard.notify(message.failure, severity="error", timeout=10)
        elif dashboard.capabilities is not None:
            capabilities = dashboard.capabilities
            notes = []
            if not capabilities.cuda_available and dashboard.config.device == "cuda":
                # Expandable segments are an option of the CUDA allocator (on by default from PYTORCH_CUDA_ALLOC_CONF).
                dashboard.config = dashboard.config.replace(device="cpu", expandable_segments=False)
                notes.append(f"No CUDA here ({capabilities.reason}); runs train on the CPU.")
            dashboard.config, workload = workload_for_device(dashboard.config, self._untouched_fields, watched=True)
            if workload is not None:
                notes.append(f"Sized for the CPU: {workload} ([ and ]: the run's length; M: the model).")
            if notes:
                dashboard.notify(" ".join(notes), timeout=10)
            dashboard.run_control.prepare_worker(dashboard.config)
        dashboard.painter.show_techniques()

    def toggle_technique(self, field: str) -> None:
        self.change_config(changed_config(self._dashboard.config, field))
        try:  # a value that cannot train (Liger on a classifier, QLoRA without adapters) is said at once, not at `r`
            validate_values(self._dashboard.config)
        except ConfigError as error:
            self._dashboard.notify(str(error), severity="warning", timeout=6)

    def choose_data(self) -> None:
        """`d`: the data box; what it keeps is the next runs' --data and --tokenizer (checked as `toggle_technique`
        does: a preset without a tokenizer is said at once)."""
        config = self._dashboard.config

        def chosen(typed: tuple[str | None, str | None] | None) -> None:
            if typed is None:  # cancelled
                return
            data, tokenizer = typed
            self.change_config(self._dashboard.config.replace(data=data, tokenizer=tokenizer))
            try:
                validate_values(self._dashboard.config)
            except ConfigError as error:
                self._dashboard.notify(str(error), severity="warning", timeout=8)

        self._dashboard.app.push_screen(DataScreen(config.data, config.tokenizer), chosen)

    def step(self, field: str, direction: int) -> None:
        self.change_config(changed_config(self._dashboard.config, field, direction))

    def why_unavailable(self) -> None:
        """`u`: every technique chosen that this machine cannot run, each with its reason and the flag to fix (the
        panel has room for one at most, and a tooltip needs a mouse)."""
        dashboard = self._dashboard
        if dashboard.capabilities is None:
            dashboard.notify("Still checking what this machine can run; u again in a few seconds.", timeout=4)
            return
        reasons = machine_unsupported_reasons(dashboard.config, dashboard.capabilities)
        if not reasons:
            dashboard.notify("Every technique chosen can run here.", timeout=4)
            return
        dashboard.notify("\n".join(f"{flag}: {reason}" for flag, reason in reasons), severity="warning", timeout=20)

    def cycle_gpus(self) -> None:
        config, gpu_count = self._dashboard.config, self._dashboard.painter.gpu_count()
        if config.device != "cuda" or gpu_count < 2:
            self._dashboard.notify(
                f"One GPU here ({gpu_count} listed by NVML): nothing to choose."
                if config.device == "cuda"
                else "CPU runs use no GPU.",
                timeout=4,
            )
            return
        self.change_config(next_gpu_count(config, gpu_count))

    def cycle_distributed(self) -> None:
        following = next_distributed(self._dashboard.config)
        if following is None:
            self._dashboard.notify("A distributed technique needs several GPUs: choose them with G first.", timeout=4)
            return
        self.change_config(following)

    def toggle_operations(self) -> None:
        """`O`: the next runs profile their operations and the panel takes the charts' place; again: off."""
        dashboard = self._dashboard
        steps = 0 if dashboard.run_control.profile_ops_steps else DEFAULT_PROFILE_OPS_STEPS
        dashboard.run_control.profile_ops_steps = steps
        # The class goes to the screen on top, as `v`'s does (`DashboardScreen.action_toggle_timeline`).
        dashboard.app.screen.set_class(bool(steps), "-operations")
        dashboard.painter.show_operations()
        dashboard.notify(
            f"Operations anatomy: the next runs profile {steps} steps after warm-up, left out of their "
            "steady samples/s (O: off)."
            if steps
            else "Operations profiling off; the charts are back.",
            timeout=4,
        )
