"""Memory prediction before a run, from the model's shape and the techniques alone (no torch).

Exact where the sizes are fixed by the model: weights and gradients 4 B/param (torch AMP keeps fp32
weights); optimizer state — AdamW 8 B/param (+ a 4-byte step per tensor when fused), bitsandbytes
8-bit Adam 2 B/param in 256-element blocks with a 4-byte scale per block and moment, 32-bit state for
tensors under 4096 elements and for the embeddings (the Trainer registers them with bitsandbytes'
manager), Adafactor row + column factors (full second moment for vectors) and a step per tensor, SGD 0;
AMP's half-precision copies of the matmul weights (2 B/param, not the embeddings), held from the
forward pass to the backward pass unless activations are checkpointed; with checkpointing, autocast's
cache still holds all of them until the forward pass ends.

Measured on an H100 (benchmarks/results/h100/memory_matrix.json, torch 2.11, transformers 5.17) and
fitted on its batch-8 and batch-32 rows, batch 64 with checkpointing, and four largest-batch searches
(benchmarks/fit_memory_model.py), the rest held out:
bytes per token-hidden element stored for backward, per layer; with eager attention, bytes per
attention score; what checkpointing keeps; the backward pass's temporaries; the cuBLAS workspaces.
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
from typing import NamedTuple

from gpuanat.core.run.config import RunConfig
from gpuanat.core.run.presets import PRESETS, ModelPreset

MIB = 1024**2
NUM_LABELS = 2
CUDA_CONTEXT_BYTES = 760 * MIB
"""Per-process CUDA context, kernels and library handles outside torch's allocator: 742-758 MiB on the
H100 with torch 2.11 and CUDA 13 (benchmarks/results/h100/sweep.json)."""
RANK_COMMUNICATION_CONTEXT_BYTES = {"ddp": 850 * MIB, "fsdp": 850 * MIB, "zero": 1330 * MIB}
"""Per rank of a distributed run, on top of the CUDA context: NCCL's buffers and streams (and DeepSpeed's), outside
torch's allocator. Measured on 2 H200s, bert-large bf16: 1.57 GiB of context per rank with DDP and 2.04 GiB with
DeepSpeed ZeRO against 0.74 GiB alone (benchmarks/results/h200x2/multi/results.jsonl); FSDP taken as DDP."""
DRIVER_RESERVED_BYTES = 615 * MIB
"""Device memory the driver keeps for itself (NVML v2 `reserved`), measured on the H100."""
CUBLAS_WORKSPACE_BYTES = 72_702_916
"""cuBLAS/cuBLASLt workspaces, allocated through torch's allocator at the first matmul and kept:
allocated memory after a step minus weights and optimizer state, median of the fitted rows."""


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
        activations_per_layer=66.45, eager_per_score=8.99, checkpointed=0.0, backward_temporaries=24.23,
        recompute_temporaries=0.0, recompute_constant_bytes=0.0, eager_recompute_per_score=0.0,
        cache_fraction=0.0028, moment_fragmentation=0.0),
    (True, False): PrecisionCoefficients(
        activations_per_layer=42.29, eager_per_score=6.99, checkpointed=0.0, backward_temporaries=17.90,
        recompute_temporaries=0.0, recompute_constant_bytes=0.0, eager_recompute_per_score=0.0,
        cache_fraction=0.0028, moment_fragmentation=0.0),
    (False, True): PrecisionCoefficients(
        activations_per_layer=66.45, eager_per_score=8.99, checkpointed=105.03, backward_temporaries=0.0,
        recompute_temporaries=77.06, recompute_constant_bytes=20_992_008, eager_recompute_per_score=14.76,
        cache_fraction=0.0579, moment_fragmentation=1.315),
    (True, True): PrecisionCoefficients(
        activations_per_layer=42.29, eager_per_score=6.99, checkpointed=101.02, backward_temporaries=0.0,
        recompute_temporaries=55.87, recompute_constant_bytes=34_136_584, eager_recompute_per_score=16.96,
        cache_fraction=0.0262, moment_fragmentation=0.0),
}
MAX_BATCH_SEARCHED = 1 << 16
EXPANDABLE_SEGMENTS_FRAGMENTATION = 0.0
"""Fragmentation charged with expandable segments. On the H100 (benchmarks/results/h100/anatomy/edge/) the
largest batch with no fragmentation charged trained and 8 more ran out of memory for fp32, bf16, and with
checkpointing fp32 AdamW, fp32 and bf16 Adafactor and bf16 SGD, each near its peak's estimate; mixed precision
with checkpointing and AdamW or 8-bit Adam ran out of memory there, bf16 20 MB short with 135-139 MiB reserved
but unallocated (8 fewer trained; fp16 was not tried lower)."""


@dataclass(frozen=True)
class ParameterShapes:
    params: int
    tensors: int
    matrices: tuple[tuple[int, int], ...]
    """Every 2-D parameter's shape."""
    vectors: tuple[int, ...]
    """Every 1-D parameter's length."""
    embedding_params: int
    embedding_tensors: int
    """The first `embedding_tensors` of `matrices` are the embeddings."""
    buffer_bytes: int


def decoder_linear_shapes(preset: ModelPreset) -> list[tuple[int, int]]:
    """(out, in) of one decoder layer's linear projections: q, k, v, o, then the SwiGLU MLP's gate, up and down."""
    h, i = preset.hidden_size, preset.intermediate_size
    q, kv = preset.num_heads * preset.head_dim, preset.kv_heads * preset.head_dim
    return [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]


def parameter_shapes(preset: ModelPreset) -> ParameterShapes:
    """The parameter tensors of the preset's model: a 2-label classifier, or a decoder's causal LM."""
    h, i, v, p = preset.hidden_size, preset.intermediate_size, preset.vocab_size, preset.max_positions
    matrices: list[tuple[int, int]] = []
    vectors: list[int] = []
    if preset.objective == "causal-lm":
        embeddings = [(v, h)]
        matrices += embeddings
        q, kv = preset.num_heads * preset.head_dim, preset.kv_heads * preset.head_dim
        for _ in range(preset.num_layers):
            matrices += decoder_linear_shapes(preset)
            vectors += [h, h] + ([q, kv, kv] if preset.attention_bias else [])  # RMSNorms, q/k/v biases
        vectors += [h]  # final RMSNorm
        if not preset.tie_word_embeddings:
            matrices += [(v, h)]  # LM head
        buffer_bytes = 2 * (preset.head_dim // 2) * 4  # rotary inv_freq and original_inv_freq, fp32
    elif preset.family == "bert":
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
                           embedding_tensors=len(embeddings),
                           buffer_bytes=buffer_bytes)


DECODER_LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""The module names of `decoder_linear_shapes`, in its order (Llama, Qwen2, Mistral)."""


def lora_shapes(preset: ModelPreset, config: RunConfig) -> ParameterShapes:
    """The LoRA adapters' parameters: A (rank × in) and B (out × rank) on each targeted linear layer. For decoders
    exactly as PEFT adds them ("all-linear": every projection but the LM head); for the classifiers an estimate
    over their non-embedding matrices (PEFT also trains a copy of their head)."""
    rank = config.lora
    if preset.objective == "causal-lm":
        wanted = (set(DECODER_LINEAR_NAMES) if config.lora_targets == "all-linear"
                  else {name.strip() for name in config.lora_targets.split(",")})
        targeted = [shape for name, shape in zip(DECODER_LINEAR_NAMES, decoder_linear_shapes(preset), strict=True)
                    if name in wanted] * preset.num_layers
    else:
        full = parameter_shapes(preset)
        targeted = list(full.matrices[full.embedding_tensors:])
    matrices = [shape for out, inp in targeted for shape in ((rank, inp), (out, rank))]
    return ParameterShapes(params=sum(r * c for r, c in matrices), tensors=len(matrices), matrices=tuple(matrices),
                           vectors=(), embedding_params=0, embedding_tensors=0, buffer_bytes=0)


NF4_BLOCK_ELEMENTS = 64
"""bitsandbytes' 4-bit blocksize: each block of 64 weights has its own scale (absmax)."""
NF4_NESTED_BLOCK_ELEMENTS = 256
"""Double quantization quantizes the blocks' fp32 scales to 8 bits, in blocks of 256 scales with an fp32 scale
each (`quantize_blockwise(absmax - offset, blocksize=256)`)."""
NF4_PER_WEIGHT_BYTES = 4 + 16 * 4 + 256 * 4
"""What each quantized weight keeps whatever its size: the scales' fp32 offset (their mean), its own copy of the
16-entry fp32 NF4 code and of the 256-entry fp32 8-bit map of its nested state (`code.to(device, copy=True)`)."""


def nf4_weight_bytes(elements: int) -> int:
    """Bytes of one weight of `elements` values quantized by bitsandbytes as QLoRA does (NF4, blocksize 64, double
    quantization; bitsandbytes 0.45-0.50 `functional.quantize_4bit` with `compress_statistics=True`): the packed
    values, two a byte (uint8, (n + 1) // 2); one 8-bit quantized scale per 64-value block (ceil(n / 64)); one fp32
    scale per 256 of those (4 · ceil(blocks / 256)); and `NF4_PER_WEIGHT_BYTES`. About 0.516 bytes a value for a
    large matrix: 0.5 + 1/64 + 4/(64·256)."""
    blocks = -(-elements // NF4_BLOCK_ELEMENTS)
    return (elements + 1) // 2 + blocks + 4 * -(-blocks // NF4_NESTED_BLOCK_ELEMENTS) + NF4_PER_WEIGHT_BYTES


def quantized_matrices(preset: ModelPreset) -> list[tuple[int, int]]:
    """The matrices QLoRA holds in 4 bits: every linear layer of a decoder's layers. Transformers keeps the output
    embeddings (the LM head, tied or not) and the input embeddings, which are no linear layers, out."""
    return decoder_linear_shapes(preset) * preset.num_layers


def qlora_base_bytes(preset: ModelPreset, shapes: ParameterShapes) -> int:
    """A QLoRA base's weights as training starts: the NF4 matrices with their quantization state
    (`nf4_weight_bytes`), and every other parameter — embeddings, LM head, norms, biases — in fp32, to which PEFT's
    `prepare_model_for_kbit_training` (peft 0.14-0.21) casts every 16-bit parameter that is not a `Params4bit`. The
    rotary frequencies stay the fp32 buffers the model was built with (a buffer is no parameter)."""
    quantized = quantized_matrices(preset)
    quantized_params = sum(rows * cols for rows, cols in quantized)
    return (sum(nf4_weight_bytes(rows * cols) for rows, cols in quantized) + 4 * (shapes.params - quantized_params)
            + shapes.buffer_bytes)


def qlora_head_copy_bytes(config: RunConfig, preset: ModelPreset) -> int:
    """Under mixed precision, the 16-bit copy autocast makes of a QLoRA model's fp32 LM head for its matmul, saved
    for backward (the head is frozen, so autocast's cache does not keep it; the matmul's saved weight does). With
    Liger the head's weight is cast inside the fused loss, chunk by chunk, and not saved (`liger_transient_bytes`)."""
    if not (config.load_in_4bit and _is_mixed(config)) or config.liger:
        return 0
    return 2 * preset.vocab_size * preset.hidden_size


def dequantized_weight_bytes(config: RunConfig, preset: ModelPreset) -> int:
    """With QLoRA, bitsandbytes' 4-bit matmul in training dequantizes its weight to the 16-bit compute dtype for
    each matmul, forward and backward, and frees it after (`MatMul4Bit`): one matrix at a time, the largest."""
    if not config.load_in_4bit:
        return 0
    return 2 * max(rows * cols for rows, cols in quantized_matrices(preset))


def _lm_head_input_element_bytes(config: RunConfig) -> int:
    """Bytes per element of the hidden states the LM head reads: the final norm's output, 16-bit on LoRA's 16-bit
    base, else fp32 (fp32 weights, also under autocast, which leaves norms alone; QLoRA's norms are fp32)."""
    return 2 if config.lora and not config.load_in_4bit and _is_mixed(config) else 4


def liger_chunk_tokens(config: RunConfig, preset: ModelPreset) -> int:
    """Tokens per chunk of Liger's fused linear cross-entropy (liger-kernel 0.8 `fused_linear_cross_entropy_forward`,
    `chunk_mem_const` 1): the b·s tokens split so one chunk's logits are about as large as the hidden states,
    ceil(V / h) chunks, the chunk rounded up to a power of two, at most b·s."""
    tokens = config.batch_size * config.seq_len
    chunks = -(-preset.vocab_size // preset.hidden_size)
    return min(1 << max(0, (-(-tokens // chunks) - 1).bit_length()), tokens)


def liger_kept_bytes(config: RunConfig, preset: ModelPreset) -> int:
    """What Liger's fused linear cross-entropy keeps from the forward pass to the backward pass, in place of the
    logits and the loss's log-probabilities: it computes the gradients in the forward pass and saves them — the
    hidden states' (b·s·h, their dtype), and, where the LM head trains (no LoRA), the head's (V·h, fp32)."""
    hidden = config.batch_size * config.seq_len * preset.hidden_size * _lm_head_input_element_bytes(config)
    head = 0 if config.lora else 4 * preset.vocab_size * preset.hidden_size
    return hidden + head


def liger_transient_bytes(config: RunConfig, preset: ModelPreset) -> int:
    """What Liger's fused loss allocates and frees again inside the forward pass, above what it keeps: the per-token
    fp32 losses, one chunk's logits (16-bit under autocast, else fp32) and its hidden-state gradient (fp32 at most),
    and with QLoRA under mixed precision the 16-bit cast of the fp32 LM head that each chunk's matmuls make."""
    if not config.liger:
        return 0
    chunk = liger_chunk_tokens(config, preset)
    logits_element = 2 if _is_mixed(config) else 4
    head_cast = 2 * preset.vocab_size * preset.hidden_size if config.load_in_4bit and _is_mixed(config) else 0
    return (4 * config.batch_size * config.seq_len + chunk * preset.vocab_size * logits_element
            + chunk * preset.hidden_size * 4 + head_cast)


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
    weights + optimizer state + activations + gradients alive + autocast's cache as the forward returns."""
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
    if config.optim in ("adamw_torch", "adamw_torch_fused"):
        steps = [StateTensor(4, False)] * shapes.tensors if config.optim == "adamw_torch_fused" else []  # else on CPU
        return [StateTensor(4 * size, True) for size in sizes for _moment in range(2)] + steps
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
        factors = [StateTensor(4 * length, False) for shape in shapes.matrices for length in shape]
        return (factors + [StateTensor(4 * size, True) for size in shapes.vectors]
                + [StateTensor(4, False)] * shapes.tensors)
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


def large_moment_bytes(config: RunConfig, shapes: ParameterShapes) -> int:
    """Optimizer moments (`StateTensor.moment`) that the allocator places in its large pool."""
    return sum(tensor.bytes for tensor in optimizer_state_tensors(config, shapes)
               if tensor.moment and tensor.bytes > ALLOCATOR_SMALL_BLOCK_BYTES)


def _is_mixed(config: RunConfig) -> bool:
    return config.precision in ("fp16", "bf16")


def coefficients(config: RunConfig) -> PrecisionCoefficients:
    return COEFFICIENTS[(_is_mixed(config), config.grad_checkpointing)]


def half_weight_copies_bytes(config: RunConfig, shapes: ParameterShapes) -> int:
    """AMP casts each matmul weight to 16 bits once per forward and keeps the copy for backward
    (autocast's cache); with checkpointing backward recomputes them per layer (`autocast_cache_bytes`)."""
    if not _is_mixed(config) or config.grad_checkpointing or config.lora:  # a LoRA base is 16-bit already
        return 0
    return 2 * _matmul_params(shapes)


def autocast_cache_bytes(config: RunConfig, shapes: ParameterShapes) -> int:
    """With AMP and checkpointing, the half-precision copy of every matmul weight stays in autocast's cache
    until the forward pass ends: the cache caches casts of leaf tensors that require grad, and is emptied
    when the outermost autocast exits, which accelerate's forward wrapper does as the forward returns, just
    before the end-of-forward hooks run. So the copies are not in the probe's activations, and backward
    (which recomputes each layer, casting again) does not hold them. Without checkpointing they are kept for
    backward anyway (`half_weight_copies_bytes`)."""
    if not _is_mixed(config) or not config.grad_checkpointing or config.lora:
        return 0
    return 2 * _matmul_params(shapes)


def _matmul_params(shapes: ParameterShapes) -> int:
    return sum(rows * cols for rows, cols in shapes.matrices[shapes.embedding_tensors:])


def computes_in_16_bit(config: RunConfig) -> bool:
    """Whether the model computes with 16-bit weights and no autocast: FSDP2's mixed-precision policy casts the
    gathered parameters, DeepSpeed casts the model. Measured on 2 and 4 H200s (bert-large, bf16): the activations
    of FSDP and ZeRO-1/2 are 6.50 GiB where one GPU under autocast holds 8.00 (its weight copies left out)."""
    return _is_mixed(config) and (config.distributed == "fsdp" or config.distributed.startswith("zero"))


def autocast_extra_bytes_per_token_hidden(preset: ModelPreset) -> int:
    """What autocast saves for backward beyond a model computing in 16 bits, per token and hidden unit and layer:
    it casts an fp32 activation anew for each linear that reads it (BERT's separate query, key and value: two 16-bit
    copies more than one; GPT-2's fused c_attn: none), and the LayerNorms (two a layer) run in fp32 on the fp32
    residual stream, so their saved inputs take 4 bytes, not 2. BERT: 2 × 2 + 2 × 2 = 8 of the 42.29 fitted under
    autocast, leaving 34.3 — which the 6.50 GiB measured with FSDP and ZeRO reproduce within 1%."""
    extra_input_copies = 2 if preset.family == "bert" else 0
    return 2 * extra_input_copies + 2 * 2


BERT_LARGE_LAYERS = 24
"""The layers of the model the BERT coefficients were fitted on."""


def gpt2_layer_bytes_per_token(config: RunConfig, preset: ModelPreset) -> int:
    """What autograd keeps of one GPT-2 block per token, as `benchmarks/saved_tensors.py` listed it on the H100 (gpt2,
    bf16 autocast: 69,184 B/token = 26h + 16i + 64): the two LayerNorms' fp32 inputs (autocast runs them in fp32:
    8h), the 16-bit casts c_attn and c_fc read (4h), the attention's 16-bit q, k, v, output and c_attn's output (12h),
    two dropout masks (2h), and GPT-2's tanh GELU, whose `pow` autocast runs in fp32: three fp32 intermediates (12i)
    beside its 16-bit input and the 16-bit cast c_proj reads (4i) — the reason the BERT coefficients, which know
    nothing of it, were 31-49% low for gpt2. In fp32 (not measured) the same tensors at 4 bytes: 42h + 20i."""
    h, i = preset.hidden_size, preset.intermediate_size
    statistics = 4 * preset.num_heads + 16  # SDPA's log-sum-exp, the LayerNorms' means and deviations
    if _is_mixed(config):
        return 26 * h + 16 * i + statistics
    return 42 * h + 20 * i + statistics


def activations_bytes(config: RunConfig, preset: ModelPreset, shapes: ParameterShapes) -> int:
    s, b, h, a, layers = config.seq_len, config.batch_size, preset.hidden_size, preset.num_heads, preset.num_layers
    c = coefficients(config)
    eager_scores = a * s * s * c.eager_per_score if config.attn == "eager" else 0.0
    if config.grad_checkpointing:
        # Each layer's input is kept (the residual stream: fp32 under autocast, 16-bit without), plus what is outside
        # the layers; the fitted coefficient is bert-large's, 24 layers, so it is split: 4 bytes a layer, the rest once.
        residual = 2 if computes_in_16_bit(config) else 4
        per_sample = s * h * (layers * residual + c.checkpointed - BERT_LARGE_LAYERS * 4)
    elif preset.family == "gpt2":
        per_sample = layers * (s * gpt2_layer_bytes_per_token(config, preset) + eager_scores) + s * 7 * h
    else:
        per_token_hidden = c.activations_per_layer - (autocast_extra_bytes_per_token_hidden(preset)
                                                      if computes_in_16_bit(config) else 0)
        per_sample = layers * (s * h * per_token_hidden + eager_scores)
    return int(b * per_sample) + half_weight_copies_bytes(config, shapes) + CUBLAS_WORKSPACE_BYTES


def decoder_residual_element_bytes(config: RunConfig) -> int:
    """Bytes per element of a decoder's residual stream: fp32 with fp32 weights (also under autocast, which leaves the
    additions and the norms alone) and with QLoRA (`prepare_model_for_kbit_training` makes the embeddings and norms
    fp32); 16-bit where the weights are (LoRA's base, FSDP2's and DeepSpeed's 16-bit compute)."""
    if not _is_mixed(config) or config.load_in_4bit:
        return 4
    return 2 if config.lora or computes_in_16_bit(config) else 4


def decoder_layer_bytes_per_token(config: RunConfig, preset: ModelPreset) -> int:
    """What autograd keeps for backward of one decoder layer, per token — as `benchmarks/saved_tensors.py` listed it
    tensor by tensor on the H100 for llama-3.2-1b and qwen2.5-0.5b (benchmarks/results/h100/llm/saved_tensors.json:
    129,416 and 66,624 B/token under AMP with fp32 weights, 108,808 and 57,536 on a bf16 base; this formula gives
    them within 0.3%). Each RMSNorm keeps its fp32 input and its fp32 normalized value (an fp32 stream: 8h bytes) or
    an fp32 copy of its 16-bit input and its 16-bit normalized value (6h). SDPA keeps q, k, v (the KV heads, not
    repeated) and its output in 16 bits, and an fp32 log-sum-exp per head; the SwiGLU keeps gate, up, activation and
    product. The projections keep their input: autocast casts an fp32 input anew for each projection that reads it
    (q, k, v: three 16-bit copies; gate, up: two); a 16-bit input is shared. In fp32 everything is 4 bytes."""
    h, i = preset.hidden_size, preset.intermediate_size
    q, kv = preset.num_heads * preset.head_dim, preset.kv_heads * preset.head_dim
    log_sum_exp = 4 * preset.num_heads
    if not _is_mixed(config):
        return 2 * 8 * h + 4 * h + 4 * h + 4 * (2 * q + 2 * kv) + log_sum_exp + 4 * 4 * i
    attention, mlp = 2 * (2 * q + 2 * kv) + log_sum_exp, 2 * 4 * i
    if decoder_residual_element_bytes(config) == 4:
        return 2 * 8 * h + 3 * 2 * h + 2 * 2 * h + attention + mlp
    return 2 * 6 * h + 2 * h + 2 * h + attention + mlp


def decoder_activations_bytes(config: RunConfig, preset: ModelPreset) -> tuple[int, int]:
    """(activations, of which logits) of a causal LM at the end of the forward pass, per `benchmarks/saved_tensors.py`
    and the H100 matrix (docs/llm.md): every layer's saved tensors (`decoder_layer_bytes_per_token`) — with
    checkpointing only each layer's input, in the residual stream's dtype — then the final norm (as a layer's), the LM
    head's input (16 bits under mixed precision), the loss's fp32 log-probabilities and the logits the model returns
    (batch × seq × vocab, fp32: accelerate converts a model's outputs to fp32 under mixed precision). Eager attention
    adds its probabilities. Autocast's weight copies are `decoder_weight_casts_bytes`."""
    s, b, h, layers = config.seq_len, config.batch_size, preset.hidden_size, preset.num_layers
    residual = decoder_residual_element_bytes(config)
    if config.grad_checkpointing:
        per_token = layers * residual * h
    else:
        per_token = layers * decoder_layer_bytes_per_token(config, preset)
    final_norm = 8 * h if residual == 4 else 6 * h
    head_input = 2 * h if _is_mixed(config) else 0  # in fp32 the head reads the norm's output, kept already
    per_token += final_norm + head_input
    element = 2 if _is_mixed(config) else 4
    eager = 0 if config.grad_checkpointing or config.attn != "eager" else layers * preset.num_heads * s * s * element
    logits = b * s * preset.vocab_size * 4
    log_probabilities = b * s * preset.vocab_size * 4
    return b * (s * per_token + eager) + logits + log_probabilities, logits


def decoder_weight_casts_bytes(config: RunConfig, preset: ModelPreset, shapes: ParameterShapes) -> int:
    """Autocast's 16-bit copies of fp32 weights that a decoder's forward pass leaves alive: of every matmul weight,
    the LM head's included (with tied embeddings the embedding matrix is cast for the head), without checkpointing;
    with it only the head's (outside the checkpointed layers; the layers' copies are in autocast's cache until the
    forward pass returns). LoRA's 16-bit base and 16-bit compute (FSDP2, ZeRO) make none; QLoRA's fp32 head one.
    Measured: 2,357 MiB on llama-3.2-1b, all 1.24 B parameters' worth; 0.49 GiB with checkpointing."""
    if not _is_mixed(config) or config.liger or computes_in_16_bit(config) or (config.lora and not config.load_in_4bit):
        return 0
    head = 2 * preset.vocab_size * preset.hidden_size
    if config.grad_checkpointing or config.load_in_4bit:
        return head
    return 2 * _matmul_params(shapes) + (head if preset.tie_word_embeddings else 0)


def temporaries_bytes(config: RunConfig, preset: ModelPreset) -> int:
    s, b, h, a = config.seq_len, config.batch_size, preset.hidden_size, preset.num_heads
    c = coefficients(config)
    if config.grad_checkpointing:
        eager_scores = a * s * s * c.eager_recompute_per_score if config.attn == "eager" else 0.0  # one layer's
        recompute = c.recompute_temporaries
        if preset.family == "gpt2":  # one recomputed block: GPT-2's, not BERT's (fitted), with the same backward extra
            recompute += gpt2_layer_bytes_per_token(config, preset) / h - c.activations_per_layer
        return int(b * (s * h * recompute + eager_scores) + c.recompute_constant_bytes)
    return int(b * s * h * c.backward_temporaries)


@dataclass(frozen=True)
class RankState:
    """What one rank holds of the model's state, by distributed technique."""

    weights_bytes: int
    gradients_bytes: int
    gradients_at_peak_bytes: int
    optimizer_state_bytes: int
    communication_buffers_bytes: int
    half_weight_copies_bytes: int
    """AMP's 16-bit copies of the matmul weights, which a model already in 16 bits (DeepSpeed) does not make."""
    gathered_parameters_bytes: int = 0
    """ZeRO-3: the parameters gathered in full and still alive as the forward pass ends (in the activations)."""


def _shard(size: int, ranks: int) -> int:
    return -(-size // ranks)


DEEPSPEED_REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's `reduce_bucket_size` default (gpuanat's config leaves it): the elements of one gradient bucket."""
DEEPSPEED_MAX_LIVE_PARAMETERS = 1_000_000_000
"""DeepSpeed's `stage3_max_live_parameters` default: ZeRO-3 keeps up to this many parameters gathered."""


def deepspeed_bucket_bytes(config: RunConfig) -> int:
    """DeepSpeed's gradient buckets, whole whatever the model's size (`deepspeed/runtime/zero/stage_1_and_2.py`,
    `setup_buckets`; `stage3.py`): ZeRO-1/2 allocate two of `reduce_bucket_size` elements as backward begins (with
    `overlap_comm`, as gpuanat's config sets), ZeRO-3 one at start-up, in the model's dtype. On 2 and 4 H200s
    (bert-large, bf16) the peak exceeded the bands by 2.00 GiB with ZeRO-1/2 (two buckets: 1.86) and by 1.05 GiB
    with ZeRO-3 (one: 0.93)."""
    buckets = 1 if config.distributed == "zero3" else 2
    return buckets * DEEPSPEED_REDUCE_BUCKET_ELEMENTS * (2 if _is_mixed(config) else 4)


def rank_state(config: RunConfig, shapes: ParameterShapes) -> RankState:
    """Weights, gradients and optimizer state on each rank (the ZeRO paper's accounting, as the H200s measured it):
    DDP replicates them and keeps a bucket copy of the gradients; FSDP2 shards all three; DeepSpeed trains a
    16-bit model (with bf16/fp16) whose fp32 master weights count as optimizer state, ZeRO-1/2 sharding the
    optimizer state and keeping a partition of the reduced gradients for the step, ZeRO-3 everything."""
    ranks = config.ranks or 1
    params = shapes.params
    weights, gradients = 4 * params + shapes.buffer_bytes, 4 * params
    optimizer = optimizer_state_bytes(config, shapes)
    accumulating = config.grad_accum > 1
    half_copies = half_weight_copies_bytes(config, shapes)
    if config.lora:  # a frozen base in the run's precision; only the fp32 adapters have gradients and state
        preset = PRESETS[config.preset]
        adapters = lora_shapes(preset, config)
        if config.load_in_4bit:  # QLoRA: NF4 matrices, the rest fp32
            weights = qlora_base_bytes(preset, shapes) + 4 * adapters.params
            half_copies = qlora_head_copy_bytes(config, preset)
        else:
            # the cast to 16 bits takes the decoders' float buffers (rotary frequencies) along; BERT's are integers
            buffers = shapes.buffer_bytes // 2 if _is_mixed(config) and preset.objective == "causal-lm" else \
                shapes.buffer_bytes
            weights = (2 if _is_mixed(config) else 4) * params + 4 * adapters.params + buffers
            half_copies = 0
        gradients, optimizer = 4 * adapters.params, optimizer_state_bytes(config, adapters)
    if config.distributed == "fsdp":  # its gathered parameters are 16-bit already: no autocast copies
        return RankState(_shard(weights, ranks), _shard(gradients, ranks),
                         _shard(gradients, ranks) if accumulating else 0, _shard(optimizer, ranks), 0,
                         0 if computes_in_16_bit(config) else half_copies)
    if config.distributed.startswith("zero"):
        sixteen_bit = _is_mixed(config)
        model_weights = (2 if sixteen_bit else 4) * params + shapes.buffer_bytes
        model_gradients = (2 if sixteen_bit else 4) * params
        state = _shard(optimizer + (4 * params if sixteen_bit else 0), ranks)
        buckets = deepspeed_bucket_bytes(config)
        if config.distributed == "zero3":  # a persistent flat buffer of gradient partitions
            # Parameters reused within `stage3_max_reuse_distance` stay gathered: as the forward pass ends, all of
            # them up to `stage3_max_live_parameters` (measured: the activations 0.63 GiB above ZeRO-1/2's)
            gathered = min(params, DEEPSPEED_MAX_LIVE_PARAMETERS) * (2 if sixteen_bit else 4)
            return RankState(_shard(model_weights, ranks), _shard(model_gradients, ranks),
                             _shard(model_gradients, ranks), state, buckets, 0, gathered)
        # As the ZeRO optimizer's step begins, ZeRO-1 and ZeRO-2 alike hold this rank's 16-bit partition of the
        # reduced gradients (measured on 2 H200s: 0.31 GiB each for bert-large's 0.62), and free it in the step
        partition = _shard(model_gradients, ranks)
        return RankState(model_weights, partition, partition if accumulating else 0, state, buckets, 0)
    buckets = gradients if config.distributed == "ddp" else 0
    return RankState(weights, gradients, gradients if accumulating else 0, optimizer, buckets, half_copies)


def estimate_memory(config: RunConfig) -> MemoryEstimate:
    """One rank's memory (the whole run's on one GPU)."""
    preset = PRESETS[config.preset]
    shapes = parameter_shapes(preset)
    held = rank_state(config, shapes)
    weights, gradients, optimizer = held.weights_bytes, held.gradients_bytes, held.optimizer_state_bytes
    logits = 0
    if preset.objective == "causal-lm" and config.liger:
        # Liger's fused loss holds no vocabulary-sized tensor: the decoder's activations as for a vocabulary of 0,
        # and the gradients the fused loss keeps for backward in their place
        activations = (decoder_activations_bytes(config, dataclasses.replace(preset, vocab_size=0))[0]
                       + liger_kept_bytes(config, preset) + held.half_weight_copies_bytes + CUBLAS_WORKSPACE_BYTES)
    elif preset.objective == "causal-lm":
        activations, logits = decoder_activations_bytes(config, preset)
        activations += decoder_weight_casts_bytes(config, preset, shapes) + CUBLAS_WORKSPACE_BYTES
    else:
        activations = (activations_bytes(config, preset, shapes) - half_weight_copies_bytes(config, shapes)
                       + held.half_weight_copies_bytes)
    activations += held.gathered_parameters_bytes
    # Liger's chunks come and go in the forward pass, before backward's temporaries; QLoRA's dequantized weight
    # exists beside those
    # A causal LM's backward begins with the gradient of the logits, fp32, beside everything the forward kept: on the
    # H100 the peak was that far above the bands at the end of the forward pass (e.g. 3.98 GiB for 3.91 GiB of logits)
    backward_temporaries = logits if preset.objective == "causal-lm" else temporaries_bytes(config, preset)
    temporaries = (max(backward_temporaries + dequantized_weight_bytes(config, preset),
                       liger_transient_bytes(config, preset)) + held.communication_buffers_bytes)
    gradients_at_peak = held.gradients_at_peak_bytes
    forward_end_peak = weights + optimizer + activations + gradients_at_peak + temporaries
    # Late in backward with checkpointing, the kept inputs are mostly freed, but nearly all gradients exist while
    # the first layer is recomputed; then the optimizer step, with its own temporaries: at small batches, the peak.
    step_temporaries = optimizer_step_temporaries_bytes(config, shapes)
    first_step_peak = (weights + gradients + optimizer + CUBLAS_WORKSPACE_BYTES
                       + max(temporaries if config.grad_checkpointing else 0, step_temporaries))
    autocast_cache = autocast_cache_bytes(config, shapes)
    # Only where the accumulated gradients are alive too does this moment exceed the others.
    forward_return_peak = weights + optimizer + activations + gradients_at_peak + autocast_cache
    if config.expandable_segments:
        cache_fraction, moment_fragmentation = EXPANDABLE_SEGMENTS_FRAGMENTATION, 0
    else:
        cache_fraction = coefficients(config).cache_fraction
        moment_fragmentation = int(coefficients(config).moment_fragmentation * large_moment_bytes(config, shapes))
    return MemoryEstimate(
        weights_bytes=weights, gradients_bytes=gradients, optimizer_state_bytes=optimizer,
        activations_bytes=activations, gradients_at_peak_bytes=gradients_at_peak, temporaries_bytes=temporaries,
        autocast_cache_bytes=autocast_cache, step_temporaries_bytes=step_temporaries,
        peak_allocated_bytes=max(forward_end_peak, first_step_peak, forward_return_peak),
        cache_fraction=cache_fraction, moment_fragmentation_bytes=moment_fragmentation,
        communication_buffers_bytes=held.communication_buffers_bytes, ranks=config.ranks or 1,
        distributed=config.distributed, logits_bytes=logits,
    )


SIZE_UNITS = {"b": 1, "kib": 1024, "mib": MIB, "gib": 1024**3, "tib": 1024**4, "k": 1024, "m": MIB,
              "g": 1024**3, "t": 1024**4, "kb": 1000, "mb": 1000**2, "gb": 1000**3, "tb": 1000**4}
MIN_GPU_MEMORY_BYTES = 64 * MIB
"""Below this a size is no GPU's memory: the CUDA context alone takes about 500 MiB. Mostly a forgotten unit."""
MAX_GPU_MEMORY_BYTES = 64 * 1024**4
"""Above this a size is no GPU's memory: the largest today have under 300 GiB."""


def parse_size(text: str) -> int:
    """Bytes of GPU memory from '80GiB', '80G' (binary), '80GB' (decimal) or '81559MiB'. A number without a unit
    is refused (is '24' GiB or bytes?), and so is a size no GPU has."""
    stripped = text.strip().replace(" ", "").lower()
    number = stripped.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = stripped[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if not unit and value > 0:
        raise ValueError(f"give a unit: {number}GiB, {number}G, {number}GB or {int(value * 1024)}MiB")
    if unit not in SIZE_UNITS or value <= 0:
        raise ValueError(f"not a memory size: {text!r} (write e.g. 80GiB, 24G, 40GB or 81559MiB)")
    size = int(value * SIZE_UNITS[unit])
    if not MIN_GPU_MEMORY_BYTES <= size <= MAX_GPU_MEMORY_BYTES:
        raise ValueError(f"{text} is not a GPU's memory: give a size from 64MiB to 64TiB, e.g. 80GiB")
    return size


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
        "temporaries_bytes": estimate.temporaries_bytes,
        "peak_allocated_bytes": estimate.peak_allocated_bytes,
        "peak_reserved_bytes": peak_reserved_bytes(estimate),
        "cuda_context_bytes": cuda_context_bytes(estimate),
        "communication_buffers_bytes": estimate.communication_buffers_bytes,
        "peak_device_bytes": peak_device_bytes(estimate),
        "ranks": estimate.ranks,
        "logits_bytes": estimate.logits_bytes,
        "confidence": "checked" if prediction_caveat(config) is None else "unchecked",
        "caveat": prediction_caveat(config),
    }


MEASURED_DECODER_FAMILIES = ("llama", "qwen2")
"""Decoder families the H100 matrix measured (docs/llm.md): llama-3.2-1b, llama-3.1-8b (QLoRA), qwen2.5-0.5b."""


def prediction_caveat(config: RunConfig) -> str | None:
    """Why not to trust a prediction: what no measurement has checked; None where measurements held it (BERT on the
    H100: docs/memory-model.md; bert-base, gpt2 and the decoders of the H100 matrix: docs/llm.md)."""
    preset = PRESETS[config.preset]
    notes = []
    if preset.objective == "causal-lm":
        if preset.family not in MEASURED_DECODER_FAMILIES:
            notes.append(f"no {preset.family} decoder was measured (its layers are Llama's, so the model applies)")
        if not _is_mixed(config):
            notes.append("decoders were measured in bf16 only")
        if config.attn == "eager":
            notes.append("eager attention was not measured on a decoder")
        if config.load_in_4bit and not config.grad_checkpointing:
            notes.append("QLoRA was measured with checkpointing only (its fp32 residual stream is modelled)")
        if config.liger:
            notes.append("Liger's fused loss was checked on one run (llama-3.2-1b, full: 4.5% low)")
        if config.distributed != "none":
            notes.append("decoders were not measured on several GPUs")
    elif config.lora:
        notes.append("LoRA was measured on decoders only: the adapters are exact, the activations may be off")
    if not notes:
        return None
    return "; ".join(notes) + "; the weights, gradients and optimizer state are exact"


ALLOCATOR_CACHE_MIN_BYTES = 256 * MIB
"""Away from the memory limit the allocator keeps at least this much cached above the peak (median of the
fitted rows: 0.14-0.84 GiB)."""


def peak_reserved_bytes(estimate: MemoryEstimate) -> int:
    """Memory torch's allocator will have reserved at the peak. Away from the memory limit the segments that
    optimizer moments split cost nothing (the allocator just holds more), so only the cache fraction counts."""
    cache = max(estimate.cache_fraction * estimate.peak_allocated_bytes, ALLOCATOR_CACHE_MIN_BYTES)
    return int(estimate.peak_allocated_bytes + cache)


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
    allocatable = gpu_memory_bytes - DRIVER_RESERVED_BYTES - cuda_context_bytes(estimate)
    return estimate.peak_allocated_bytes + fragmentation_bytes(estimate) <= allocatable


def max_batch_caveat(config: RunConfig) -> str | None:
    """Why not to trust `max_batch_size` for this configuration, where the H100's trials refuted it."""
    if not (_is_mixed(config) and config.grad_checkpointing):
        return None
    if config.expandable_segments and config.optim in ("adamw_torch", "adamw_torch_fused", "adamw_bnb_8bit"):
        return ("with expandable segments, mixed precision, checkpointing and this optimizer, an H100 ran out of "
                "memory at this prediction (bf16 20 MB short, and 8 fewer trained); `gpuanat fit` finds the real one")
    if not config.expandable_segments and config.optim in ("adafactor", "adamw_bnb_8bit"):
        return ("with mixed precision, checkpointing and this optimizer the allocator's fragmentation near the limit "
                "is not predicted: on an H100 this prediction ran out of memory; `gpuanat fit` finds the real one, "
                "and --expandable-segments fits a larger batch")
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
