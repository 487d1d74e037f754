"""The probe's measurement core, which knows no training framework: `Probe` measures memory and throughput inside a
training run, called by a thin adapter at the loop's points — training begins (`begin`), an optimizer step begins
(`step_begins`), the optimizer is about to step (`optimizer_begins`), the loss is logged (`logged`), the step ends
(`step_ends`), training ends (`end`) — and where the forward pass begins and ends (`forward_begins`, `forward_ends`),
from the forward hooks it sets on the model itself or from the adapter. The adapters: HF `Trainer`'s
`hf.AnatomyCallback`, Lightning's `lightning_callback.LightningAnatomyCallback`, and `plain_loop.track` for a plain
PyTorch, Accelerate or FSDP2 loop, which knows a step only when it ends: there the next step begins at its first
forward pass (`steps_begin_at_forward`).

Cheap by design — the probe must cost under 1% of step time:
- every optimizer step: a timestamp and one read of the CUDA allocator's counters (host-side, no sync);
- on "measured" steps only (the first three, then every `exact_every_steps`): exact byte counts of
  weights, gradients and optimizer state (unique tensor storages, `tensors`), the activations at the end of
  the forward pass, and the forward pass's peak;
- on measured steps and whenever torch's reserved memory changed: NVML's device and per-process memory,
  read right after the allocator's, so the bands can be checked against NVML at the same instant (`device_memory`);
- two CUDA synchronisations per run, bracketing the steady-state window.
The time spent in its methods and hooks is itself measured (`probe_time_s`), so its cost is known; where each
step's host time went is `timing.StepPhases`.

Where the events go: to the `emit` given (gpuanat's worker passes its pipe); else where `sink.default_emit` says
(gpuanat's pipe under `gpuanat run --script`, else a publication for `gpuanat watch PID`; `publish=False` opts
out). Without an `emit` the probe also sends `hello` when training begins and `done` when it ends, which gpuanat's
worker otherwise sends itself.

The probe never raises into training: an unexpected error turns the probe off with one warning on
stderr, and a publication file that cannot be written turns publishing off the same way.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch

from gpuanat.core.export.probe_metrics import exported, served_metrics
from gpuanat.core.vocabulary.protocol import STEP_PHASES, Event, ModelInfo, ProbeBands, Step
from gpuanat.worker.events import ParentGone
from gpuanat.worker.probe.cost import PROBE_TIME_PARTS, never_raises
from gpuanat.worker.probe.device_memory import NvmlReader, allocator_bytes
from gpuanat.worker.probe.logged import LoggedValues
from gpuanat.worker.probe.loop_inputs import batch_tensors, hello_event
from gpuanat.worker.probe.model_flops import model_flops
from gpuanat.worker.probe.module_memory import ModuleFollower, Ownership
from gpuanat.worker.probe.module_readings import ModuleReadings
from gpuanat.worker.probe.oom_capture import CAPTURE
from gpuanat.worker.probe.operations import OperationsProfiler, requested_steps
from gpuanat.worker.probe.sink import default_emit, warn
from gpuanat.worker.probe.tensors import (
    parameter_elements,
    quantization_state_tensors,
    read_gradients_before_zero_steps,
    unique_storage_bytes,
)
from gpuanat.worker.probe.timing import StepPhases

FIRST_MEASURED_STEPS = 3
WARMUP_STEPS_OF_AN_OPEN_RUN = 10
"""Warm-up steps when the loop does not say how many steps it will run (a plain loop's `track` without
`total_steps`)."""


class Probe(ModuleReadings):
    """Measures weights, gradients, optimizer state, activations and throughput of a training run, at the points
    its adapter calls (see the module docstring).

    `emit` receives each event. Without it, events go to gpuanat when gpuanat launched the script
    (`gpuanat run --script`), else to this user's private publication file for `gpuanat watch PID`
    (unless `publish=False`); either way the latest are also kept on the probe (`last_step`,
    `last_bands`, `summary`). The probe never raises into training: a parent that went away ends the
    run gracefully (`step_ends` returns True), and any other failure turns the probe off with one warning.
    `profile_ops` steps after warm-up are profiled for the operations anatomy (default: as many as
    `GPUANAT_PROFILE_OPS` says, none without it), their Chrome trace written to `profile_ops_trace` (default:
    `GPUANAT_PROFILE_OPS_TRACE`).
    """

    def __init__(
        self,
        emit: Callable[[Event], None] | None = None,
        *,
        exact_every_steps: int = 50,
        publish: bool = True,
        profile_ops: int | None = None,
        profile_ops_trace: str | None = None,
    ) -> None:
        self._lifecycle = emit is None
        """Whether this probe sends hello and done itself (gpuanat's worker sends them otherwise)."""
        self._emit = emit if emit is not None else exported(default_emit(publish))  # GPUANAT_METRICS: served too
        self.exact_every_steps = exact_every_steps
        self.last_step: Step | None = None
        self.last_bands: ProbeBands | None = None
        self.summary: dict[str, Any] = {}
        self._parent_gone = False
        self.disabled_reason: str | None = None
        """Why the probe turned itself off after an unexpected error; None while it works."""
        self.probe_time_s = 0.0
        """Wall time spent inside this probe's callbacks and hooks."""
        self.probe_time_by_part_s = dict.fromkeys(PROBE_TIME_PARTS, 0.0)
        """`probe_time_s` split: once per run ("setup": start and end), the steps measured exactly, the other
        steps, and the waits of the two CUDA synchronisations that bracket the steady-state window (the GPU's
        queued work finishing, not the probe's own work)."""
        self._modules: ModuleFollower | None = None
        """Follows the model's modules and what autograd saves in them on measured steps (not under compile)."""
        self._ownership: Ownership | None = None
        """Which module owns each parameter (not under compile)."""
        self._activations_by_module: dict[str, int] | None = None
        self._gradients_by_module: dict[str, int] = {}
        self._following = False
        """Whether this step's modules are followed (a measured step: on a GPU the first `MODULE_STEPS_ON_A_GPU`)."""
        self._nvml: NvmlReader | None = None
        asked_steps, asked_trace = requested_steps()
        self.profile_ops_steps = asked_steps if profile_ops is None else profile_ops
        """Steps profiled for the operations anatomy after warm-up (0: none); by default what
        `GPUANAT_PROFILE_OPS` asks."""
        self._profile_ops_trace = profile_ops_trace or asked_trace
        self._operations: OperationsProfiler | None = None

    def _disable(self, reason: str) -> None:
        self.disabled_reason = reason
        if self._modules is not None:
            self._modules.stop()
            self._modules = None
        for hook in getattr(self, "_hooks", []):
            hook.remove()
        warn(f"the probe turned itself off after an error (training goes on): {reason}")

    # --- setup -----------------------------------------------------------------------------
    @never_raises
    def begin(
        self,
        model: Any,
        optimizer: Any,
        *,
        total_steps: int | None,
        compiled: bool,
        training_config: Callable[[torch.device], dict[str, Any]],
        framework_versions: Mapping[str, str],
        forward_hooks: bool = True,
        steps_begin_at_forward: bool = False,
    ) -> None:
        """Training begins: `model` (as it trains, unwrapped) and its `optimizer` are measured, their forward hooks
        set (unless `forward_hooks` is False: the adapter calls `forward_begins` and `forward_ends`), the model
        announced. `total_steps` optimizer steps will run (None: not known); `compiled`: the model is
        torch.compile'd. Without an `emit`, `hello` is sent too, with `training_config(device)` (the run's
        techniques in RunConfig's terms) and the training framework's `framework_versions`. With
        `steps_begin_at_forward` each step begins at its first training forward pass, the adapter calling only
        `step_ends`."""
        self._model = model
        self._optimizer = optimizer
        self._steps_begin_at_forward = steps_begin_at_forward
        self._next_step_at_forward = 1 if steps_begin_at_forward else None
        self._samples_from_loop = self._tokens_from_loop = False
        read_gradients_before_zero_steps(optimizer, self._read_gradients_before_step)
        first_parameter = next(model.parameters())
        self._device = first_parameter.device
        self._cuda = self._device.type == "cuda"
        self._compiled = compiled
        parameters = list(model.parameters())
        self._modules = None if compiled else ModuleFollower(model, self._device)
        self._ownership = None if compiled else Ownership(model, self._device)
        CAPTURE.describe = self.state_at_failure
        if self._cuda:
            CAPTURE.attach()
        self._weights_bytes = unique_storage_bytes(
            [*parameters, *model.buffers(), *quantization_state_tensors(parameters)]
        )
        unique_params = {id(p): p for p in parameters}.values()
        # Warm-up: the first tenth of the run, at least 2 and at most 20 optimizer steps.
        self.warmup_steps = min(20, max(2, math.ceil(total_steps / 10))) if total_steps else WARMUP_STEPS_OF_AN_OPEN_RUN
        if self.profile_ops_steps > 0:
            # Profiled after warm-up (the profiler warming up a step before), and out of the steady window, which
            # begins after them.
            first = self.warmup_steps + 2
            if total_steps:
                first = max(2, min(first, total_steps - self.profile_ops_steps + 1))
            self._operations = OperationsProfiler(
                self.profile_ops_steps,
                first,
                cuda=self._device.type == "cuda",
                trace_path=self._profile_ops_trace,
                emit=self._emit_safely,
            )
            self.warmup_steps = max(self.warmup_steps, self._operations.last_step)
        if self._lifecycle:
            self._emit_safely(hello_event(self._device, framework_versions, training_config(self._device)))
        self._emit_safely(
            ModelInfo(
                params=sum(parameter_elements(p) for p in unique_params),
                trainable_params=sum(parameter_elements(p) for p in unique_params if p.requires_grad),
                weights_bytes=self._weights_bytes,
                dtype=str(first_parameter.dtype).removeprefix("torch."),
                total_steps=total_steps or None,
                **model_flops(model),
            )
        )
        self._samples = 0
        self._tokens = 0
        self.logged_values = LoggedValues()
        self._measuring = False
        self._peak_allocated_bytes = self._peak_reserved_bytes = None
        if self._cuda:
            self._peak_allocated_bytes, _, self._peak_reserved_bytes = allocator_bytes(self._device)
        self._steady_start: tuple[float, int] | None = None
        self._steady_end: tuple[float, int] | None = None
        self._step_peak_floor_bytes = 0
        """The step's peak allocated memory before the forward pass restarted the allocator's counter."""
        self._buffers_at_start_bytes: int | None = None
        if self._cuda:
            self._nvml = NvmlReader.open(self._device)
            metrics = served_metrics()
            if self._nvml is not None and metrics is not None:
                metrics.set_gpu(*self._nvml.identity())
            self._nvml_read_at_reserved_bytes: int | None = None
            # What is allocated before the first step beyond weights, gradients and optimizer state: the buffers a
            # distributed wrapper keeps for the whole run (DDP's gradient buckets, DeepSpeed's flat buffers).
            allocated_now = allocator_bytes(self._device)[0]
            self._buffers_at_start_bytes = max(
                0, allocated_now - self._weights_bytes - self._gradients_bytes_now() - self._optimizer_state_bytes_now()
            )
        before_forward, after_forward = self._before_forward, self._after_forward
        if self._compiled:
            # Traced by Dynamo, the hooks would put the probe into the compiled graph: a guard on its counters
            # (a recompilation at every step until Dynamo gives up) and graph breaks at its clock reads. Disabled,
            # they run eagerly just outside the graph, and Dynamo counts no break for them.
            # (torch.compiler.disable is unannotated in torch: mypy cannot check a call of it)
            before_forward = torch.compiler.disable(before_forward)  # type: ignore[no-untyped-call]
            after_forward = torch.compiler.disable(after_forward)  # type: ignore[no-untyped-call]
        self._hooks = (
            [
                model.register_forward_pre_hook(before_forward, with_kwargs=True),
                model.register_forward_hook(after_forward, with_kwargs=True),
            ]
            if forward_hooks
            else []
        )
        self._train_start_s = time.perf_counter()
        self._last_step_end_s = self._train_start_s
        self._step_phases = StepPhases(self._cuda)
        self._steady_phases_s = dict.fromkeys(STEP_PHASES, 0.0)
        self._steady_steps = 0
        self._steady_caught_up_steps = 0

    # --- the forward pass --------------------------------------------------------------------
    @never_raises
    def _before_forward(self, module, args, kwargs):  # type: ignore[no-untyped-def]
        if module.training:
            self._forward_begins(batch_tensors(args, kwargs))

    @never_raises
    def _after_forward(self, module, args, kwargs, output):  # type: ignore[no-untyped-def]
        if module.training:
            self._forward_ends(batch_tensors(args, kwargs), output)

    @never_raises
    def forward_begins(self, batch: list[torch.Tensor]) -> None:
        """A training forward pass begins on `batch` (its tensors): for an adapter that sets no forward hooks."""
        self._forward_begins(batch)

    @never_raises
    def forward_ends(self, batch: list[torch.Tensor], output: Any = None) -> None:
        """That forward pass ended (its loss computed, the backward next), with the model's `output` if known."""
        self._forward_ends(batch, output)

    def _forward_begins(self, batch: list[torch.Tensor]) -> None:
        if self._next_step_at_forward is not None:
            self._step_begins(self._next_step_at_forward)
            self._next_step_at_forward = None
        if not torch.compiler.is_compiling():  # a clock read would break torch.compile's graph
            self._step_phases.forward_begins()
        if batch and not self._samples_from_loop:
            self._samples += int(batch[0].shape[0]) if batch[0].dim() else 1
        if batch and not self._tokens_from_loop:
            self._tokens += int(batch[0].numel())
        if self._measuring:
            self._batch_bytes = unique_storage_bytes(batch)
            if self._cuda:
                # The forward pass's own peak: keep the step's peak so far, then restart the counter.
                self._step_peak_floor_bytes = max(self._step_peak_floor_bytes, allocator_bytes(self._device)[1])
                torch.cuda.reset_peak_memory_stats(self._device)
            if self._following and self._modules is not None:
                self._modules.forward_begins(batch)

    def _forward_ends(self, batch: list[torch.Tensor], output: Any) -> None:
        if not torch.compiler.is_compiling():
            self._step_phases.forward_ends()
        if not self._measuring:
            return
        if self._following and self._modules is not None:
            self._modules.forward_ends()
        gradients_now = self._gradients_bytes_now()
        optimizer_state_now = self._optimizer_state_bytes_now()
        self._gradients_at_forward_end_bytes = max(self._gradients_at_forward_end_bytes, gradients_now)
        self._optimizer_at_forward_end_bytes = max(self._optimizer_at_forward_end_bytes, optimizer_state_now)
        if self._cuda:
            allocated, forward_peak, _ = allocator_bytes(self._device)
            self._forward_peak_bytes = max(self._forward_peak_bytes or 0, forward_peak)
            live_bytes = (
                self._weights_bytes
                + gradients_now
                + optimizer_state_now
                + self._batch_bytes
                + (self._buffers_at_start_bytes or 0)
            )
            activations = allocated - live_bytes
        elif self._following and self._modules is not None:
            activations = self._modules.saved_bytes()
        else:
            activations = None
        if self._following and self._modules is not None and (activations or 0) >= (self._activations_bytes or 0):
            self._activations_by_module = self._modules.saved_by_module()  # the largest micro-batch's
        if activations is not None:
            self._activations_bytes = max(self._activations_bytes or 0, activations)
        logits = getattr(output, "logits", None)
        if isinstance(logits, torch.Tensor):
            self._logits_bytes = max(self._logits_bytes or 0, unique_storage_bytes([logits]))
        elif hasattr(output, "logits"):  # a model that has logits and returned none (Liger's fused loss): 0 bytes
            self._logits_bytes = self._logits_bytes or 0

    @never_raises
    def _read_gradients_before_step(self) -> None:
        if self._measuring:
            self._gradients_bytes = max(self._gradients_bytes, self._gradients_bytes_now())

    # --- step callbacks ----------------------------------------------------------------------
    @never_raises
    def step_begins(self, step: int) -> None:
        """Optimizer step `step` (from 1) begins: its batches are in hand."""
        self._step_begins(step)

    def _step_begins(self, step: int) -> None:
        self._step_phases.step_begins()
        self._measuring = step <= FIRST_MEASURED_STEPS or step % self.exact_every_steps == 0
        if self._measuring:
            self._activations_bytes = None
            self._gradients_bytes = 0
            self._gradients_at_forward_end_bytes = 0
            self._optimizer_at_forward_end_bytes = 0
            self._forward_peak_bytes = None
            self._logits_bytes = None
            self._batch_bytes = 0
        self._following = self._follows_modules(step)
        if self._following:
            self._activations_by_module = None
            self._gradients_by_module = {}
        self._step_peak_floor_bytes = 0
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(self._device)
        if self._operations is not None:
            self._profiling(self._operations.step_begins, step)

    def _profiling(self, call: Callable[[int], None], step: int) -> None:
        """`call(step)` of the operations profiler, its time set apart from the probe's cost."""
        started_s = time.perf_counter()
        try:
            call(step)
        finally:
            self.probe_time_by_part_s["profiling"] += time.perf_counter() - started_s

    @never_raises
    def optimizer_begins(self) -> None:
        """The gradients of this step are complete; the optimizer steps next."""
        self._step_phases.optimizer_begins()
        if self._measuring:
            self._gradients_bytes = max(self._gradients_bytes, self._gradients_bytes_now())
        if self._following:
            self._read_gradients_by_module()

    @never_raises
    def logged(self, loss: Any, summary: Mapping[str, float], *, step: int | None = None, **more: Any) -> None:
        """The loop logged at step `step` (None: the last step ended) its `loss` and, in `more`, `learning_rate` and
        `grad_norm` (each None when not this time; a number or a tensor) and, at the end, its own figures
        (`summary`: "train_runtime", "train_samples_per_second", "train_loss", as HF Trainer names them)."""
        last = self.last_step.step if self.last_step else 0  # a tensor's read waits for the GPU: before loss_read
        self.logged_values.update(last if step is None else step, loss, **more)
        self._step_phases.loss_read()
        self.summary.update(summary)

    @never_raises
    def step_ends(
        self, step: int, max_steps: int | None, samples: int | None = None, tokens: int | None = None
    ) -> bool:
        """Optimizer step `step` of `max_steps` (None: not known) ended, having trained on `samples` samples and
        `tokens` tokens when the loop says so (else the probe counts the rows of each forward pass's first tensor);
        returns whether training should stop (gpuanat went away)."""
        if samples is not None:  # the loop's count replaces the forward passes' from its first
            self._samples = (self._samples if self._samples_from_loop else 0) + samples
            self._samples_from_loop = True
        if tokens is not None:
            self._tokens = (self._tokens if self._tokens_from_loop else 0) + tokens
            self._tokens_from_loop = True
        if self._steps_begin_at_forward:
            self._next_step_at_forward = step + 1
        if self._operations is not None:
            self._profiling(self._operations.step_ends, step)
        boundary = step == self.warmup_steps or step == max_steps
        if boundary and self._cuda:
            self._step_phases.waits_for_gpu()
            self._synchronize()
        now_s = time.perf_counter()
        # one stamp ends the step for its phases and its step time: they add up, also when the host is preempted
        phases, caught_up = self._step_phases.step_ends(now_s)
        if self.warmup_steps < step:  # the steady window's steps, as the steady samples/s counts them
            self._steady_steps += 1
            self._steady_caught_up_steps += bool(caught_up)
            for phase, seconds in phases.items():
                self._steady_phases_s[phase] += seconds
        if step == self.warmup_steps:
            self._steady_start = (now_s, self._samples)
        elif step == max_steps and self._steady_start is not None:
            self._steady_end = (now_s, self._samples)
        allocated = peak = reserved = None
        nvml_device_used = nvml_process_used = None
        if self._cuda:
            allocated, peak, reserved = allocator_bytes(self._device)
            peak = max(self._step_peak_floor_bytes, peak)
            # NVML's reading of this process moves only when memory is reserved: read it then (and on
            # measured steps), in the same instant as `reserved`, so a sampler's timing cannot mix two states.
            if self._nvml is not None and (self._measuring or reserved != self._nvml_read_at_reserved_bytes):
                nvml_device_used, nvml_process_used = self._nvml.read()
                self._nvml_read_at_reserved_bytes = reserved
            self._peak_allocated_bytes = max(self._peak_allocated_bytes or 0, peak)
            self._peak_reserved_bytes = max(self._peak_reserved_bytes or 0, reserved)
        bands = None
        if self._measuring:
            bands = self.measured_bands(step)
            bands = dataclasses.replace(bands, modules=self._module_rows(bands))
            self.last_bands = bands
            self._module_step_ends()
            self._measuring = False
        self.last_step = Step(
            step=step,
            samples=self._samples,
            tokens=self._tokens,
            step_time_s=now_s - self._last_step_end_s,
            elapsed_s=now_s - self._train_start_s,
            allocated_bytes=allocated,
            peak_allocated_bytes=peak,
            reserved_bytes=reserved,
            bands=bands,
            monotonic_s=time.monotonic(),
            nvml_device_used_bytes=nvml_device_used,
            nvml_process_used_bytes=nvml_process_used,
            phases_s={phase: round(seconds, 6) for phase, seconds in phases.items()},
            gpu_caught_up=caught_up,
            **self.logged_values.fields(),
        )
        self._last_step_end_s = now_s
        self._emit_safely(self.last_step)
        return self._parent_gone

    @never_raises
    def end(self, steps: int, status: str = "ok") -> None:
        """Training ended after `steps` optimizer steps (`status` "stopped": interrupted): the hooks go, the steady
        window closes, and without an `emit`, `done` is sent."""
        if getattr(self, "_ended", False):  # said once, whichever of the loop's ends comes first
            return
        self._ended = True
        if CAPTURE.describe == self.state_at_failure:  # the process's observer would keep this model alive
            CAPTURE.describe = None
        for hook in self._hooks:
            hook.remove()
        if self._modules is not None:
            self._modules.stop()
        if self._operations is not None and not self._operations.done:
            self._operations.stop()
        if self._steady_start is not None and self._steady_end is None:
            if self._cuda:
                self._synchronize()
            self._steady_end = (time.perf_counter(), self._samples)
        self.summary.update(self.steady_state())
        # A loop that does not report HF Trainer's figures (a plain loop, Lightning): the probe's own, as Trainer
        # counts them (the whole training time, warm-up included; the last loss read)
        runtime_s = time.perf_counter() - self._train_start_s
        self.summary.setdefault("train_runtime", runtime_s)
        self.summary.setdefault("train_samples_per_second", self._samples / runtime_s if runtime_s > 0 else None)
        self.summary.setdefault("train_loss", self.logged_values.loss)
        if self._lifecycle:
            self._emit_safely(self.done_event(status, steps))
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None

    def _synchronize(self) -> None:
        started_s = time.perf_counter()
        torch.cuda.synchronize(self._device)
        self.probe_time_by_part_s["synchronize"] += time.perf_counter() - started_s

    def _emit_safely(self, event: Event) -> None:
        if self._parent_gone:
            return
        try:
            self._emit(event)
        except ParentGone:
            self._parent_gone = True
