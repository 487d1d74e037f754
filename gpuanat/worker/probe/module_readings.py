"""Memory by module and at a failure, read off a `core.Probe`: the modules' rows of a measured step (what each module
saved for backward at the peak, and the parameters, gradients and optimizer state it owns), and the whole state when
an allocation fails (`state_at_failure`: the bands then, the allocation, the phase, the module and line that asked,
the largest live tensors). A base of `core.Probe` (over `readings.ProbeReadings`), which keeps the state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from gpuanat.core.vocabulary.protocol import Error, Event, LiveTensor, ModuleMemory, OutOfMemory, ProbeBands
from gpuanat.worker.out_of_memory import (
    failed_allocation_bytes,
    is_gpu_out_of_memory,
    is_out_of_memory,
)
from gpuanat.worker.probe.cost import never_raises
from gpuanat.worker.probe.device_memory import NvmlReader, allocator_bytes
from gpuanat.worker.probe.module_memory import (
    LARGEST_TENSORS,
    ModuleFollower,
    Ownership,
    module_rows,
)
from gpuanat.worker.probe.oom_capture import (
    CAPTURE,
    Failure,
    cpu_failure,
    describe_loading,
    module_of_frames,
    operation_line,
    phase_of_frames,
)
from gpuanat.worker.probe.readings import ProbeReadings

MODULE_STEPS_ON_A_GPU = 2
"""On a GPU, the measured steps whose modules are followed (their hooks cost a few ms a step): the first, and the
second, the first with the optimizer's state, where runs that fit one step run out of memory; later measured steps
carry the memory by module of the last one followed. On the CPU every measured step is: its activations band is
what autograd saved."""
STEP_PHASE_AT_FAILURE = {"forward": "forward", "backward": "forward", "optimizer": "optimizer"}
"""The probe's step phase (`timing.StepPhases`) -> the phase a failure is said to be in, when autograd's node and
frames do not say backward: from the forward pass's end to the optimizer, that is the loop's code before
`backward()` (its loss); any other phase is "between steps" (the data, the wait for the GPU)."""


class ModuleReadings(ProbeReadings):
    """Module and failure figures of a `core.Probe` (which sets the attributes read here as training goes)."""

    _measuring: bool
    _nvml: NvmlReader | None
    _modules: ModuleFollower | None
    _ownership: Ownership | None
    _activations_by_module: dict[str, int] | None
    _following: bool
    _gradients_by_module: dict[str, int]
    _step_phases: Any

    _emit_safely: Callable[[Event], None]

    @never_raises
    def failed(self, error: BaseException) -> None:
        """The training loop raised `error` (out of memory, or another exception): said with the step it was in and
        the allocator's figures — for an out-of-memory error, the memory at the failing allocation — so a watch shows
        why the run ended."""
        cuda = getattr(self, "_cuda", False)
        oom = is_out_of_memory(error)
        allocated = allocator_bytes(self._device) if cuda else None
        self._emit_safely(
            Error(
                kind="oom" if oom else "exception",
                message=f"{type(error).__name__}: {error}",
                step=self.steps + 1,
                peak_allocated_bytes=allocated[1] if allocated else None,
                reserved_bytes=allocated[2] if allocated else None,
                out_of_memory=self.out_of_memory_at(error) if oom else None,
            )
        )

    # --- memory by module -----------------------------------------------------------------------
    def _follows_modules(self, step: int) -> bool:
        """Whether measured step `step`'s modules are followed."""
        return self._measuring and self._modules is not None and (not self._cuda or step <= MODULE_STEPS_ON_A_GPU)

    def _module_step_ends(self) -> None:
        """A followed step ended: its graph is let go, and its hooks' time (outside the probe's timed methods) is
        counted in the probe's cost."""
        if self._following and self._modules is not None:
            self._modules.step_ends()
            self.probe_time_s += self._modules.time_s
            self.probe_time_by_part_s["measured steps"] += self._modules.time_s
            self._modules.time_s = 0.0

    def _read_gradients_by_module(self) -> None:
        """The gradients by module while they are complete (the optimizer is about to step)."""
        if self._ownership is None:
            return
        for module, size in self._ownership.gradients().items():
            self._gradients_by_module[module] = max(self._gradients_by_module.get(module, 0), size)

    def _module_rows(self, bands: ProbeBands) -> list[ModuleMemory] | None:
        """The modules' rows of a measured step, `bands`' own: the activations saved at the end of the forward pass and
        the gradients at their maximum of the last step whose modules were followed, parameters and optimizer state
        now; the "(no module)" row tops each column up to its band."""
        if self._activations_by_module is None or self._ownership is None:
            return None
        return module_rows(
            self._activations_by_module,
            self._ownership.owned(self._optimizer, self._gradients_by_module),
            {
                "activations": bands.activations_bytes,
                "parameters": bands.weights_bytes,
                "gradients": bands.gradients_bytes,
                "optimizer_state": bands.optimizer_state_bytes,
            },
        )

    # --- a failure ------------------------------------------------------------------------------
    def out_of_memory_at(self, error: BaseException) -> OutOfMemory | None:
        """The memory when `error` (an out-of-memory error) was raised: CUDA's observer caught it; on the CPU it is
        read now, from the error's traceback (whose frames keep the failing step's tensors alive)."""
        if is_gpu_out_of_memory(error):
            return CAPTURE.take()
        failure = cpu_failure(error, failed_allocation_bytes(error))
        if not self.started:
            return describe_loading(torch.device("cpu"))(failure)
        return self.state_at_failure(failure)

    def state_at_failure(self, failure: Failure) -> OutOfMemory:
        """Everything known when an allocation failed (called by the observer, in the failing allocation)."""
        allocated = reserved = used = process = None
        if self._cuda:
            allocated, _, reserved = allocator_bytes(self._device)
            if self._nvml is not None:
                used, process = self._nvml.read()
        names = getattr(self._modules, "names", None) or {
            id(module): name for name, module in self._model.named_modules()
        }
        phase = (
            "backward"
            if failure.autograd_node is not None
            else phase_of_frames(failure.frames) or STEP_PHASE_AT_FAILURE.get(self._step_phases.phase, "between steps")
        )
        following = self._modules is not None and self._following
        module = None  # the modules followed know it best (their hooks included), else the frames of forwards
        if following and self._modules is not None and phase in ("forward", "backward"):
            module = self._modules.current_module(failure.autograd_node)
        if module is None:
            module = module_of_frames(failure.frames, names)
        gradients, optimizer_state = self._gradients_bytes_now(), self._optimizer_state_bytes_now()
        batch = self._batch_bytes if self._measuring else 0
        if following and self._modules is not None:
            activations: int | None = self._modules.saved_bytes()
            method = "saved_tensors"
        elif allocated is not None:
            others = self._weights_bytes + gradients + optimizer_state + batch + (self._buffers_at_start_bytes or 0)
            activations, method = max(0, allocated - others), "allocator"
        else:
            activations, method = None, "unavailable"
        ownership = self._ownership or Ownership(self._model, self._device)
        bands = ProbeBands(
            weights_bytes=self._weights_bytes,
            gradients_bytes=gradients,
            optimizer_state_bytes=optimizer_state,
            activations_bytes=activations,
            activations_method=method,
            batch_bytes=batch,
            measured_at_step=self.steps + 1,
            gradients_at_forward_end_bytes=gradients,
            optimizer_state_at_forward_end_bytes=optimizer_state,
            buffers_at_start_bytes=self._buffers_at_start_bytes,
        )
        saved_by_module = self._modules.saved_by_module() if following and self._modules is not None else {}
        rows = module_rows(
            saved_by_module,
            ownership.owned(self._optimizer),
            {
                "activations": activations,
                "parameters": self._weights_bytes,
                "gradients": gradients,
                "optimizer_state": optimizer_state,
            },
        )
        largest = self._largest_tensors(ownership, following)
        return OutOfMemory(
            phase=phase,
            failed_allocation_bytes=failure.failed_allocation_bytes,
            device_free_bytes=failure.device_free_bytes,
            device_total_bytes=failure.device_total_bytes,
            allocated_bytes=allocated,
            reserved_bytes=reserved,
            step=self.steps + 1,
            module=module,
            operation=_operation(failure, phase),
            bands=_with_modules(bands, rows),
            nvml_device_used_bytes=used,
            nvml_process_used_bytes=process,
            largest_tensors=largest,
        )

    def _largest_tensors(self, ownership: Ownership, following: bool) -> list[LiveTensor]:
        candidates = ownership.live_tensors(self._optimizer)
        if following and self._modules is not None:
            candidates.extend(self._modules.largest_saved(LARGEST_TENSORS))
        return sorted(candidates, key=lambda tensor: -tensor.bytes)[:LARGEST_TENSORS]


def _operation(failure: Failure, phase: str) -> str | None:
    """The backward's autograd node in backward (its Python frames are autograd's), else the source line."""
    if phase == "backward" and failure.autograd_node is not None:
        return type(failure.autograd_node).__name__
    return operation_line(failure)


def _with_modules(bands: ProbeBands, rows: list[ModuleMemory]) -> ProbeBands:
    return dataclasses.replace(bands, modules=rows)
