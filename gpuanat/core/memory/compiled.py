"""What the memory model does not cover under torch.compile: the whole model compiled (`--compile`). Its regions
outside attention (`--compile-regions`) keep eager's memory (measured equal on the H100, docs/compile.md) and are
predicted as eager; the whole model is not: `prediction` leaves its activations and peaks out, and the largest batch,
the fit ladder and `tune` never read a compiled model's memory from the eager bytes model.
"""

from __future__ import annotations

from gpuanat.core.vocabulary.config import RunConfig

COMPILE_UNPREDICTED = (
    "the whole model compiled (--compile) is not predicted: inductor's partitioner chooses which activations to save "
    "and which to recompute, which the bytes model does not describe, and with attention dropout the compiled graph "
    "does not keep SDPA's fused kernel and materialises the attention matrices; on the H100, bert-large bf16 at batch "
    "64 peaked at 68.1 GB allocated against eager's 39.4 GB (1.7x), and from batch 96 it ran out of memory where eager "
    "trains (docs/compile.md). --compile-regions is predicted: measured as eager"
)
"""Why a run with the whole model compiled gets no activations, peaks or largest batch
(`compile_unpredicted_reason`)."""
COMPILE_UNPREDICTED_FIELDS = (
    "activations_bytes",
    "temporaries_bytes",
    "peak_allocated_bytes",
    "peak_reserved_bytes",
    "peak_device_bytes",
    "logits_bytes",
)
"""What a prediction of the whole model compiled leaves out (None), each for `COMPILE_UNPREDICTED`; the weights,
gradients, optimizer state and CUDA context stay: compiling changes none of them."""


def compile_unpredicted_reason(config: RunConfig) -> str | None:
    """Why the run's peak cannot be predicted under torch.compile (the whole model; its regions outside attention are
    predicted as eager, docs/compile.md); None where it can. `estimate_memory` stays the eager bytes model: no
    peak, largest batch or fit ladder step may be read from it for such a run."""
    return COMPILE_UNPREDICTED if config.compile else None
