"""What the bands are made of, measured on this rank's tensors (torch only, no training framework): the distinct
storages behind weights, gradients and optimizer state, counted once and by their shard on this rank (FSDP2's
DTensors, DeepSpeed ZeRO's partitions and flat buffers, bitsandbytes' 4-bit quantization state), and the optimizer
chain that accelerate and DeepSpeed wrap around the real optimizer.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch


def local_shards(tensor: torch.Tensor) -> Iterable[torch.Tensor]:
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
        for shard in local_shards(tensor):
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


DEEPSPEED_MASTER_WEIGHTS = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")
"""Where DeepSpeed's ZeRO optimizers keep this rank's fp32 master weights (stages 1-2, stage 3): optimizer state
in ZeRO's accounting (12 bytes a parameter with Adam: master weights, momentum, variance), outside `.state`."""

DEEPSPEED_GRADIENTS = ("averaged_gradients", "grads_in_partition", "grad_partitions_flat_buffer")
"""Where DeepSpeed's ZeRO optimizers keep this rank's gradient partitions (stages 1-2: lists per group and a
contiguous buffer; stage 3: one flat buffer), outside the parameters' `.grad`."""


def tensors_in(value: Any) -> Iterable[torch.Tensor]:
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


def optimizer_chain(optimizer: Any) -> list[Any]:
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
    for wrapped in optimizer_chain(optimizer):
        for name in DEEPSPEED_MASTER_WEIGHTS:
            tensors.extend(item for item in getattr(wrapped, name, None) or [] if isinstance(item, torch.Tensor))
    return tensors


def deepspeed_gradients(optimizer: Any) -> list[torch.Tensor]:
    """This rank's gradient partitions when DeepSpeed ZeRO trains (with the fp32 master weights' `.grad`); empty
    otherwise."""
    tensors = [master.grad for master in deepspeed_master_weights(optimizer) if master.grad is not None]
    for wrapped in optimizer_chain(optimizer):
        for name in DEEPSPEED_GRADIENTS:
            tensors.extend(tensors_in(getattr(wrapped, name, None)))
    return tensors


def optimizer_state_shape(optimizer: Any) -> tuple[int, ...]:
    """How many parameters have state and how many entries it has in all, for each optimizer of the chain, and how
    many master weights DeepSpeed keeps: what changes when state is created (one tensor at a time)."""
    shape = [len(deepspeed_master_weights(optimizer))]
    for wrapped in optimizer_chain(optimizer):
        state = getattr(wrapped, "state", None)
        if isinstance(state, Mapping):
            shape += [len(state), sum(len(values) for values in state.values() if isinstance(values, Mapping))]
    return tuple(shape)


def optimizer_state_tensors(optimizer: Any) -> Iterable[torch.Tensor]:
    """Every tensor held in the optimizer's state, also inside nested containers; with DeepSpeed ZeRO also its
    fp32 master weights."""
    if optimizer is None:
        return
    yield from deepspeed_master_weights(optimizer)
    states = [getattr(wrapped, "state", None) for wrapped in optimizer_chain(optimizer)]
    yield from tensors_in([dict(state) for state in states if isinstance(state, Mapping)])


def read_gradients_before_zero_steps(optimizer: Any, read: Callable[[], None]) -> None:
    """DeepSpeed's engine steps inside accelerate's backward, before Trainer's `on_pre_optimizer_step`, and ZeRO-1/2
    free their gradient partitions in that step: `read` is called as the ZeRO optimizer's `step` begins, by wrapping
    that one method of that one object (ZeRO-3's persistent flat buffer is read either way). Other optimizers are
    left as they are."""
    for wrapped in optimizer_chain(optimizer):
        step = getattr(wrapped, "step", None)
        if any(hasattr(wrapped, name) for name in DEEPSPEED_MASTER_WEIGHTS) and callable(step):

            @functools.wraps(step)
            def step_measured(*args: Any, _step: Callable[..., Any] = step, **kwargs: Any) -> Any:
                read()
                return _step(*args, **kwargs)

            wrapped.step = step_measured
            return
