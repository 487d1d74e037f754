"""What the run's precision decides in the bytes model: whether it is mixed (fp16, bf16), whether the model then
computes in 16 bits with no autocast (FSDP2, DeepSpeed), and the coefficients measured for each precision, with and
without checkpointing.

Measured on an H100 (benchmarks/results/h100/memory_matrix.json, torch 2.11, transformers 5.17) and
fitted on its batch-8 and batch-32 rows, batch 64 with checkpointing, and four largest-batch searches
(benchmarks/fit_memory_model.py), the rest held out:
bytes per token-hidden element stored for backward, per layer; with eager attention, bytes per
attention score; what checkpointing keeps; the backward pass's temporaries; the allocator's fragmentation near the
memory limit. The cuBLAS workspaces, fitted on the same rows, are `activations.CUBLAS_WORKSPACE_BYTES`.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuanat.core.vocabulary.config import RunConfig


@dataclass(frozen=True)
class PrecisionCoefficients:
    """Measured bytes per token-hidden element (s·h) per sample, unless said otherwise."""

    activations_per_layer: float
    """Stored for backward per transformer layer, SDPA attention."""
    eager_per_score: float
    """Eager attention also stores each of the a·s² attention probabilities: softmax output, dropout
    mask (1 B) and dropout output (fp32: 4 + 1 + 4; AMP: 4 + 1 + a 2-byte copy)."""
    checkpointed: float
    """With checkpointing, kept for the whole model: every layer's input (4 B) plus the embeddings'."""
    backward_temporaries: float
    """Peak minus what is alive at the end of forward (gradients of the widest intermediates)."""
    recompute_temporaries: float
    """With checkpointing, the peak above the kept inputs: one layer recomputed plus its gradients."""
    recompute_constant_bytes: float
    """With checkpointing, the part of that peak that does not grow with the batch, in bytes."""
    eager_recompute_per_score: float
    """With checkpointing and eager attention, one layer's attention probabilities and their gradients,
    per score."""
    cache_fraction: float
    """Allocator reservation above peak allocated at the largest batch that fits (fragmentation); with fp32
    and checkpointing, that of an optimizer without large moments (Adafactor)."""
    moment_fragmentation: float
    """With fp32 and checkpointing, reservation lost in addition per byte of `large_moment_bytes`: AdamW's
    moments are created at the first step in the segments backward freed, and the next steps' checkpointed
    inputs and recomputed layers no longer fit the pieces they leave (AdamW reserves 1.104 times its peak,
    Adafactor and SGD 1.058). Not resolved with mixed precision, where it is 0: there AdamW's largest batch
    reserves 1.026 times its peak, SGD's 1.023, and Adafactor runs out of memory at a lower peak than both."""


COEFFICIENTS: dict[tuple[bool, bool], PrecisionCoefficients] = {
    # (mixed precision, checkpointing): fitted by benchmarks/fit_memory_model.py, which fails if these differ.
    (False, False): PrecisionCoefficients(
        activations_per_layer=66.45,
        eager_per_score=8.99,
        checkpointed=0.0,
        backward_temporaries=24.23,
        recompute_temporaries=0.0,
        recompute_constant_bytes=0.0,
        eager_recompute_per_score=0.0,
        cache_fraction=0.0028,
        moment_fragmentation=0.0,
    ),
    (True, False): PrecisionCoefficients(
        activations_per_layer=42.29,
        eager_per_score=6.99,
        checkpointed=0.0,
        backward_temporaries=17.90,
        recompute_temporaries=0.0,
        recompute_constant_bytes=0.0,
        eager_recompute_per_score=0.0,
        cache_fraction=0.0028,
        moment_fragmentation=0.0,
    ),
    (False, True): PrecisionCoefficients(
        activations_per_layer=66.45,
        eager_per_score=8.99,
        checkpointed=105.03,
        backward_temporaries=0.0,
        recompute_temporaries=77.06,
        recompute_constant_bytes=20_992_008,
        eager_recompute_per_score=14.76,
        cache_fraction=0.0579,
        moment_fragmentation=1.315,
    ),
    (True, True): PrecisionCoefficients(
        activations_per_layer=42.29,
        eager_per_score=6.99,
        checkpointed=101.02,
        backward_temporaries=0.0,
        recompute_temporaries=55.87,
        recompute_constant_bytes=34_136_584,
        eager_recompute_per_score=16.96,
        cache_fraction=0.0262,
        moment_fragmentation=0.0,
    ),
}


def is_mixed(config: RunConfig) -> bool:
    return config.precision in ("fp16", "bf16")


def coefficients(config: RunConfig) -> PrecisionCoefficients:
    return COEFFICIENTS[(is_mixed(config), config.grad_checkpointing)]


def sharded_in_16_bit(config: RunConfig) -> bool:
    """Whether FSDP2 or DeepSpeed compute in 16 bits, with autocast off: FSDP2's mixed-precision policy casts the
    gathered parameters, DeepSpeed casts the model. Measured on 2 and 4 H200s (bert-large, bf16): the activations of
    FSDP and ZeRO-1/2 are 6.50 GiB where one GPU under autocast holds 8.00 (its weight copies left out)."""
    return is_mixed(config) and (config.distributed == "fsdp" or config.distributed.startswith("zero"))


def without_autocast_in_16_bit(config: RunConfig) -> bool:
    """Whether the model computes in 16 bits with autocast off, every activation 16-bit: sharded in 16 bits, or a
    bf16 model trained pure bf16 (`--no-autocast`), which keeps what FSDP2's and DeepSpeed's 16-bit compute keeps."""
    return sharded_in_16_bit(config) or (is_mixed(config) and not config.autocast)


def computes_in_16_bit(config: RunConfig) -> bool:
    """Whether the model computes with 16-bit weights, autocast casting none: sharded in 16 bits, or held in bf16
    (`--weights-dtype bf16`)."""
    return sharded_in_16_bit(config) or (is_mixed(config) and config.weights_dtype != "fp32")


def autocast_on(config: RunConfig) -> bool:
    """Whether autocast runs the forward pass: mixed precision, unless FSDP2 or DeepSpeed compute in 16 bits or the
    run is pure bf16 (HF Trainer runs it with bf16 weights too by default)."""
    return is_mixed(config) and not without_autocast_in_16_bit(config)


def parameter_element_bytes(config: RunConfig) -> int:
    """Bytes of a trained parameter (and of its gradient, and of an AdamW moment): 2 for a model held in bf16, on
    one GPU or with DDP. Sharded in 16 bits they are fp32 whatever the model was loaded in: accelerate upcasts the
    trained parameters before FSDP2 shards them (`fsdp2_prepare_model`; accelerate 1.13 and 1.14 meant to and did
    not, accelerate#3979), and DeepSpeed keeps fp32 master weights of its 16-bit model."""
    return 2 if config.weights_dtype != "fp32" and not sharded_in_16_bit(config) else 4
