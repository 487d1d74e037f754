"""Achieved TFLOP/s and MFU: the model's FLOPs per sample, from its shape, over the measured rate, against the
GPU's dense peak.

Model FLOPs, as MFU counts them (PaLM, appendix B): each weight of a matmul costs 2 FLOPs a token forward and 4
backward (the input's gradient and the weight's), so 6 a token in training — 4 for a frozen weight (LoRA's and
QLoRA's base: its input's gradient only) — plus attention's two matmuls, QKᵀ and AV: 2 × 2 × seq × heads × head_dim a
token and layer forward, 3 times that in training. Embedding lookups are no matmuls; a classifier's pooler and head
act on one token a sample and are left out; a tied LM head is the embedding matrix used as a matmul. Recomputation
under checkpointing is not counted (that is the hardware's FLOPs, not the model's).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from gpuanat.core.memory.shapes import lora_shapes, parameter_shapes
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.presets import PRESETS
from gpuanat.core.vocabulary.protocol import ModelInfo

DENSE_PEAK_TFLOPS: tuple[tuple[str, dict[str, float]], ...] = (
    # NVIDIA's datasheets, dense (the sparsity figures halved): 16-bit tensor cores, TF32 tensor cores, FP32.
    ("H200", {"16-bit": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("GH200", {"16-bit": 989.4, "tf32": 494.7, "fp32": 66.9}),
    ("H100 PCIe", {"16-bit": 756.5, "tf32": 378.0, "fp32": 51.2}),
    ("H100 NVL", {"16-bit": 835.5, "tf32": 417.5, "fp32": 60.0}),
    ("H100", {"16-bit": 989.4, "tf32": 494.7, "fp32": 66.9}),  # SXM: "NVIDIA H100 80GB HBM3"
    ("A100", {"16-bit": 312.0, "tf32": 156.0, "fp32": 19.5}),
    ("L40S", {"16-bit": 362.1, "tf32": 183.2, "fp32": 91.6}),
    ("NVIDIA L4", {"16-bit": 121.0, "tf32": 60.0, "fp32": 30.3}),
)
"""(a substring of the NVML name, dense TFLOP/s by math mode); the first match wins, so the specific names first."""


@functools.lru_cache(maxsize=256)
def flops_per_sample(config: RunConfig) -> int | None:
    """Model FLOPs of training one sample (forward and backward); None for a --model checkpoint or a script.
    Remembered per configuration: the dashboard asks at every step of a run."""
    if config.model is not None or config.preset not in PRESETS:
        return None
    preset = PRESETS[config.preset]
    shapes = parameter_shapes(preset)
    matmul = sum(rows * cols for rows, cols in shapes.matrices[shapes.embedding_tensors :])
    if preset.objective == "causal-lm":
        if preset.tie_word_embeddings:
            matmul += preset.vocab_size * preset.hidden_size
    else:  # the pooler and the 2-label head act on one token a sample
        matmul -= (
            preset.hidden_size * preset.hidden_size + 2 * preset.hidden_size
            if preset.family == "bert"
            else 2 * preset.hidden_size
        )
    attention = preset.num_layers * 2 * 2 * config.seq_len * preset.num_heads * preset.head_dim
    if config.lora:  # the frozen base: forward and the input's gradient; the adapters train
        adapters = lora_shapes(preset, config).params
        per_token = 4 * matmul + 6 * adapters + 3 * attention
    else:
        per_token = 6 * matmul + 3 * attention
    return per_token * config.seq_len


def flops_per_sample_of_model(model: ModelInfo | None, seq_len: int | None) -> int | None:
    """Model FLOPs of training one sample of `seq_len` tokens, from what the probe counted in the model itself
    (any model: a --model config or checkpoint, a script's); None where it counted nothing."""
    if model is None or model.matmul_flops_per_token is None or model.attention_width is None or not seq_len:
        return None
    positions = seq_len * model.attention_width + sum(
        min(seq_len, int(window)) * width for window, width in (model.windowed_attention_width or {}).items()
    )
    return (model.matmul_flops_per_token + 3 * 2 * 2 * positions) * seq_len


def math_mode(config: RunConfig) -> str:
    """Which of the GPU's peaks the run's matmuls can reach: 16-bit tensor cores, TF32, or plain FP32."""
    if config.precision in ("fp16", "bf16") or config.load_in_4bit:
        return "16-bit"
    return "tf32" if config.tf32 else "fp32"


def dense_peak_tflops(gpu_name: str | None, mode: str) -> float | None:
    """The GPU's dense peak for `mode`; None for a GPU not in the table (or no GPU)."""
    if not gpu_name:
        return None
    for fragment, peaks in DENSE_PEAK_TFLOPS:
        if fragment.lower() in gpu_name.lower():
            return peaks[mode]
    return None


@dataclass(frozen=True)
class Utilization:
    flops_per_sample: int | None
    achieved_tflops: float | None
    peak_tflops: float | None
    """The dense peak of all the run's GPUs together, in the run's math mode."""
    mfu: float | None
    """Achieved over peak, 0-1."""
    reason: str | None
    """Why the MFU is missing, where it is."""


def utilization(
    config: RunConfig,
    samples_per_second: float | None,
    gpu_name: str | None,
    gpu_count: int,
    model: ModelInfo | None = None,
    seq_len: int | None = None,
    no_rate_reason: str | None = None,
) -> Utilization:
    """The run's achieved TFLOP/s (every rank's samples) and MFU against the peak of its `gpu_count` GPUs. A preset's
    FLOPs come from its shape; any other model's from what the probe counted in it (`model`), at `seq_len` tokens a
    sample (the config's by default). `no_rate_reason`: why there is no rate, where there is none."""
    flops = flops_per_sample(config) or flops_per_sample_of_model(model, seq_len or config.seq_len)
    if flops is None:
        return Utilization(
            None,
            None,
            None,
            None,
            "the model's FLOPs are not known: its probe has not reported its shape"
            if model is None
            else "the model's FLOPs could not be counted from its layers and config",
        )
    if samples_per_second is None:
        return Utilization(flops, None, None, None, no_rate_reason or "no samples/s measured")
    achieved = flops * samples_per_second / 1e12
    if config.device != "cuda":
        return Utilization(flops, achieved, None, None, "no peak known for a CPU")
    mode = math_mode(config)
    peak = dense_peak_tflops(gpu_name, mode)
    if peak is None:
        return Utilization(flops, achieved, None, None, f"no dense peak known for {gpu_name or 'this GPU'}")
    total_peak = peak * max(1, gpu_count)
    return Utilization(flops, achieved, total_peak, achieved / total_peak, None)
