"""Memory prediction before a run, from the model's shape and the techniques alone (no torch).

A first model, good to within tens of percent on the docs' table; issue #4 turns it into a measured
and verified one. What it uses:
- parameters counted from the preset's shape (checked against the real models in the tests);
- fp32 weights and gradients, 4 B/param each (torch AMP keeps fp32 weights);
- optimizer state: AdamW 8 B/param (+ a 4-byte step per tensor when fused, on the device), 8-bit Adam
  ≈ 2 B/param with the Trainer keeping embeddings in 32-bit, Adafactor row + column factors (full second moment
  for vectors) and a step per tensor, SGD 0;
- activations per layer s·b·h·(34 + 5·a·s/h) bytes in 16-bit (Korthikanti et al. 2022), without the
  s² term for SDPA; twice that in fp32; AMP adds 16-bit copies of the matmul weights; gradient
  checkpointing keeps each layer's input plus one layer's activations.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuanat.core.config import RunConfig
from gpuanat.core.presets import PRESETS, ModelPreset

MIB = 1024**2
NUM_LABELS = 2
CUDA_CONTEXT_BYTES = 760 * MIB
"""Per-process CUDA context, kernels and library workspaces: 742-758 MiB on the H100 with torch 2.11 and
CUDA 13 (benchmarks/results/h100/sweep.json)."""
ALLOCATOR_CACHE_FACTOR = 1.10
"""Reserved / peak allocated memory of torch's caching allocator: 1.02-1.19 across the H100 sweep."""
MAX_BATCH_SEARCHED = 1 << 16


@dataclass(frozen=True)
class ParameterShapes:
    params: int
    tensors: int
    matrices: tuple[tuple[int, int], ...]
    """Every 2-D parameter's shape."""
    vectors: tuple[int, ...]
    """Every 1-D parameter's length."""
    embedding_params: int
    buffer_bytes: int


def parameter_shapes(preset: ModelPreset) -> ParameterShapes:
    """The parameter tensors of the preset's sequence-classification model."""
    h, i, v, p = preset.hidden_size, preset.intermediate_size, preset.vocab_size, preset.max_positions
    matrices: list[tuple[int, int]] = []
    vectors: list[int] = []
    if preset.family == "bert":
        embeddings = [(v, h), (p, h), (2, h)]
        matrices += embeddings
        vectors += [h, h]  # embedding LayerNorm
        for _ in range(preset.num_layers):
            matrices += [(h, h)] * 4 + [(i, h), (h, i)]
            vectors += [h] * 4 + [i, h] + [h, h] * 2
        matrices += [(h, h), (NUM_LABELS, h)]  # pooler, classifier
        vectors += [h, NUM_LABELS]
        buffer_bytes = 2 * p * 8  # position_ids and token_type_ids: int64 buffers of max_positions entries
    else:
        embeddings = [(v, h), (p, h)]
        matrices += embeddings
        for _ in range(preset.num_layers):
            matrices += [(h, 3 * h), (h, h), (h, i), (i, h)]
            vectors += [h, h, 3 * h, h, h, h, i, h]
        vectors += [h, h]  # final LayerNorm
        matrices += [(NUM_LABELS, h)]  # score head, no bias
        buffer_bytes = 0
    params = sum(rows * cols for rows, cols in matrices) + sum(vectors)
    return ParameterShapes(params=params, tensors=len(matrices) + len(vectors), matrices=tuple(matrices),
                           vectors=tuple(vectors), embedding_params=sum(r * c for r, c in embeddings),
                           buffer_bytes=buffer_bytes)


@dataclass(frozen=True)
class MemoryEstimate:
    weights_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    gradients_at_peak_bytes: int
    """Gradients alive at the end of forward: all of them when accumulating, else none."""
    peak_allocated_bytes: int
    """Weights + optimizer state + activations + gradients alive at the end of forward."""


def optimizer_state_bytes(config: RunConfig, shapes: ParameterShapes) -> int:
    if config.optim in ("adamw_torch", "adamw_torch_fused"):
        steps = 4 * shapes.tensors if config.optim == "adamw_torch_fused" else 0
        return 8 * shapes.params + steps
    if config.optim == "adamw_bnb_8bit":
        return 8 * shapes.embedding_params + 2 * (shapes.params - shapes.embedding_params)
    if config.optim == "adafactor":
        factors = sum(rows + cols for rows, cols in shapes.matrices) + sum(shapes.vectors)
        return 4 * (factors + shapes.tensors)
    return 0


def activations_bytes(config: RunConfig, preset: ModelPreset, shapes: ParameterShapes) -> int:
    s, b, h, a = config.seq_len, config.batch_size, preset.hidden_size, preset.num_heads
    attention_scores = 5 * a * s / h if config.attn == "eager" else 0
    per_layer_16bit = s * b * h * (34 + attention_scores)
    bytes_per_unit = 1.0 if config.precision in ("fp16", "bf16") else 2.0
    per_layer = per_layer_16bit * bytes_per_unit
    if config.grad_checkpointing:
        layer_inputs = preset.num_layers * s * b * h * 4
        total = layer_inputs + per_layer
    else:
        total = preset.num_layers * per_layer
    if config.precision in ("fp16", "bf16"):
        matmul_params = sum(rows * cols for rows, cols in shapes.matrices) - shapes.embedding_params
        total += 2 * matmul_params
    return int(total)


def estimate_memory(config: RunConfig) -> MemoryEstimate:
    preset = PRESETS[config.preset]
    shapes = parameter_shapes(preset)
    weights = 4 * shapes.params + shapes.buffer_bytes
    gradients = 4 * shapes.params
    optimizer = optimizer_state_bytes(config, shapes)
    activations = activations_bytes(config, preset, shapes)
    gradients_at_peak = gradients if config.grad_accum > 1 else 0
    return MemoryEstimate(
        weights_bytes=weights, gradients_bytes=gradients, optimizer_state_bytes=optimizer,
        activations_bytes=activations, gradients_at_peak_bytes=gradients_at_peak,
        peak_allocated_bytes=weights + optimizer + activations + gradients_at_peak,
    )


SIZE_UNITS = {"": 1, "b": 1, "kib": 1024, "mib": MIB, "gib": 1024**3, "tib": 1024**4, "k": 1024, "m": MIB,
              "g": 1024**3, "t": 1024**4, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}


def parse_size(text: str) -> int:
    """Bytes from '80GiB', '80G' (binary), '80GB' (decimal), '81559MiB' or a plain number of bytes."""
    stripped = text.strip().replace(" ", "").lower()
    number = stripped.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = stripped[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in SIZE_UNITS or value <= 0:
        raise ValueError(f"not a memory size: {text!r} (write e.g. 80GiB, 24G, 40GB or 81559MiB)")
    return int(value * SIZE_UNITS[unit])


def prediction_json(config: RunConfig) -> dict[str, int] | None:
    """The estimate as stored with a run and printed by `gpuanat predict`; None for a --model checkpoint,
    whose shape this model does not read yet."""
    if config.model is not None:
        return None
    estimate = estimate_memory(config)
    return {
        "weights_bytes": estimate.weights_bytes,
        "gradients_bytes": estimate.gradients_bytes,
        "optimizer_state_bytes": estimate.optimizer_state_bytes,
        "activations_bytes": estimate.activations_bytes,
        "gradients_at_forward_end_bytes": estimate.gradients_at_peak_bytes,
        "peak_allocated_bytes": estimate.peak_allocated_bytes,
        "cuda_context_bytes": CUDA_CONTEXT_BYTES,
        "peak_device_bytes": peak_device_bytes(estimate),
    }


def peak_device_bytes(estimate: MemoryEstimate) -> int:
    """Device memory the run will hold at its peak: allocator reservation plus the CUDA context."""
    return int(estimate.peak_allocated_bytes * ALLOCATOR_CACHE_FACTOR) + CUDA_CONTEXT_BYTES


def max_batch_size(config: RunConfig, gpu_memory_bytes: int) -> int:
    """The largest per-device batch whose predicted device peak fits `gpu_memory_bytes` (0: none fits)."""

    def fits(batch_size: int) -> bool:
        return peak_device_bytes(estimate_memory(config.replace(batch_size=batch_size))) <= gpu_memory_bytes

    if not fits(1):
        return 0
    low, high = 1, 2
    while high <= MAX_BATCH_SEARCHED and fits(high):
        low, high = high, high * 2
    if high > MAX_BATCH_SEARCHED:
        return low
    while high - low > 1:  # fits(low), not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
