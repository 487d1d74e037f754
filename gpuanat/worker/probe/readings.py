"""What a probe has measured so far, read off it at any time: the steady-state rate and the steady steps' phases
(`Done`'s figures), its samples and steps, the allocator's peaks, and the events that carry them (a measured step's
bands, `done`). A base of `core.Probe`, which keeps the state.
"""

from __future__ import annotations

from typing import Any

import torch

from gpuanat.core.vocabulary.protocol import Done, ProbeBands, Step
from gpuanat.worker.probe.logged import LoggedValues
from gpuanat.worker.probe.tensors import (
    deepspeed_gradients,
    optimizer_state_shape,
    optimizer_state_tensors,
    unique_storage_bytes,
)


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
    _last_step_end_s: float
    _compiled: bool
    _samples: int
    _optimizer: Any
    _model: Any
    _weights_bytes: int
    _gradients_bytes: int
    _activations_bytes: int | None
    _batch_bytes: int
    _gradients_at_forward_end_bytes: int
    _optimizer_at_forward_end_bytes: int
    _forward_peak_bytes: int | None
    _buffers_at_start_bytes: int | None
    _logits_bytes: int | None
    last_bands: ProbeBands | None
    summary: dict[str, Any]
    logged_values: LoggedValues
    probe_time_s: float
    probe_time_by_part_s: dict[str, float]

    def steady_state(self) -> dict[str, Any]:
        """Samples/s after warm-up, or None with the reason. A run stopped before its last step (its window never
        closed) has the steady rate of the steps it finished after warm-up."""
        result: dict[str, Any] = {
            "warmup_steps": getattr(self, "warmup_steps", 0),
            "steady_samples_per_second": None,
            "steady_reason": None,
        }
        start, end = getattr(self, "_steady_start", None), getattr(self, "_steady_end", None)
        if start is not None and end is None and self.last_step is not None:
            end = (self._last_step_end_s, self.last_step.samples)  # the last step it finished, not the one cut short
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

    def _gradients_bytes_now(self) -> int:
        """Gradients on this rank: of the parameters, and with DeepSpeed ZeRO of its fp32 partitions."""
        gradients = [p.grad for p in self._model.parameters()]
        gradients.extend(deepspeed_gradients(self._optimizer))
        return unique_storage_bytes(gradients, self._device)

    def _optimizer_state_bytes_now(self) -> int:
        """The optimizer state's distinct storages on this rank, counted again only when the optimizer holds other
        entries than at the last count (its tensors keep their sizes from their first step on): a measured step
        asks twice, and a large model's state is thousands of tensors."""
        key = optimizer_state_shape(self._optimizer)
        cached = getattr(self, "_optimizer_state_count", None)
        if cached is not None and cached[0] == key:
            return int(cached[1])
        size = unique_storage_bytes(optimizer_state_tensors(self._optimizer), self._device)
        self._optimizer_state_count = (key, size)
        return size

    def measured_bands(self, step: int) -> ProbeBands:
        """The bands of measured step `step`: the exact byte counts read during it, the optimizer state now."""
        return ProbeBands(
            weights_bytes=self._weights_bytes,
            gradients_bytes=self._gradients_bytes,
            optimizer_state_bytes=self._optimizer_state_bytes_now(),
            activations_bytes=self._activations_bytes,
            activations_method=("allocator" if self._cuda else "unavailable" if self._compiled else "saved_tensors"),
            batch_bytes=self._batch_bytes,
            measured_at_step=step,
            gradients_at_forward_end_bytes=self._gradients_at_forward_end_bytes,
            optimizer_state_at_forward_end_bytes=self._optimizer_at_forward_end_bytes,
            forward_peak_allocated_bytes=self._forward_peak_bytes,
            buffers_at_start_bytes=self._buffers_at_start_bytes,
            logits_bytes=self._logits_bytes,
        )

    def done_event(self, status: str, steps: int) -> Done:
        """`done` after `steps` optimizer steps, from the summary `end` completed (the loop's figures, else the
        probe's own)."""
        return Done(
            status=status,
            steps=steps,
            samples=self._samples,
            train_runtime_s=self.summary.get("train_runtime"),
            samples_per_second=self.summary.get("train_samples_per_second"),
            steady_samples_per_second=self.summary["steady_samples_per_second"],
            warmup_steps=self.summary["warmup_steps"],
            steady_reason=self.summary["steady_reason"],
            train_loss=self.summary.get("train_loss"),
            peak_allocated_bytes=self.peak_allocated_bytes,
            peak_reserved_bytes=self.peak_reserved_bytes,
            bands=self.last_bands,
            probe_time_s=self.probe_time_s,
            probe_time_by_part_s=dict(self.probe_time_by_part_s),
            **self.steady_phases(),
            **self.logged_values.fields(),
        )
