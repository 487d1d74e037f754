"""What `gpuanat tune` may change: the dimensions (the techniques searched, one at a time), the RunConfig fields
each one sets, and the limits one search keeps to on this machine (`SearchSpace`).

The user's flags hold a dimension (`search_space`'s `given`); a machine or workload with no alternative for one
leaves it out.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.presets import PRESETS
from gpuanat.core.vocabulary.techniques import BY_SHARDING, ZERO_STAGES, with_distributed, with_weights_mode
from gpuanat.core.vocabulary.validation import refusal

DIMENSION_FIELDS: dict[str, tuple[str, ...]] = {
    "batch": ("batch_size", "grad_accum"),
    "precision": ("precision",),
    "weights": ("weights_dtype", "autocast"),
    "tf32": ("tf32",),
    "attn": ("attn",),
    "optim": ("optim",),
    "distributed": ("distributed",),
    "grad-checkpointing": ("grad_checkpointing", "selective_checkpointing"),
    "workers": ("workers",),
    "expandable-segments": ("expandable_segments",),
    "liger": ("liger", "liger_layers"),
    "engine": ("engine",),
    "compile": ("compile_regions", "compile"),
}
"""The dimensions searched, in the order of the moves, and the RunConfig fields each one sets (Liger: all its kernels or
none, as HF Trainer's use_liger_kernel). The weights: fp32 master weights, bf16 under autocast, pure bf16
(`techniques.WEIGHTS_MODES`; bf16 brings --precision bf16). On several GPUs the distributed technique is one: DDP,
ZeRO-1/2 (with DeepSpeed), FSDP2 and ZeRO-3 trade communication for the memory a larger batch needs, which only a run
shows. torch.compile comes last: its trials are the longest (compilation). Its values: eager and the regions outside
attention compiled (faster than eager on the H100); never the whole model, whose memory is not predicted (slower
there, with 1.7× the memory: `candidates.COMPILE_CANDIDATES`)."""
DIMENSIONS = tuple(DIMENSION_FIELDS)
MEMORY_MARGIN_FRACTION = 0.02
"""Left free of the GPU's memory when pruning by prediction: the predicted peak is within a few % of the measured
one for the configurations measured (docs/memory-model.md); 1.6 GiB of an 80 GiB GPU."""
CPU_MAX_BATCH = 64
"""The largest batch tried on the CPU when no --gpu-memory bounds it: host memory is not what the search is for."""
GPU_MAX_BATCH = 4096
"""The largest batch tried on a GPU, whatever the prediction says (as `gpuanat fit`'s --max-batch)."""


@dataclass(frozen=True)
class SearchSpace:
    """What `run_tune` may change, and the limits it searches within."""

    dimensions: tuple[str, ...]
    """The dimensions searched, in move order; the others stay as the base config has them."""
    half_precision: str
    """bf16, or fp16 on a GPU of compute capability < 8."""
    optimizers: tuple[str, ...]
    """adamw_torch_fused, and adamw_bnb_8bit where bitsandbytes and CUDA are there."""
    gpu_memory_bytes: int | None
    """The GPU's memory (NVML's total) the candidates must fit; None: no limit (the CPU without --gpu-memory)."""
    max_batch: int
    effective_batch: int | None = None
    """Samples per optimizer step to keep: each batch b trains with accumulation effective_batch / b."""
    tf32_available: bool = False
    distributed_techniques: tuple[str, ...] = ()
    """On several GPUs: the distributed techniques this machine can run for this workload (ZeRO needs DeepSpeed)."""

    @property
    def usable_memory_bytes(self) -> int | None:
        if self.gpu_memory_bytes is None:
            return None
        return self.gpu_memory_bytes - int(MEMORY_MARGIN_FRACTION * self.gpu_memory_bytes)


def search_space(
    base: RunConfig,
    capabilities: Capabilities,
    given: Collection[str],
    *,
    gpu_memory_bytes: int | None,
    only: Sequence[str] | None = None,
    max_batch: int | None = None,
    effective_batch: int | None = None,
) -> SearchSpace:
    """The dimensions to search on this machine: those in `only` (default: all), less those whose fields the user
    gave (`given`: RunConfig field names) and those this machine or workload has no alternative for."""
    cuda = base.device == "cuda"
    capability = capabilities.cuda_compute_capability
    ampere = cuda and (capability is None or capability >= (8, 0))
    causal_lm = base.model is None and PRESETS[base.preset].objective == "causal-lm"
    bitsandbytes = cuda and capabilities.bitsandbytes_version is not None
    several = cuda and (base.ranks or 1) > 1
    distributed = tuple(
        technique
        for technique in BY_SHARDING[1:]
        if several
        and (technique not in ZERO_STAGES or capabilities.deepspeed_version)
        and refusal(with_distributed(base, technique)) is None
    )
    applicable = {
        "batch": "batch_size" not in given,
        "precision": True,
        # a bf16 model where bf16 computes and pure bf16 trains (not LoRA's 16-bit base, nor sharded)
        "weights": ampere
        and cuda
        and refusal(with_weights_mode(base, "pure-bf16")) is None
        and ("precision" not in given or base.precision == "bf16"),
        "tf32": ampere,
        "attn": True,
        "optim": bitsandbytes and not base.load_in_4bit,
        "distributed": len(distributed) > 1,
        "grad-checkpointing": gpu_memory_bytes is not None,
        "workers": True,
        "expandable-segments": cuda,
        "liger": causal_lm and cuda and capabilities.liger_version is not None,
        # the docs' Accelerate loop reads the loss only when it logs; Trainer synchronises once a step
        "engine": base.distributed in ("none", "ddp"),
        "compile": True,
    }
    chosen = set(DIMENSIONS if only is None else only)
    dimensions = tuple(
        name
        for name in DIMENSIONS
        if name in chosen and applicable[name] and not (set(DIMENSION_FIELDS[name]) & set(given) - {"grad_accum"})
    )
    limit = max_batch or (GPU_MAX_BATCH if cuda or gpu_memory_bytes is not None else CPU_MAX_BATCH)
    if effective_batch is not None:
        limit = min(limit, effective_batch)
    return SearchSpace(
        dimensions=dimensions,
        half_precision="bf16" if not cuda or ampere else "fp16",
        optimizers=("adamw_torch_fused", "adamw_bnb_8bit") if bitsandbytes else ("adamw_torch_fused",),
        gpu_memory_bytes=gpu_memory_bytes,
        max_batch=limit,
        effective_batch=effective_batch,
        tf32_available=ampere,
        distributed_techniques=distributed if "distributed" in dimensions else (),
    )


def searched_fields(space: SearchSpace) -> set[str]:
    return {name for dimension in space.dimensions for name in DIMENSION_FIELDS[dimension]}
