"""What a probe has measured so far, read off it at any time: the steady-state rate and the steady steps' phases
(`Done`'s figures), its samples and steps, the allocator's peaks. A base of `core.Probe`, which keeps the state.
"""

from __future__ import annotations

from typing import Any

import torch

from gpuanat.core.run.protocol import Step


class ProbeReadings:
    """Read-only figures of a `core.Probe` (which sets the attributes read here as training goes)."""

    # Set by `core.Probe`: `last_step` when it is made, the others when training begins (read here only after).
    last_step: Step | None
    _device: torch.device
    _cuda: bool
    _peak_allocated_bytes: int | None
    _peak_reserved_bytes: int | None
    _step_peak_floor_bytes: int
    _steady_phases_s: dict[str, float]
    _steady_caught_up_steps: int

    def steady_state(self) -> dict[str, Any]:
        """Samples/s after warm-up, or None with the reason."""
        result: dict[str, Any] = {
            "warmup_steps": getattr(self, "warmup_steps", 0),
            "steady_samples_per_second": None,
            "steady_reason": None,
        }
        start, end = getattr(self, "_steady_start", None), getattr(self, "_steady_end", None)
        if start is None or end is None or end[1] <= start[1] or end[0] <= start[0]:
            result["steady_reason"] = (
                f"too few steps: the first {result['warmup_steps']} are warm-up and at least one more is needed"
            )
        else:
            result["steady_samples_per_second"] = (end[1] - start[1]) / (end[0] - start[0])
        return result

    def steady_phases(self) -> dict[str, Any]:
        """The steady steps' phases summed, their count and how many found the GPU caught up (`Done`'s fields)."""
        steps = getattr(self, "_steady_steps", 0)
        if not steps:
            return {"steady_phases_s": None, "steady_steps": 0, "steady_gpu_caught_up_steps": None}
        return {
            "steady_phases_s": dict(self._steady_phases_s),
            "steady_steps": steps,
            "steady_gpu_caught_up_steps": self._steady_caught_up_steps if self._cuda else None,
        }

    @property
    def samples(self) -> int:
        return getattr(self, "_samples", 0)

    @property
    def started(self) -> bool:
        """Whether training has begun (the probe saw on_train_begin)."""
        return hasattr(self, "_train_start_s")

    @property
    def steps(self) -> int:
        """Optimizer steps completed so far."""
        return self.last_step.step if self.last_step is not None else 0

    @property
    def peak_allocated_bytes(self) -> int | None:
        """Highest allocated memory seen at any step so far, including now."""
        if not getattr(self, "_cuda", False):
            return None
        return max(
            self._peak_allocated_bytes or 0, self._step_peak_floor_bytes, torch.cuda.max_memory_allocated(self._device)
        )

    @property
    def peak_reserved_bytes(self) -> int | None:
        if not getattr(self, "_cuda", False):
            return None
        return max(self._peak_reserved_bytes or 0, torch.cuda.memory_reserved(self._device))
