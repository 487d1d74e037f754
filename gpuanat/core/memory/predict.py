"""Memory prediction before a run, from the model's shape and the techniques alone (no torch): the bands put
together into one rank's estimate, its peak, whether it fits a GPU, and what no measurement has checked.

The parameter shapes come from `shapes`; the bands from `bands/` (weights, optimizer, activations), exact where the
sizes are fixed by the model (weights and gradients 4 B/param: torch AMP keeps fp32 weights) and measured on an
H100 where they are not (`precision`); what each rank of a run on several GPUs holds of them from `parallel`.
The peak is the largest of these moments: the end of the forward pass (activations alive, gradients
only when accumulating); the first optimizer step (all gradients, and the optimizer state created;
with checkpointing, the end of backward, where the first layer is recomputed); and, with AMP and
checkpointing, the last instant of the forward pass, before autocast exits and empties its cache.
Whether the largest batch fits is decided by the allocator's fragmentation there: a fraction of the peak
per precision and checkpointing, plus, with fp32 and checkpointing, a share of AdamW's moments. With
expandable segments the allocator maps freed pages back where they are needed, and none is charged: on the
H100 the peak allocated memory alone then decides (`EXPANDABLE_SEGMENTS_FRAGMENTATION`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from gpuanat.core.memory.bands.activations import (
    CUBLAS_WORKSPACE_BYTES,
    activations_bytes,
    checkpointed_math_attention_bytes,
    decoder_activations_bytes,
    liger_kept_bytes,
    liger_transient_bytes,
    logits_element_bytes,
    temporaries_bytes,
    wrapped_expert_backward_bytes,
)
from gpuanat.core.memory.bands.optimizer import large_moment_bytes, optimizer_step_temporaries_bytes
from gpuanat.core.memory.bands.precision import coefficients, is_mixed
from gpuanat.core.memory.bands.weights import (
    autocast_cache_bytes,
    decoder_weight_casts_bytes,
    dequantized_weight_bytes,
    half_weight_copies_bytes,
    tied_embedding_gradient_bytes,
)
from gpuanat.core.memory.compiled import compile_unpredicted_reason
from gpuanat.core.memory.measured_nearby import measured_families, measured_nearby
from gpuanat.core.memory.model_config import UnreadableModel, architecture_of
from gpuanat.core.memory.parallel import (
    RANK_COMMUNICATION_CONTEXT_BYTES,
    fsdp_backward_units_bytes,
    fsdp_cache_bytes,
    fsdp_tail_bytes,
    rank_state,
)
from gpuanat.core.memory.reserve import fits_replayed, reserve_above_peak_bytes
from gpuanat.core.memory.shapes import lora_expert_parameters, parameter_shapes
from gpuanat.core.memory.sizes import MIB
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import Prediction

CUDA_CONTEXT_BYTES = 760 * MIB
"""Per-process CUDA context, kernels and library handles outside torch's allocator: 742-758 MiB on the
H100 with torch 2.11 and CUDA 13 (benchmarks/results/h100/sweep.json)."""
DRIVER_RESERVED_BYTES = 615 * MIB
"""Device memory the driver keeps for itself (NVML v2 `reserved`), measured on the H100."""
MAX_BATCH_SEARCHED = 1 << 16
EXPANDABLE_SEGMENTS_FRAGMENTATION = 0.0
"""Fragmentation charged with expandable segments. On the H100 (benchmarks/results/h100/anatomy/edge/) the
largest batch with no fragmentation charged trained and 8 more ran out of memory for fp32, bf16, and with
checkpointing fp32 AdamW, fp32 and bf16 Adafactor and bf16 SGD, each near its peak's estimate; mixed precision
with checkpointing and AdamW or 8-bit Adam ran out of memory there, bf16 20 MB short with 135-139 MiB reserved
but unallocated (8 fewer trained; fp16 was not tried lower)."""


@dataclass(frozen=True)
class MemoryEstimate:
    weights_bytes: int
    gradients_bytes: int
    optimizer_state_bytes: int
    activations_bytes: int
    """What the probe reports as activations: allocated at the end of forward minus weights, gradients,
    optimizer state and the batch — so it includes AMP's weight copies and the cuBLAS workspaces."""
    gradients_at_peak_bytes: int
    """Gradients alive at the end of forward: all of them when accumulating, else none."""
    temporaries_bytes: int
    """Transient memory of the backward pass above what is alive at the end of forward."""
    autocast_cache_bytes: int
    """With AMP and checkpointing: the half-precision weight copies alive until the forward pass returns."""
    step_temporaries_bytes: int
    """What the optimizer step allocates and frees again (`optimizer_step_temporaries_bytes`)."""
    peak_allocated_bytes: int
    """The largest of: weights + optimizer state + activations + gradients alive at the end of forward +
    temporaries; weights + gradients + optimizer state + workspaces at the first optimizer step, with the
    step's temporaries or (checkpointing) the first layer's recompute, whichever is larger; and
    weights + optimizer state + activations + gradients alive + autocast's cache as the forward returns; and under
    FSDP2, the loss being computed (the LM head's unit twice, the fp32 logits)."""
    cache_fraction: float
    """Expected allocator reservation above the peak, as a fraction of it, near the memory limit."""
    moment_fragmentation_bytes: int
    """Reservation lost, in addition, to optimizer moments splitting the large pool's segments."""
    communication_buffers_bytes: int = 0
    """Kept all run long by a distributed wrapper, in torch's allocator: DDP's gradient buckets (a copy of every
    gradient). In the temporaries & cache band."""
    ranks: int = 1
    distributed: str = "none"
    logits_bytes: int = 0
    """Of the activations, a causal LM's logits (what the probe measures as `logits_bytes`)."""
    sharded_cache_bytes: int = 0
    """What the allocator caches above the peak under FSDP2, in place of the cache fraction (0: not modelled)."""
    first_buckets_bytes: int = 0
    """Of the peak, DDP's first buckets, which a rank may still hold after their rebuild
    (`ddp_first_buckets_may_outlive`)."""
    step_segments_above_peak_bytes: int = 0
    """ZeRO-3: the reserve its optimizer step adds (`RankState.step_segments_bytes`) beyond the peak allocated and the
    cache fraction: the reserve of the forward and backward passes and the step's segments beside it."""
    reserve_above_peak_bytes: int | None = None
    """What torch's allocator holds above the peak, from replaying the run's allocation stream (`reserve`); None
    where no stream describes the run (several GPUs, QLoRA, Liger's loss): the cache fraction then."""
    run_config: RunConfig | None = dataclasses.field(default=None, repr=False, compare=False)
    """The configuration estimated, for replaying its stream against a GPU's capacity (`fits_in`)."""


def estimate_memory(config: RunConfig) -> MemoryEstimate:
    """One rank's memory (the whole run's on one GPU)."""
    arch = architecture_of(config)
    shapes = parameter_shapes(arch)
    held = rank_state(config, arch, shapes)
    weights, gradients, optimizer = held.weights_bytes, held.gradients_bytes, held.optimizer_state_bytes
    logits = 0
    if arch.objective == "causal-lm" and config.liger:
        # Liger's fused loss holds no vocabulary-sized tensor: the decoder's activations as for a vocabulary of 0,
        # and the gradients the fused loss keeps for backward in their place
        activations = (
            decoder_activations_bytes(config, dataclasses.replace(arch, vocab_size=0))[0]
            + liger_kept_bytes(config, arch)
            + held.half_weight_copies_bytes
            + CUBLAS_WORKSPACE_BYTES
        )
    elif arch.objective == "causal-lm":
        activations, logits = decoder_activations_bytes(config, arch)
        activations += decoder_weight_casts_bytes(config, arch, shapes) + CUBLAS_WORKSPACE_BYTES
    else:
        activations = (
            activations_bytes(config, arch, shapes)
            - half_weight_copies_bytes(config, shapes)
            + held.half_weight_copies_bytes
        )
    head_unit = fsdp_tail_bytes(config, arch, shapes)
    activations += held.gathered_parameters_bytes + head_unit
    # Liger's chunks come and go in the forward pass, before backward's temporaries; QLoRA's dequantized weight
    # exists beside those
    # A causal LM's backward begins with the gradient of the logits, fp32, beside everything the forward kept: on the
    # H100 the peak was that far above the bands at the end of the forward pass (e.g. 3.98 GiB for 3.91 GiB of logits).
    # Where FSDP2 or DeepSpeed compute in 16 bits, its 16-bit cast for the LM head's backward beside it (on 2 H200s,
    # llama-3.1-8b with LoRA at seq 4096: 15.72 GiB measured, 15.70 so)
    fp32_logits = logits * 4 // logits_element_bytes(config)  # (none with Liger's fused loss)
    sixteen_bit_gradient = logits if fp32_logits != logits else 0
    # Where PEFT wraps a mixture of experts' weights, the last MoE layer's backward can hold more, once the loss's
    # fp32 log-probabilities (the size of the fp32 logits) are freed (H100, benchmarks/results/h100/held_out50/)
    backward_temporaries = (
        max(fp32_logits + sixteen_bit_gradient, wrapped_expert_backward_bytes(config, arch) - fp32_logits)
        if arch.objective == "causal-lm"
        else temporaries_bytes(config, arch)
    )
    temporaries = (
        max(backward_temporaries + dequantized_weight_bytes(config, arch), liger_transient_bytes(config, arch))
        + held.communication_buffers_bytes
    )
    gradients_at_peak = held.gradients_at_peak_bytes
    # DDP's first buckets, which their rebuild as step 2 begins may leave to a rank (`ddp_first_buckets_may_outlive`)
    forward_end_peak = weights + optimizer + activations + gradients_at_peak + temporaries + held.first_buckets_bytes
    # Late in backward with checkpointing, the kept inputs are mostly freed, but nearly all gradients exist while
    # the first layer is recomputed; then a tied embedding's gradient added to the LM head's as backward ends; then the
    # optimizer step, with its own temporaries: at small batches, the peak.
    step_temporaries = held.step_temporaries_bytes or optimizer_step_temporaries_bytes(config, shapes)
    first_step_peak = (
        weights
        + gradients
        + optimizer
        + CUBLAS_WORKSPACE_BYTES
        + max(
            temporaries if config.grad_checkpointing else 0,
            step_temporaries,
            fsdp_backward_units_bytes(config, arch, shapes),
            tied_embedding_gradient_bytes(config, arch),
            checkpointed_math_attention_bytes(config, arch),
        )
    )
    # Under FSDP2 the loss is computed while the LM head's unit is held twice, its all-gather buffer beside its
    # unsharded parameters, and beside the log-softmax it keeps, the logits upcast to fp32 (a memory snapshot of
    # llama-3.1-8b with LoRA on 2 H200s, benchmarks/results/h200x2/lora_peak/: the peak there, 11.23 GiB at seq 1024,
    # this 11.23; 15.72 at 4096, this 15.69)
    loss_peak = (weights + optimizer + activations + gradients_at_peak + head_unit + fp32_logits) if head_unit else 0
    autocast_cache = autocast_cache_bytes(config, shapes)
    # Only where the accumulated gradients are alive too does this moment exceed the others.
    forward_return_peak = weights + optimizer + activations + gradients_at_peak + autocast_cache
    peak_allocated = max(forward_end_peak, first_step_peak, forward_return_peak, loss_peak)
    # ZeRO-3's step reserves its sub-group's gradients anew beside the passes' cache: on 4 H200s llama-3.1-8b reserved
    # 45.68 GB at seq 1024 and 51.3-51.7 at 4096, the passes' peak with its cache and the step's 6.02 GB 44.1 and 49.8
    # (benchmarks/results/h200x4/sharded_reference/); on 2, 77.1-78.1 and 82.5 (this: 77.2, 82.9)
    passes_peak = max(forward_end_peak, forward_return_peak, loss_peak)
    step_segments_above_peak = max(0, passes_peak + held.step_segments_bytes - peak_allocated)
    if config.expandable_segments:
        cache_fraction, moment_fragmentation = EXPANDABLE_SEGMENTS_FRAGMENTATION, 0
    else:
        cache_fraction = coefficients(config).cache_fraction
        moment_fragmentation = int(coefficients(config).moment_fragmentation * large_moment_bytes(config, shapes))
    return MemoryEstimate(
        weights_bytes=weights,
        gradients_bytes=gradients,
        optimizer_state_bytes=optimizer,
        activations_bytes=activations,
        gradients_at_peak_bytes=gradients_at_peak,
        temporaries_bytes=temporaries,
        autocast_cache_bytes=autocast_cache,
        step_temporaries_bytes=step_temporaries,
        peak_allocated_bytes=peak_allocated,
        cache_fraction=cache_fraction,
        moment_fragmentation_bytes=moment_fragmentation,
        communication_buffers_bytes=held.communication_buffers_bytes,
        ranks=config.ranks or 1,
        distributed=config.distributed,
        logits_bytes=logits,
        sharded_cache_bytes=fsdp_cache_bytes(
            config, arch, shapes, fp32_logits, logits_in_use_at_peak=peak_allocated > first_step_peak
        ),
        first_buckets_bytes=held.first_buckets_bytes
        if forward_end_peak >= max(first_step_peak, forward_return_peak, loss_peak)
        else 0,
        step_segments_above_peak_bytes=step_segments_above_peak,
        reserve_above_peak_bytes=reserve_above_peak_bytes(config),
        run_config=config,
    )


def prediction(config: RunConfig) -> Prediction | None:
    """The estimate as stored with a run and printed by `gpuanat predict`; None for a --model whose config cannot be
    read or described (`unreadable_model_reason` says why). With the whole model compiled, the bands it cannot cover
    are None (`compiled.COMPILE_UNPREDICTED_FIELDS`) and its caveat begins with why."""
    if unreadable_model_reason(config) is not None:
        return None
    estimate, caveat = estimate_memory(config), prediction_caveat(config)
    predicted = Prediction(
        weights_bytes=estimate.weights_bytes,
        gradients_bytes=estimate.gradients_bytes,
        optimizer_state_bytes=estimate.optimizer_state_bytes,
        activations_bytes=estimate.activations_bytes,
        gradients_at_forward_end_bytes=estimate.gradients_at_peak_bytes,
        temporaries_bytes=estimate.temporaries_bytes,
        peak_allocated_bytes=estimate.peak_allocated_bytes,
        peak_reserved_bytes=peak_reserved_bytes(estimate),
        cuda_context_bytes=cuda_context_bytes(estimate),
        communication_buffers_bytes=estimate.communication_buffers_bytes,
        ddp_first_buckets_bytes=estimate.first_buckets_bytes,
        peak_device_bytes=peak_device_bytes(estimate),
        ranks=estimate.ranks,
        logits_bytes=estimate.logits_bytes,
        confidence="checked" if caveat is None else "unchecked",
        caveat=caveat,
    )
    unpredicted = compile_unpredicted_reason(config)
    if unpredicted is None:
        return predicted
    return dataclasses.replace(  # COMPILE_UNPREDICTED_FIELDS
        predicted,
        activations_bytes=None,
        temporaries_bytes=None,
        peak_allocated_bytes=None,
        peak_reserved_bytes=None,
        peak_device_bytes=None,
        logits_bytes=None,
        confidence="unchecked",
        caveat=unpredicted if caveat is None else f"{unpredicted}; {caveat}",
    )


HOST_MEMORY_UNAVAILABLE = {
    "cuda_context_bytes": "CPU run: no CUDA context",
    "peak_reserved_bytes": "CPU run: no caching allocator's reserve above the tensors",
    "peak_device_bytes": "CPU run: no GPU memory; the peak allocated is in host memory",
}
"""What a prediction for the CPU leaves out, and why (`host_prediction`)."""
HOST_CAVEAT = (
    "on the CPU only the weights, gradients and optimizer state are exact; the activations are the GPU kernels' "
    "model (a tiny BERT on the CPU kept as much with eager attention, more with SDPA); the process's own code and "
    "libraries come on top"
)


def host_prediction(config: RunConfig) -> Prediction | None:
    """`prediction` for a run on the CPU (`gpuanat predict --device cpu`): the tensors in host memory, with no CUDA
    context, no caching allocator's reserve and no cuBLAS workspaces (None where the GPU's prediction has one:
    `HOST_MEMORY_UNAVAILABLE`); None where `prediction` is. A CPU run's result still stores `prediction`, the GPU's
    (`gpuanat tune --device cpu` prunes with it as on a GPU)."""
    predicted = prediction(config)
    if predicted is None:
        return None
    # `estimate_memory` counts the workspaces once in the activations of every workload and once in each moment's peak
    # (none of them predicted with the whole model compiled)
    activations, peak = predicted.activations_bytes, predicted.peak_allocated_bytes
    return dataclasses.replace(
        predicted,
        activations_bytes=activations - CUBLAS_WORKSPACE_BYTES if activations is not None else None,
        peak_allocated_bytes=peak - CUBLAS_WORKSPACE_BYTES if peak is not None else None,
        cuda_context_bytes=None,
        peak_reserved_bytes=None,
        peak_device_bytes=None,
        confidence="unchecked",
        caveat=HOST_CAVEAT if predicted.caveat is None else f"{predicted.caveat}; {HOST_CAVEAT}",
    )


def unreadable_model_reason(config: RunConfig) -> str | None:
    """Why the run's --model cannot be predicted (its config not found, or an architecture the model does not
    describe, or LoRA dropout on experts PEFT cannot give it to); None where it can (every preset)."""
    try:
        arch = architecture_of(config)
    except UnreadableModel as error:
        return str(error)
    if config.lora_dropout and lora_expert_parameters(arch, config):
        return (
            f"PEFT adapts {arch.family}'s router and experts as parameters, which take no LoRA dropout (peft 0.21 "
            "refuses it): leave out --lora-dropout"
        )
    return None


MEASURED_DECODER_FAMILIES = ("llama", "qwen2")
"""Decoder families the H100 matrix measured (docs/llm.md): llama-3.2-1b, llama-3.1-8b (QLoRA), qwen2.5-0.5b."""
MEASURED_SHARDED_DECODER_FAMILIES = (*MEASURED_DECODER_FAMILIES, "mistral")
"""Decoder families measured under FSDP2 on 2 and 4 H200s against a plain Trainer (docs/several-gpus.md):
llama-3.1-8b, qwen2.5-7b, mistral-7b."""


LORA_CHECKED_EXPERT_FAMILIES = ("granitemoe", "mixtral", "qwen3_moe", "olmoe", "qwen2_moe")
"""Mixtures of experts whose LoRA runs were measured on the H100 against a plain Trainer (docs/any-model.md, experts
with adapters): PEFT wraps the routers and experts of the middle three, not GraniteMoE's or Qwen2-MoE's."""


def prediction_caveat(config: RunConfig) -> str | None:
    """Why not to trust a prediction: what no measurement has checked; None where measurements held it (BERT on the
    H100: docs/memory-model.md; bert-base, gpt2 and the decoders of the H100 matrix: docs/llm.md; the config.json
    models of docs/any-model.md)."""
    arch = architecture_of(config)
    notes = list(arch.assumed)
    if config.model is not None and not arch.assumed and arch.family not in measured_families():
        notes.append(f"no {arch.family} model was measured (its layers are read from the config and the family's code)")
    if arch.experts and config.lora and arch.family not in LORA_CHECKED_EXPERT_FAMILIES:
        notes.append(f"LoRA on {arch.family}'s experts was not measured (what PEFT adapts there is read from its code)")
    if arch.objective == "causal-lm":
        measured = MEASURED_SHARDED_DECODER_FAMILIES if config.distributed == "fsdp" else MEASURED_DECODER_FAMILIES
        if config.model is None and arch.family not in measured:
            notes.append(f"no {arch.family} decoder was measured (its layers are Llama's, so the model applies)")
        if not is_mixed(config):
            notes.append("decoders were measured in bf16 only")
        if config.attn != "eager" and arch.eager_only:
            notes.append(f"transformers gives {arch.family} no SDPA attention: it trains with --attn eager only")
        if arch.kv_broadcast_to_heads and config.grad_checkpointing and config.attn != "eager":
            notes.append(
                "checkpointed multi-query math attention held about 0.2 GiB a sequence more on the H100 than derived "
                "(falcon-7b-8l, seq 1024: 2-9% low)"
            )
        if config.load_in_4bit and not config.grad_checkpointing:
            notes.append("QLoRA was measured with checkpointing only (its fp32 residual stream is modelled)")
        if config.liger or config.liger_layers:
            notes.append(
                "Liger was checked with liger-kernel 0.8.5 on six families, one GPU, without checkpointing "
                "(with its fused loss and LoRA: 1-4% low)"
            )
        if config.liger_layers and arch.experts:
            notes.append("Liger's kernels in a mixture of experts' experts are not modelled (counted as without)")
        notes += sharded_decoder_notes(config)
    elif config.lora:
        notes.append("LoRA was measured on decoders only: the adapters are exact, the activations may be off")
    nearby = measured_nearby(config, arch.family)
    if nearby.same_techniques and not nearby.trusted:  # (measured so, and not to 10%)
        notes.append(nearby.text)
    if not notes:
        return None
    return "; ".join(notes) + "; the weights, gradients and optimizer state are exact"


def sharded_decoder_notes(config: RunConfig) -> list[str]:
    """What the 7-8B decoders measured on 2 and 4 H200s against a plain HF Trainer did not cover
    (docs/several-gpus.md): FSDP2 and ZeRO-3 with checkpointing, ZeRO-2 at one length; DDP never (an 8B model's state
    does not fit)."""
    if config.distributed == "none":
        return []
    if config.distributed == "ddp":
        return ["decoders were not measured under ddp on several GPUs"]
    notes = []
    if config.distributed in ("zero1", "zero2"):
        notes.append(
            "decoders under ZeRO-1/2 were measured at one length (llama-3.1-8b, seq 1024, ZeRO-2 on 2 and 4 "
            "GPUs), and their step's copies fitted on 2"
        )
    if not config.grad_checkpointing:
        notes.append(f"decoders under {config.distributed} were measured with checkpointing only")
    if (config.ranks or 1) > 4:
        notes.append(
            "decoders on several GPUs were measured on 2 and 4 (the allocator's cache under FSDP2 was fitted there)"
        )
    return notes


ALLOCATOR_CACHE_MIN_BYTES = 256 * MIB
"""Away from the memory limit the allocator keeps at least this much cached above the peak (median of the
fitted rows: 0.14-0.84 GiB)."""


def peak_reserved_bytes(estimate: MemoryEstimate) -> int:
    """Memory torch's allocator will have reserved at the peak. Away from the memory limit the segments that
    optimizer moments split cost nothing (the allocator just holds more), so only the cache fraction counts."""
    if estimate.reserve_above_peak_bytes is not None:
        return estimate.peak_allocated_bytes + estimate.reserve_above_peak_bytes
    cache = estimate.sharded_cache_bytes or max(
        estimate.cache_fraction * estimate.peak_allocated_bytes, ALLOCATOR_CACHE_MIN_BYTES
    )
    return int(estimate.peak_allocated_bytes + cache + estimate.step_segments_above_peak_bytes)


def fragmentation_bytes(estimate: MemoryEstimate) -> int:
    """Reservation above the peak that the allocator cannot give back near the memory limit."""
    return int(estimate.cache_fraction * estimate.peak_allocated_bytes) + estimate.moment_fragmentation_bytes


def cuda_context_bytes(estimate: MemoryEstimate) -> int:
    """Memory each rank's process holds outside torch's allocator: the CUDA context, and NCCL's with several."""
    if estimate.ranks <= 1 or estimate.distributed == "none":
        return CUDA_CONTEXT_BYTES
    return CUDA_CONTEXT_BYTES + RANK_COMMUNICATION_CONTEXT_BYTES[estimate.distributed.rstrip("123")]


def peak_device_bytes(estimate: MemoryEstimate) -> int:
    """Device memory the run (a rank) will hold at its peak: allocator reservation plus the CUDA context."""
    return peak_reserved_bytes(estimate) + cuda_context_bytes(estimate)


def fits_in(estimate: MemoryEstimate, gpu_memory_bytes: int) -> bool:
    """Whether the run fits a GPU of `gpu_memory_bytes` (its total, as NVML reports it). Near the limit the
    allocator gives its cache back before failing, so only fragmentation counts then."""
    if estimate.run_config is not None and estimate.reserve_above_peak_bytes is not None:
        replayed = fits_replayed(estimate.run_config, estimate.peak_allocated_bytes, gpu_memory_bytes)
        if replayed is not None:
            return replayed
    allocatable = gpu_memory_bytes - DRIVER_RESERVED_BYTES - cuda_context_bytes(estimate)
    return estimate.peak_allocated_bytes + fragmentation_bytes(estimate) <= allocatable


def max_batch_caveat(config: RunConfig) -> str | None:
    """Why not to trust `max_batch_size` for this configuration, where the H100's trials refuted it."""
    if not (is_mixed(config) and config.grad_checkpointing):
        return None
    if config.expandable_segments and config.optim in ("adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit"):
        return (
            "with expandable segments, mixed precision, checkpointing and this optimizer, an H100 ran out of "
            "memory at this prediction (bf16 20 MB short, and 8 fewer trained); `gpuanat fit` finds the real one"
        )
    if not config.expandable_segments and config.optim in ("adafactor", "adamw_bnb_8bit"):
        return (
            "with mixed precision, checkpointing and this optimizer the allocator's fragmentation near the limit "
            "is not predicted: on an H100 this prediction ran out of memory; `gpuanat fit` finds the real one, "
            "and --expandable-segments fits a larger batch"
        )
    return None


def max_batch_size(config: RunConfig, gpu_memory_bytes: int) -> int:
    """The largest per-device batch predicted to fit `gpu_memory_bytes` (0: none fits)."""

    def fits(batch_size: int) -> bool:
        return fits_in(estimate_memory(config.replace(batch_size=batch_size)), gpu_memory_bytes)

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
