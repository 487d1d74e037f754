"""The optimizer's state on the GPU, tensor by tensor, exact from the parameters' shapes (no torch).

AdamW 8 B/param (+ a 4-byte step per tensor when fused), bitsandbytes
8-bit Adam 2 B/param in 256-element blocks with a 4-byte scale per block and moment, 32-bit state for
tensors under 4096 elements and for the embeddings (the Trainer registers them with bitsandbytes'
manager), Adafactor row + column factors (full second moment for vectors) and a step per tensor, SGD 0.
Also what the step allocates and frees again, and the moments that land in the allocator's large pool, where near
the memory limit they fragment it (`predict`'s fragmentation).
"""

from __future__ import annotations

from typing import NamedTuple

from gpuanat.core.memory.bands.precision import parameter_element_bytes
from gpuanat.core.memory.shapes import ParameterShapes
from gpuanat.core.vocabulary.config import RunConfig

BNB_MIN_8BIT_ELEMENTS = 4096
BNB_BLOCK_ELEMENTS = 256
BNB_QUANTILE_MAPS_BYTES = 2 * 256 * 4
"""Two 256-entry fp32 quantization maps (one per moment)."""


class StateTensor(NamedTuple):
    bytes: int
    moment: bool
    """An fp32 tensor shaped like its parameter (Adam's moments, Adafactor's second moment of a vector)."""


def optimizer_state_tensors(config: RunConfig, shapes: ParameterShapes) -> list[StateTensor]:
    """Every tensor of optimizer state on the GPU once the first step has run."""
    sizes = [rows * cols for rows, cols in shapes.matrices] + list(shapes.vectors)
    element = 4 if config.lora else parameter_element_bytes(config)  # LoRA's adapters are fp32; else as the model
    if config.optim in ("adamw_torch", "adamw_torch_fused"):
        steps = [StateTensor(4, False)] * shapes.tensors if config.optim == "adamw_torch_fused" else []  # else on CPU
        return [StateTensor(element * size, True) for size in sizes for _moment in range(2)] + steps
    if config.optim == "adamw_bnb_8bit":
        tensors = [StateTensor(BNB_QUANTILE_MAPS_BYTES, False)]
        for index, size in enumerate(sizes):
            if index < shapes.embedding_tensors or size < BNB_MIN_8BIT_ELEMENTS:
                tensors += [StateTensor(4 * size, True)] * 2
            else:
                absmax = StateTensor(4 * -(-size // BNB_BLOCK_ELEMENTS), False)
                tensors += [StateTensor(size, False), StateTensor(size, False), absmax, absmax]
        return tensors
    if config.optim == "adafactor":
        factors = [StateTensor(element * length, False) for shape in shapes.matrices for length in shape]
        return (
            factors
            + [StateTensor(element * size, True) for size in shapes.vectors]
            + [StateTensor(4, False)] * shapes.tensors
        )
    return []


def optimizer_state_bytes(config: RunConfig, shapes: ParameterShapes) -> int:
    return sum(tensor.bytes for tensor in optimizer_state_tensors(config, shapes))


def optimizer_step_temporaries_bytes(config: RunConfig, shapes: ParameterShapes) -> int:
    """torch's AdamW without `fused` (`adamw_torch`) runs its foreach implementation, which holds the square
    root of the second moment for every parameter of a group at once: 4 B per parameter of the Trainer's
    weight-decay group (every matrix; biases and LayerNorm weights are the other). Fused AdamW works in place,
    and the transients of the other optimizers are not modelled."""
    if config.optim != "adamw_torch":
        return 0
    return 4 * sum(rows * cols for rows, cols in shapes.matrices)


ALLOCATOR_SMALL_BLOCK_BYTES = 1 << 20
"""torch's caching allocator serves requests up to 1 MiB from its small pool of 2 MiB segments, larger ones
from the large pool, where blocks are split off the segments that backward freed."""


def step_counter_bytes(config: RunConfig, shapes: ParameterShapes) -> int:
    """Fused AdamW's step counters: a 4-byte tensor a parameter, on the GPU (the unfused one keeps them on the CPU).
    FSDP2 leaves each rank a shard of every parameter, so every rank holds every counter."""
    return 4 * shapes.tensors if config.optim == "adamw_torch_fused" else 0


def large_moment_bytes(config: RunConfig, shapes: ParameterShapes) -> int:
    """Optimizer moments (`StateTensor.moment`) that the allocator places in its large pool."""
    return sum(
        tensor.bytes
        for tensor in optimizer_state_tensors(config, shapes)
        if tensor.moment and tensor.bytes > ALLOCATOR_SMALL_BLOCK_BYTES
    )
