"""AnatomyCallback: a TrainerCallback that measures memory and throughput inside a training run.

Usable in anyone's script (`from gpuanat.probe import AnatomyCallback`) and used by gpuanat's own
worker. Cheap by design — the probe must cost under 1% of step time:
- every optimizer step: a timestamp and three CUDA allocator counters (host-side reads, no sync);
- on "measured" steps only (the first three, then every `exact_every_steps`): exact byte counts of
  weights, gradients and optimizer state (unique tensor storages) and the activations at the end of
  the forward pass;
- two CUDA synchronisations per run, bracketing the steady-state window.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from transformers import TrainerCallback

from gpuanat.core.protocol import Event, ModelInfo, ProbeBands, Step
from gpuanat.worker.events import EventWriter, ParentGone

FIRST_MEASURED_STEPS = 3
EVENTS_FD_ENV = "GPUANAT_EVENTS_FD"


def unique_storage_bytes(tensors: Iterable[torch.Tensor | None], device: torch.device | None = None) -> int:
    """Bytes of the distinct storages behind `tensors` (views and shared storages count once)."""
    sizes: dict[tuple[str, int], int] = {}
    for tensor in tensors:
        if tensor is None or (device is not None and tensor.device != device):
            continue
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            continue
        sizes[(str(storage.device), storage.data_ptr())] = storage.nbytes()
    return sum(sizes.values())


def optimizer_state_tensors(optimizer: Any) -> Iterable[torch.Tensor]:
    """Every tensor held in `optimizer.state`, also inside nested containers."""
    if optimizer is None:
        return
    inner = getattr(optimizer, "optimizer", optimizer)  # accelerate's AcceleratedOptimizer wraps the real one
    stack: list[Any] = list(getattr(inner, "state", {}).values())
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def _batch_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    values = [*args, *kwargs.values()]
    return [value for value in values if isinstance(value, torch.Tensor)]


def _default_writer() -> EventWriter | None:
    fd = os.environ.get(EVENTS_FD_ENV)
    return EventWriter(int(fd)) if fd and fd.isdigit() else None


class AnatomyCallback(TrainerCallback):
    """Measures weights, gradients, optimizer state, activations and throughput of a Trainer run.

    `emit` receives each event; by default events go to the file descriptor named by
    GPUANAT_EVENTS_FD when gpuanat launched the process, and are otherwise only kept on the
    callback (`last_step`, `summary`). The probe never raises into training: a parent that went
    away ends the run gracefully.
    """

    def __init__(self, emit: Callable[[Event], None] | None = None, *, exact_every_steps: int = 50) -> None:
        if emit is None:
            writer = _default_writer()
            emit = writer.emit if writer is not None else (lambda event: None)
        self._emit = emit
        self.exact_every_steps = exact_every_steps
        self.last_step: Step | None = None
        self.last_bands: ProbeBands | None = None
        self.summary: dict[str, Any] = {}
        self._parent_gone = False

    # --- setup -----------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):  # type: ignore[override]
        self._model = model
        self._optimizer = optimizer
        first_parameter = next(model.parameters())
        self._device = first_parameter.device
        self._cuda = self._device.type == "cuda"
        self._compiled = bool(getattr(args, "torch_compile", False))
        parameters = list(model.parameters())
        self._parameter_storage_keys = {
            (str(p.untyped_storage().device), p.untyped_storage().data_ptr()) for p in parameters
        }
        self._weights_bytes = unique_storage_bytes([*parameters, *model.buffers()])
        unique_params = {id(p): p for p in parameters}.values()
        total_steps = int(state.max_steps or 0)
        # Warm-up: the first tenth of the run, at least 2 and at most 20 optimizer steps.
        self.warmup_steps = min(20, max(2, math.ceil(total_steps / 10)))
        self._emit_safely(ModelInfo(
            params=sum(p.numel() for p in unique_params),
            trainable_params=sum(p.numel() for p in unique_params if p.requires_grad),
            weights_bytes=self._weights_bytes,
            dtype=str(first_parameter.dtype).removeprefix("torch."),
            total_steps=total_steps,
        ))
        self._samples = 0
        self._tokens = 0
        self._loss: float | None = None
        self._measuring = False
        self._peak_allocated_bytes = torch.cuda.memory_allocated(self._device) if self._cuda else None
        self._peak_reserved_bytes = torch.cuda.memory_reserved(self._device) if self._cuda else None
        self._steady_start: tuple[float, int] | None = None
        self._steady_end: tuple[float, int] | None = None
        self._hooks = [
            model.register_forward_pre_hook(self._before_forward, with_kwargs=True),
            model.register_forward_hook(self._after_forward, with_kwargs=True),
        ]
        self._train_start_s = time.perf_counter()
        self._last_step_end_s = self._train_start_s
        return control

    # --- forward hooks -----------------------------------------------------------------------
    def _before_forward(self, module, args, kwargs):  # type: ignore[no-untyped-def]
        if not module.training:
            return None
        batch = _batch_tensors(args, kwargs)
        if batch:
            self._samples += int(batch[0].shape[0]) if batch[0].dim() else 1
            self._tokens += int(batch[0].numel())
        if self._measuring:
            self._batch_bytes = unique_storage_bytes(batch)
            if not self._cuda and not self._compiled:
                self._saved_storages: dict[tuple[str, int], int] = {}
                self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack_saved, lambda t: t)
                self._saved_hooks.__enter__()
        return None

    def _pack_saved(self, tensor: torch.Tensor) -> torch.Tensor:
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return tensor
        key = (str(storage.device), storage.data_ptr())
        if key not in self._parameter_storage_keys:
            self._saved_storages[key] = storage.nbytes()
        return tensor

    def _after_forward(self, module, args, kwargs, output):  # type: ignore[no-untyped-def]
        if not (module.training and self._measuring):
            return None
        gradients_now = self._gradients_bytes_now()
        self._gradients_at_forward_end_bytes = max(self._gradients_at_forward_end_bytes, gradients_now)
        if self._cuda:
            allocated = torch.cuda.memory_allocated(self._device)
            live_bytes = self._weights_bytes + gradients_now + self._optimizer_state_bytes_now() + self._batch_bytes
            activations = allocated - live_bytes
        elif not self._compiled:
            self._saved_hooks.__exit__(None, None, None)
            batch_keys = {
                (str(t.untyped_storage().device), t.untyped_storage().data_ptr())
                for t in _batch_tensors(args, kwargs)
            }
            activations = sum(size for key, size in self._saved_storages.items() if key not in batch_keys)
        else:
            activations = None
        if activations is not None:
            self._activations_bytes = max(self._activations_bytes or 0, activations)
        return None

    def _gradients_bytes_now(self) -> int:
        return unique_storage_bytes((p.grad for p in self._model.parameters()), self._device)

    def _optimizer_state_bytes_now(self) -> int:
        return unique_storage_bytes(optimizer_state_tensors(self._optimizer), self._device)

    # --- step callbacks ----------------------------------------------------------------------
    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[override]
        step = state.global_step + 1
        self._measuring = step <= FIRST_MEASURED_STEPS or step % self.exact_every_steps == 0
        if self._measuring:
            self._activations_bytes: int | None = None
            self._gradients_bytes = 0
            self._gradients_at_forward_end_bytes = 0
            self._batch_bytes = 0
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(self._device)
        return control

    def on_pre_optimizer_step(self, args, state, control, **kwargs):  # type: ignore[override]
        if self._measuring:
            self._gradients_bytes = self._gradients_bytes_now()
        return control

    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[override]
        if logs:
            if "loss" in logs:
                self._loss = float(logs["loss"])
            for key in ("train_runtime", "train_samples_per_second", "train_loss"):
                if key in logs:
                    self.summary[key] = logs[key]
        return control

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[override]
        step = state.global_step
        boundary = step == self.warmup_steps or step == state.max_steps
        if boundary and self._cuda:
            torch.cuda.synchronize(self._device)
        now_s = time.perf_counter()
        if step == self.warmup_steps:
            self._steady_start = (now_s, self._samples)
        elif step == state.max_steps and self._steady_start is not None:
            self._steady_end = (now_s, self._samples)
        allocated = peak = reserved = None
        if self._cuda:
            allocated = torch.cuda.memory_allocated(self._device)
            peak = torch.cuda.max_memory_allocated(self._device)
            reserved = torch.cuda.memory_reserved(self._device)
            self._peak_allocated_bytes = max(self._peak_allocated_bytes or 0, peak)
            self._peak_reserved_bytes = max(self._peak_reserved_bytes or 0, reserved)
        bands = None
        if self._measuring:
            bands = ProbeBands(
                weights_bytes=self._weights_bytes,
                gradients_bytes=self._gradients_bytes,
                optimizer_state_bytes=self._optimizer_state_bytes_now(),
                activations_bytes=self._activations_bytes,
                activations_method=("allocator" if self._cuda
                                    else "unavailable" if self._compiled else "saved_tensors"),
                batch_bytes=self._batch_bytes,
                measured_at_step=step,
                gradients_at_forward_end_bytes=self._gradients_at_forward_end_bytes,
            )
            self.last_bands = bands
            self._measuring = False
        self.last_step = Step(
            step=step,
            samples=self._samples,
            tokens=self._tokens,
            step_time_s=now_s - self._last_step_end_s,
            elapsed_s=now_s - self._train_start_s,
            loss=self._loss,
            allocated_bytes=allocated,
            peak_allocated_bytes=peak,
            reserved_bytes=reserved,
            bands=bands,
            monotonic_s=time.monotonic(),
        )
        self._last_step_end_s = now_s
        self._emit_safely(self.last_step)
        if self._parent_gone:
            control.should_training_stop = True
        return control

    def on_train_end(self, args, state, control, **kwargs):  # type: ignore[override]
        for hook in self._hooks:
            hook.remove()
        if self._steady_start is not None and self._steady_end is None:
            if self._cuda:
                torch.cuda.synchronize(self._device)
            self._steady_end = (time.perf_counter(), self._samples)
        self.summary.update(self.steady_state())
        return control

    # --- results -----------------------------------------------------------------------------
    def steady_state(self) -> dict[str, Any]:
        """Samples/s after warm-up, or None with the reason."""
        result: dict[str, Any] = {"warmup_steps": getattr(self, "warmup_steps", 0),
                                  "steady_samples_per_second": None, "steady_reason": None}
        start, end = self._steady_start, getattr(self, "_steady_end", None)
        if start is None or end is None or end[1] <= start[1] or end[0] <= start[0]:
            result["steady_reason"] = (f"too few steps: the first {result['warmup_steps']} are warm-up "
                                       "and at least one more is needed")
        else:
            result["steady_samples_per_second"] = (end[1] - start[1]) / (end[0] - start[0])
        return result

    @property
    def samples(self) -> int:
        return getattr(self, "_samples", 0)

    @property
    def peak_allocated_bytes(self) -> int | None:
        """Highest allocated memory seen at any step so far, including now."""
        if not getattr(self, "_cuda", False):
            return None
        return max(self._peak_allocated_bytes or 0, torch.cuda.max_memory_allocated(self._device))

    @property
    def peak_reserved_bytes(self) -> int | None:
        if not getattr(self, "_cuda", False):
            return None
        return max(self._peak_reserved_bytes or 0, torch.cuda.memory_reserved(self._device))

    def _emit_safely(self, event: Event) -> None:
        if self._parent_gone:
            return
        try:
            self._emit(event)
        except ParentGone:
            self._parent_gone = True
