"""AnatomyCallback: a TrainerCallback that measures memory and throughput inside a training run.

Usable in anyone's script (`from gpuanat.probe import AnatomyCallback`) and used by gpuanat's own
worker. Cheap by design — the probe must cost under 1% of step time:
- every optimizer step: a timestamp and one read of the CUDA allocator's counters (host-side, no sync);
- on "measured" steps only (the first three, then every `exact_every_steps`): exact byte counts of
  weights, gradients and optimizer state (unique tensor storages), the activations at the end of
  the forward pass, and the forward pass's peak;
- on measured steps and whenever torch's reserved memory changed: NVML's device and per-process memory,
  read right after the allocator's, so the bands can be checked against NVML at the same instant;
- two CUDA synchronisations per run, bracketing the steady-state window.
The time spent in its callbacks and hooks is itself measured (`probe_time_s`), so its cost is known.

Where the events go: to the `emit` given (gpuanat's worker passes its pipe); else to the sink that
gpuanat's script launcher installed (`gpuanat run --script`); else, in a script gpuanat did not launch,
they are published to a private per-user file that `gpuanat watch PID` reads (`gpuanat.core.measure.publish`;
`publish=False` opts out). Without an `emit` the callback also sends `hello` when training begins and
`done` when it ends, which gpuanat's worker otherwise sends itself.

The probe never raises into training: an unexpected error turns the probe off with one warning on
stderr, and a publication file that cannot be written turns publishing off the same way.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from transformers import TrainerCallback

from gpuanat.core.measure.nvml_source import nvml_memory_info, nvml_processes
from gpuanat.core.measure.publish import Publisher, PublishRefused, publication_dirs
from gpuanat.core.run.protocol import STEP_PHASES, Done, Event, Hello, ModelInfo, ProbeBands, Step
from gpuanat.worker.events import ParentGone

FIRST_MEASURED_STEPS = 3
PROBE_TIME_PARTS = ("setup", "measured steps", "other steps", "synchronize")
EVENTS_FD_ENV = "GPUANAT_EVENTS_FD"

_installed_emit: Callable[[Event], None] | None = None
"""Where callbacks built without `emit` send their events when gpuanat launched the script."""
_publisher: Publisher | None = None
_publishing_failed = False


def install_default_emit(emit: Callable[[Event], None] | None) -> None:
    """Make callbacks constructed without `emit` send their events to `emit` (gpuanat's script launcher
    calls this with its events pipe); None restores publishing to the per-user file."""
    global _installed_emit
    _installed_emit = emit


def _warn(message: str) -> None:
    print(f"gpuanat: {message}", file=sys.stderr, flush=True)


def _remove_publication(publisher: Publisher) -> None:
    if publisher.pid == os.getpid():  # not in forked DataLoader workers
        publisher.close(remove=True)


def _publish(event: Event) -> None:
    """Publish to this process's file; the first failure turns publishing off for the process."""
    global _publisher, _publishing_failed
    if _publishing_failed:
        return
    try:
        if _publisher is None or _publisher.pid != os.getpid():
            _publisher = Publisher(publication_dirs(os.environ, os.getuid())[0])
            atexit.register(_remove_publication, _publisher)
        _publisher.publish(event)
    except (OSError, PublishRefused) as error:
        _publishing_failed = True
        _warn(f"publishing for `gpuanat watch` turned off: {error}")


def published_path() -> str | None:
    """The file this process publishes to, once it has published something."""
    return str(_publisher.path) if _publisher is not None and not _publishing_failed else None


def _never_raises(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a callback or hook, adding its wall time to `probe_time_s`; on an unexpected error turn the
    probe off (one warning) and return None, which Trainer and torch both read as "no change"."""

    @functools.wraps(method)
    def guarded(self: AnatomyCallback, *args: Any, **kwargs: Any) -> Any:
        if self.disabled_reason is not None:
            return None
        started_s = time.perf_counter()
        measuring_before = getattr(self, "_measuring", False)
        synchronize_before_s = self.probe_time_by_part_s["synchronize"]
        try:
            return method(self, *args, **kwargs)
        except Exception as error:
            self._disable(f"{type(error).__name__}: {error}")
            return None
        finally:
            elapsed_s = time.perf_counter() - started_s
            waited_s = self.probe_time_by_part_s["synchronize"] - synchronize_before_s
            if method.__name__ in ("on_train_begin", "on_train_end"):
                part = "setup"
            else:
                part = "measured steps" if measuring_before or getattr(self, "_measuring", False) else "other steps"
            self.probe_time_by_part_s[part] += elapsed_s - waited_s
            self.probe_time_s += elapsed_s

    return guarded


def _local_shards(tensor: torch.Tensor) -> Iterable[torch.Tensor]:
    """The memory behind `tensor` on this rank: the tensor itself; for an FSDP2 DTensor its local shard; for a
    DeepSpeed ZeRO-3 parameter (emptied between uses) its partition, and the full tensor while gathered."""
    local = getattr(tensor, "_local_tensor", None)
    yield local if isinstance(local, torch.Tensor) else tensor
    partition = getattr(tensor, "ds_tensor", None)
    if isinstance(partition, torch.Tensor):
        yield partition


def unique_storage_bytes(tensors: Iterable[torch.Tensor | None], device: torch.device | None = None) -> int:
    """Bytes of the distinct storages behind `tensors` (views and shared storages count once; a sharded tensor
    counts its shard on this rank)."""
    # Keyed by (is CUDA, address): CUDA's unified virtual addressing gives every device's allocations distinct
    # addresses, and this is about three times cheaper than building each storage's device.
    sizes: dict[tuple[bool, int], int] = {}
    for tensor in tensors:
        if tensor is None:
            continue
        for shard in _local_shards(tensor):
            if device is not None and shard.device != device:
                continue
            try:
                storage = shard.untyped_storage()
                sizes[(shard.is_cuda, storage.data_ptr())] = storage.nbytes()
            except (RuntimeError, NotImplementedError):  # a tensor without storage of its own
                continue
    return sum(sizes.values())


def quantization_state_tensors(parameters: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]:
    """The tensors a bitsandbytes 4-bit weight (`Params4bit`) keeps beside its packed values, in its `quant_state`:
    the blocks' scales (themselves quantized to 8 bits with double quantization), the scales' scales, their offset
    and the code tables. Weight memory that is neither a parameter nor a buffer."""
    for parameter in parameters:
        state = getattr(parameter, "quant_state", None)
        while state is not None:
            for name in ("absmax", "code", "offset"):
                value = getattr(state, name, None)
                if isinstance(value, torch.Tensor):
                    yield value
            state = getattr(state, "state2", None)


def parameter_elements(parameter: torch.Tensor) -> int:
    """Elements of a parameter as the model defines it: a 4-bit weight's storage packs two a byte, and its
    quantization state keeps the original shape."""
    shape = getattr(getattr(parameter, "quant_state", None), "shape", None)
    return math.prod(shape) if shape is not None else parameter.numel()


def _storage_keys(tensors: Iterable[torch.Tensor]) -> set[tuple[str, int]]:
    """(device, address) of the storages behind `tensors` (their shards on this rank)."""
    keys = set()
    for tensor in tensors:
        for shard in _local_shards(tensor):
            with contextlib.suppress(RuntimeError, NotImplementedError):
                storage = shard.untyped_storage()
                keys.add((str(storage.device), storage.data_ptr()))
    return keys


def allocator_bytes(device: torch.device) -> tuple[int, int, int]:
    """(allocated, peak allocated since the last reset, reserved) from one read of the allocator's counters:
    `torch.cuda.memory_allocated` and friends each build and flatten the whole statistics dictionary."""
    stats = torch.cuda.memory_stats_as_nested_dict(device)
    allocated = stats.get("allocated_bytes", {}).get("all", {})
    return (allocated.get("current", 0), allocated.get("peak", 0),
            stats.get("reserved_bytes", {}).get("all", {}).get("current", 0))


DEEPSPEED_MASTER_WEIGHTS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")
"""Where DeepSpeed's ZeRO optimizers keep this rank's fp32 master weights (stages 1-2, stage 3): optimizer state
in ZeRO's accounting (12 bytes a parameter with Adam: master weights, momentum, variance), outside `.state`."""


DEEPSPEED_GRADIENTS = ("averaged_gradients", "grads_in_partition", "grad_partitions_flat_buffer")
"""Where DeepSpeed's ZeRO optimizers keep this rank's gradient partitions (stages 1-2: lists per group and a
contiguous buffer; stage 3: one flat buffer), outside the parameters' `.grad`."""


def _tensors_in(value: Any) -> Iterable[torch.Tensor]:
    """The tensors in `value`, also inside nested dicts, lists and tuples."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            yield item
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def _optimizer_chain(optimizer: Any) -> list[Any]:
    """The optimizer and those it wraps: accelerate's AcceleratedOptimizer wraps the real one, or DeepSpeed's ZeRO
    optimizer, which wraps the torch optimizer over its flat partitions."""
    chain: list[Any] = []
    while optimizer is not None and len(chain) < 4 and all(optimizer is not seen for seen in chain):
        chain.append(optimizer)
        optimizer = getattr(optimizer, "optimizer", None)
    return chain


def deepspeed_master_weights(optimizer: Any) -> list[torch.Tensor]:
    """This rank's fp32 master-weight partitions when DeepSpeed ZeRO trains; empty otherwise."""
    tensors: list[torch.Tensor] = []
    for wrapped in _optimizer_chain(optimizer):
        for name in DEEPSPEED_MASTER_WEIGHTS:
            tensors.extend(item for item in getattr(wrapped, name, None) or [] if isinstance(item, torch.Tensor))
    return tensors


def deepspeed_gradients(optimizer: Any) -> list[torch.Tensor]:
    """This rank's gradient partitions when DeepSpeed ZeRO trains (with the fp32 master weights' `.grad`); empty
    otherwise."""
    tensors = [master.grad for master in deepspeed_master_weights(optimizer) if master.grad is not None]
    for wrapped in _optimizer_chain(optimizer):
        for name in DEEPSPEED_GRADIENTS:
            tensors.extend(_tensors_in(getattr(wrapped, name, None)))
    return tensors


def optimizer_state_tensors(optimizer: Any) -> Iterable[torch.Tensor]:
    """Every tensor held in the optimizer's state, also inside nested containers; with DeepSpeed ZeRO also its
    fp32 master weights."""
    if optimizer is None:
        return
    yield from deepspeed_master_weights(optimizer)
    states = [getattr(wrapped, "state", None) for wrapped in _optimizer_chain(optimizer)]
    yield from _tensors_in([dict(state) for state in states if isinstance(state, Mapping)])


class _NvmlReader:
    """NVML's view of the training GPU, read from inside the training process: device memory used (v2,
    the same reading as the parent's sampler) and this process's own use."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self._nvml = nvml
        self._handle = handle

    @classmethod
    def open(cls, device: torch.device) -> _NvmlReader | None:
        """The reader for `device`, found by UUID (so CUDA_VISIBLE_DEVICES does not matter); None where NVML
        is missing or does not know the device (then the steps carry no NVML reading)."""
        try:
            import pynvml

            pynvml.nvmlInit()
        except Exception:  # no driver library, or nvidia-ml-py missing: the parent says why
            return None
        try:
            uuid = str(torch.cuda.get_device_properties(device).uuid)
            prefix = "" if uuid.startswith(("GPU-", "MIG-")) else "GPU-"
            return cls(pynvml, pynvml.nvmlDeviceGetHandleByUUID(prefix + uuid))
        except Exception:
            pynvml.nvmlShutdown()
            return None

    def read(self) -> tuple[int | None, int | None]:
        """(device used, this process's used) in bytes; None for what NVML does not give."""
        memory = nvml_memory_info(self._nvml, self._handle)
        if memory is None:
            return None, None
        own = [process.usedGpuMemory for process in nvml_processes(self._nvml, self._handle)
               if process.pid == os.getpid()]
        return int(memory.used), (int(own[0]) if own and own[0] is not None else None)

    def close(self) -> None:
        with contextlib.suppress(self._nvml.NVMLError):
            self._nvml.nvmlShutdown()


def _versions() -> dict[str, str]:
    import transformers

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": transformers.__version__}
    if torch.version.cuda:
        versions["cuda"] = torch.version.cuda
    return versions


def _batch_tensors(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    values = [*args, *kwargs.values()]
    return [value for value in values if isinstance(value, torch.Tensor)]


def _training_config(args: Any, model: Any, device: torch.device, total_steps: int) -> dict[str, Any]:
    """The run's techniques in RunConfig's terms, so a watched run compares with launched ones."""
    model_config = getattr(model, "config", None)
    optim = getattr(args, "optim", None)
    return {
        "model": getattr(model_config, "_name_or_path", None) or type(model).__name__,
        "device": device.type,
        "batch_size": getattr(args, "per_device_train_batch_size", None),
        "grad_accum": getattr(args, "gradient_accumulation_steps", None),
        "grad_checkpointing": bool(getattr(args, "activation_checkpointing", False)
                                   or getattr(args, "gradient_checkpointing", False)),
        "precision": "bf16" if getattr(args, "bf16", False) else "fp16" if getattr(args, "fp16", False) else "fp32",
        "tf32": bool(getattr(args, "tf32", False)),
        "optim": getattr(optim, "value", optim),
        "workers": getattr(args, "dataloader_num_workers", None),
        "pin_memory": getattr(args, "dataloader_pin_memory", None),
        "attn": getattr(model_config, "_attn_implementation", None),
        "compile": bool(getattr(args, "torch_compile", False)),
        "max_steps": total_steps,
    }


class StepPhases:
    """Times each step's phases on the host (`STEP_PHASES`) with `perf_counter` stamps at the callbacks and forward
    hooks, and asks a CUDA event recorded at the previous step's end, without waiting, whether the GPU had caught up
    when the step's first forward began. No synchronisation: the host's time is where it waited."""

    def __init__(self, cuda: bool) -> None:
        self._cuda = cuda
        self._mark_s = time.perf_counter()
        self._phase = "data"
        self._phases_s = dict.fromkeys(STEP_PHASES, 0.0)
        self._caught_up: bool | None = None
        self._forward_seen = False
        self._step_end_event: Any = None

    def _enter(self, phase: str) -> None:
        now_s = time.perf_counter()
        self._phases_s[self._phase] += now_s - self._mark_s
        self._mark_s, self._phase = now_s, phase

    def step_begins(self) -> None:
        """The Trainer has the step's batches: what follows is the step's work. Under torch.compile the forward hooks
        cannot time (a clock read breaks the graph), so "forward" then holds the forward and the backward."""
        if self._phase == "data":
            self._enter("forward")

    def forward_begins(self) -> None:
        if not self._forward_seen and self._step_end_event is not None:
            self._caught_up = bool(self._step_end_event.query())
        self._forward_seen = True
        self._enter("forward")

    def forward_ends(self) -> None:
        self._enter("backward")

    def optimizer_begins(self) -> None:
        self._enter("optimizer")

    def loss_read(self) -> None:
        """The Trainer read the loss to log it, after the step's end: the wait for the GPU (the next step's)."""
        if self._phase == "data":
            self._enter("gpu wait")
            self._enter("data")

    def step_ends(self) -> tuple[dict[str, float], bool | None]:
        """This step's phases and whether the GPU had caught up; the next step's data wait begins."""
        self._enter("data")
        phases, caught_up = self._phases_s, self._caught_up
        self._phases_s, self._caught_up, self._forward_seen = dict.fromkeys(STEP_PHASES, 0.0), None, False
        if self._cuda:
            self._step_end_event = torch.cuda.Event()
            self._step_end_event.record()
        return phases, caught_up


class AnatomyCallback(TrainerCallback):
    """Measures weights, gradients, optimizer state, activations and throughput of a Trainer run.

    `emit` receives each event. Without it, events go to gpuanat when gpuanat launched the script
    (`gpuanat run --script`), else to this user's private publication file for `gpuanat watch PID`
    (unless `publish=False`); either way the latest are also kept on the callback (`last_step`,
    `last_bands`, `summary`). The probe never raises into training: a parent that went away ends the
    run gracefully, and any other failure turns the probe off with one warning.
    """

    def __init__(self, emit: Callable[[Event], None] | None = None, *, exact_every_steps: int = 50,
                 publish: bool = True) -> None:
        self._lifecycle = emit is None
        """Whether this callback sends hello and done itself (gpuanat's worker sends them otherwise)."""
        if emit is None:
            emit = _installed_emit or (_publish if publish else (lambda event: None))
        self._emit = emit
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
        self._saved_hooks_active = False
        self._nvml: _NvmlReader | None = None

    def _disable(self, reason: str) -> None:
        self.disabled_reason = reason
        if self._saved_hooks_active:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks_active = False
        for hook in getattr(self, "_hooks", []):
            hook.remove()
        _warn(f"the AnatomyCallback probe turned itself off after an error (training goes on): {reason}")

    # --- setup -----------------------------------------------------------------------------
    @_never_raises
    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):  # type: ignore[override]
        self._model = model
        self._optimizer = optimizer
        self._measure_gradients_before_deepspeed_steps()
        first_parameter = next(model.parameters())
        self._device = first_parameter.device
        self._cuda = self._device.type == "cuda"
        self._compiled = bool(getattr(args, "torch_compile", False))
        parameters = list(model.parameters())
        self._parameter_storage_keys = _storage_keys(parameters)
        self._weights_bytes = unique_storage_bytes([*parameters, *model.buffers(),
                                                    *quantization_state_tensors(parameters)])
        unique_params = {id(p): p for p in parameters}.values()
        total_steps = int(state.max_steps or 0)
        # Warm-up: the first tenth of the run, at least 2 and at most 20 optimizer steps.
        self.warmup_steps = min(20, max(2, math.ceil(total_steps / 10)))
        if self._lifecycle:
            self._emit_safely(Hello(
                pid=os.getpid(), versions=_versions(), device=self._device.type,
                device_name=(torch.cuda.get_device_name(self._device) if self._cuda
                             else platform.processor() or None),
                config=_training_config(args, model, self._device, total_steps),
            ))
        self._emit_safely(ModelInfo(
            params=sum(parameter_elements(p) for p in unique_params),
            trainable_params=sum(parameter_elements(p) for p in unique_params if p.requires_grad),
            weights_bytes=self._weights_bytes,
            dtype=str(first_parameter.dtype).removeprefix("torch."),
            total_steps=total_steps,
        ))
        self._samples = 0
        self._tokens = 0
        self._loss: float | None = None
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
            self._nvml = _NvmlReader.open(self._device)
            self._nvml_read_at_reserved_bytes: int | None = None
            # What is allocated before the first step beyond weights, gradients and optimizer state: the buffers a
            # distributed wrapper keeps for the whole run (DDP's gradient buckets, DeepSpeed's flat buffers).
            allocated_now = allocator_bytes(self._device)[0]
            self._buffers_at_start_bytes = max(0, allocated_now - self._weights_bytes - self._gradients_bytes_now()
                                               - self._optimizer_state_bytes_now())
        before_forward, after_forward = self._before_forward, self._after_forward
        if self._compiled:
            # Traced by Dynamo, the hooks would put the probe into the compiled graph: a guard on its counters
            # (a recompilation at every step until Dynamo gives up) and graph breaks at its clock reads. Disabled,
            # they run eagerly just outside the graph, and Dynamo counts no break for them.
            before_forward = torch.compiler.disable(before_forward)
            after_forward = torch.compiler.disable(after_forward)
        self._hooks = [
            model.register_forward_pre_hook(before_forward, with_kwargs=True),
            model.register_forward_hook(after_forward, with_kwargs=True),
        ]
        self._train_start_s = time.perf_counter()
        self._last_step_end_s = self._train_start_s
        self._step_phases = StepPhases(self._cuda)
        self._steady_phases_s = dict.fromkeys(STEP_PHASES, 0.0)
        self._steady_steps = 0
        self._steady_caught_up_steps = 0
        return control

    # --- forward hooks -----------------------------------------------------------------------
    @_never_raises
    def _before_forward(self, module, args, kwargs):  # type: ignore[no-untyped-def]
        if not module.training:
            return None
        if not torch.compiler.is_compiling():  # a clock read would break torch.compile's graph
            self._step_phases.forward_begins()
        batch = _batch_tensors(args, kwargs)
        if batch:
            self._samples += int(batch[0].shape[0]) if batch[0].dim() else 1
            self._tokens += int(batch[0].numel())
        if self._measuring:
            self._batch_bytes = unique_storage_bytes(batch)
            if self._cuda:
                # The forward pass's own peak: keep the step's peak so far, then restart the counter.
                self._step_peak_floor_bytes = max(self._step_peak_floor_bytes, allocator_bytes(self._device)[1])
                torch.cuda.reset_peak_memory_stats(self._device)
            if not self._cuda and not self._compiled:
                self._saved_storages: dict[tuple[str, int], int] = {}
                self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack_saved, lambda t: t)
                self._saved_hooks.__enter__()
                self._saved_hooks_active = True
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

    @_never_raises
    def _after_forward(self, module, args, kwargs, output):  # type: ignore[no-untyped-def]
        if module.training and not torch.compiler.is_compiling():
            self._step_phases.forward_ends()
        if not (module.training and self._measuring):
            return None
        gradients_now = self._gradients_bytes_now()
        optimizer_state_now = self._optimizer_state_bytes_now()
        self._gradients_at_forward_end_bytes = max(self._gradients_at_forward_end_bytes, gradients_now)
        self._optimizer_at_forward_end_bytes = max(self._optimizer_at_forward_end_bytes, optimizer_state_now)
        if self._cuda:
            allocated, forward_peak, _ = allocator_bytes(self._device)
            self._forward_peak_bytes = max(self._forward_peak_bytes or 0, forward_peak)
            live_bytes = (self._weights_bytes + gradients_now + optimizer_state_now + self._batch_bytes
                          + (self._buffers_at_start_bytes or 0))
            activations = allocated - live_bytes
        elif not self._compiled:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks_active = False
            batch_keys = {
                (str(t.untyped_storage().device), t.untyped_storage().data_ptr())
                for t in _batch_tensors(args, kwargs)
            }
            activations = sum(size for key, size in self._saved_storages.items() if key not in batch_keys)
        else:
            activations = None
        if activations is not None:
            self._activations_bytes = max(self._activations_bytes or 0, activations)
        logits = getattr(output, "logits", None)
        if isinstance(logits, torch.Tensor):
            self._logits_bytes = max(self._logits_bytes or 0, unique_storage_bytes([logits]))
        elif hasattr(output, "logits"):  # a model that has logits and returned none (Liger's fused loss): 0 bytes
            self._logits_bytes = self._logits_bytes or 0
        return None

    def _measure_gradients_before_deepspeed_steps(self) -> None:
        """DeepSpeed's engine steps inside accelerate's backward, before Trainer's `on_pre_optimizer_step`, and
        ZeRO-1/2 free their gradient partitions in that step: the probe reads them as the ZeRO optimizer's `step`
        begins, by wrapping that one method of that one object (ZeRO-3's persistent flat buffer is read either way)."""
        for wrapped in _optimizer_chain(self._optimizer):
            if any(hasattr(wrapped, name) for name in DEEPSPEED_MASTER_WEIGHTS) and callable(getattr(wrapped, "step",
                                                                                                     None)):
                wrapped.step = self._reading_gradients_first(wrapped.step)
                return

    def _reading_gradients_first(self, step: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(step)
        def step_measured(*args: Any, **kwargs: Any) -> Any:
            self._read_gradients_before_step()
            return step(*args, **kwargs)

        return step_measured

    @_never_raises
    def _read_gradients_before_step(self) -> None:
        if self._measuring:
            self._gradients_bytes = max(self._gradients_bytes, self._gradients_bytes_now())

    def _gradients_bytes_now(self) -> int:
        """Gradients on this rank: of the parameters, and with DeepSpeed ZeRO of its fp32 partitions."""
        gradients = [p.grad for p in self._model.parameters()]
        gradients.extend(deepspeed_gradients(self._optimizer))
        return unique_storage_bytes(gradients, self._device)

    def _optimizer_state_bytes_now(self) -> int:
        return unique_storage_bytes(optimizer_state_tensors(self._optimizer), self._device)

    # --- step callbacks ----------------------------------------------------------------------
    @_never_raises
    def on_step_begin(self, args, state, control, **kwargs):  # type: ignore[override]
        self._step_phases.step_begins()
        step = state.global_step + 1
        self._measuring = step <= FIRST_MEASURED_STEPS or step % self.exact_every_steps == 0
        if self._measuring:
            self._activations_bytes: int | None = None
            self._gradients_bytes = 0
            self._gradients_at_forward_end_bytes = 0
            self._optimizer_at_forward_end_bytes = 0
            self._forward_peak_bytes: int | None = None
            self._logits_bytes: int | None = None
            self._batch_bytes = 0
        self._step_peak_floor_bytes = 0
        if self._cuda:
            torch.cuda.reset_peak_memory_stats(self._device)
        return control

    @_never_raises
    def on_pre_optimizer_step(self, args, state, control, **kwargs):  # type: ignore[override]
        self._step_phases.optimizer_begins()
        if self._measuring:
            self._gradients_bytes = max(self._gradients_bytes, self._gradients_bytes_now())
        return control

    @_never_raises
    def on_log(self, args, state, control, logs=None, **kwargs):  # type: ignore[override]
        self._step_phases.loss_read()
        if logs:
            if "loss" in logs:
                self._loss = float(logs["loss"])
            for key in ("train_runtime", "train_samples_per_second", "train_loss"):
                if key in logs:
                    self.summary[key] = logs[key]
        return control

    @_never_raises
    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[override]
        step = state.global_step
        phases, caught_up = self._step_phases.step_ends()
        if self.warmup_steps < step:  # the steady window's steps, as the steady samples/s counts them
            self._steady_steps += 1
            self._steady_caught_up_steps += bool(caught_up)
            for phase, seconds in phases.items():
                self._steady_phases_s[phase] += seconds
        boundary = step == self.warmup_steps or step == state.max_steps
        if boundary and self._cuda:
            self._synchronize()
        now_s = time.perf_counter()
        if step == self.warmup_steps:
            self._steady_start = (now_s, self._samples)
        elif step == state.max_steps and self._steady_start is not None:
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
                optimizer_state_at_forward_end_bytes=self._optimizer_at_forward_end_bytes,
                forward_peak_allocated_bytes=self._forward_peak_bytes,
                buffers_at_start_bytes=self._buffers_at_start_bytes,
                logits_bytes=self._logits_bytes,
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
            nvml_device_used_bytes=nvml_device_used,
            nvml_process_used_bytes=nvml_process_used,
            phases_s={phase: round(seconds, 6) for phase, seconds in phases.items()},
            gpu_caught_up=caught_up,
        )
        self._last_step_end_s = now_s
        self._emit_safely(self.last_step)
        if self._parent_gone:
            control.should_training_stop = True
        return control

    @_never_raises
    def on_train_end(self, args, state, control, **kwargs):  # type: ignore[override]
        for hook in self._hooks:
            hook.remove()
        if self._steady_start is not None and self._steady_end is None:
            if self._cuda:
                self._synchronize()
            self._steady_end = (time.perf_counter(), self._samples)
        self.summary.update(self.steady_state())
        if self._lifecycle:
            self._emit_safely(Done(
                status="ok", steps=state.global_step, samples=self._samples,
                train_runtime_s=self.summary.get("train_runtime"),
                samples_per_second=self.summary.get("train_samples_per_second"),
                steady_samples_per_second=self.summary["steady_samples_per_second"],
                warmup_steps=self.summary["warmup_steps"], steady_reason=self.summary["steady_reason"],
                train_loss=self.summary.get("train_loss"), peak_allocated_bytes=self.peak_allocated_bytes,
                peak_reserved_bytes=self.peak_reserved_bytes, bands=self.last_bands,
                probe_time_s=self.probe_time_s, probe_time_by_part_s=dict(self.probe_time_by_part_s),
                **self.steady_phases(),
            ))
        if self._nvml is not None:
            self._nvml.close()
            self._nvml = None
        return control

    def _synchronize(self) -> None:
        started_s = time.perf_counter()
        torch.cuda.synchronize(self._device)
        self.probe_time_by_part_s["synchronize"] += time.perf_counter() - started_s

    # --- results -----------------------------------------------------------------------------
    def steady_state(self) -> dict[str, Any]:
        """Samples/s after warm-up, or None with the reason."""
        result: dict[str, Any] = {"warmup_steps": getattr(self, "warmup_steps", 0),
                                  "steady_samples_per_second": None, "steady_reason": None}
        start, end = getattr(self, "_steady_start", None), getattr(self, "_steady_end", None)
        if start is None or end is None or end[1] <= start[1] or end[0] <= start[0]:
            result["steady_reason"] = (f"too few steps: the first {result['warmup_steps']} are warm-up "
                                       "and at least one more is needed")
        else:
            result["steady_samples_per_second"] = (end[1] - start[1]) / (end[0] - start[0])
        return result

    def steady_phases(self) -> dict[str, Any]:
        """The steady steps' phases summed, their count and how many found the GPU caught up (`Done`'s fields)."""
        steps = getattr(self, "_steady_steps", 0)
        if not steps:
            return {"steady_phases_s": None, "steady_steps": 0, "steady_gpu_caught_up_steps": None}
        return {"steady_phases_s": dict(self._steady_phases_s), "steady_steps": steps,
                "steady_gpu_caught_up_steps": self._steady_caught_up_steps if self._cuda else None}

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
        return max(self._peak_allocated_bytes or 0, self._step_peak_floor_bytes,
                   torch.cuda.max_memory_allocated(self._device))

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
