"""The weights' other forms (no torch): the 16-bit copies autocast makes of fp32 weights, and a QLoRA base's 4-bit
weights. The fp32 weights themselves, 4 B/param, are `parallel.rank_state`'s.

AMP's half-precision copies of the matmul weights (2 B/param, not the embeddings), held from the
forward pass to the backward pass unless activations are checkpointed; with checkpointing, autocast's
cache still holds all of them until the forward pass ends; a decoder's casts, its LM head's included. QLoRA's
base: its NF4 matrices with their quantization state and every other parameter in fp32; the 16-bit copy autocast
makes of its fp32 LM head; and the weight bitsandbytes dequantizes for each matmul.
"""

from __future__ import annotations

from gpuanat.core.memory.architecture import Architecture
from gpuanat.core.memory.bands.precision import autocast_on, computes_in_16_bit, is_mixed, parameter_element_bytes
from gpuanat.core.memory.shapes import ParameterShapes, as_architecture, expert_params, quantized_matrices
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.presets import ModelPreset

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


def qlora_base_bytes(preset: Architecture | ModelPreset, shapes: ParameterShapes) -> int:
    """A QLoRA base's weights as training starts: the NF4 matrices with their quantization state
    (`nf4_weight_bytes`), and every other parameter — embeddings, LM head, norms, biases — in fp32, to which PEFT's
    `prepare_model_for_kbit_training` (peft 0.14-0.21) casts every 16-bit parameter that is not a `Params4bit`. The
    rotary frequencies stay the fp32 buffers the model was built with (a buffer is no parameter)."""
    quantized = quantized_matrices(preset)
    quantized_params = sum(rows * cols for rows, cols in quantized)
    return (
        sum(nf4_weight_bytes(rows * cols) for rows, cols in quantized)
        + 4 * (shapes.params - quantized_params)
        + shapes.buffer_bytes
    )


def qlora_head_copy_bytes(config: RunConfig, preset: Architecture | ModelPreset) -> int:
    """Under mixed precision, the 16-bit copy autocast makes of a QLoRA model's fp32 LM head for its matmul, saved
    for backward (the head is frozen, so autocast's cache does not keep it; the matmul's saved weight does). With
    Liger the head's weight is cast inside the fused loss, chunk by chunk, and not saved (`liger_transient_bytes`)."""
    if not (config.load_in_4bit and is_mixed(config)) or config.liger:
        return 0
    return 2 * preset.vocab_size * preset.hidden_size


def dequantized_weight_bytes(config: RunConfig, preset: Architecture | ModelPreset) -> int:
    """With QLoRA, bitsandbytes' 4-bit matmul in training dequantizes its weight to the 16-bit compute dtype for
    each matmul, forward and backward, and frees it after (`MatMul4Bit`): one matrix at a time, the largest."""
    if not config.load_in_4bit:
        return 0
    return 2 * max(rows * cols for rows, cols in quantized_matrices(preset))


def half_weight_copies_bytes(config: RunConfig, shapes: ParameterShapes) -> int:
    """AMP casts each matmul weight to 16 bits once per forward and keeps the copy for backward
    (autocast's cache); with checkpointing backward recomputes them per layer (`autocast_cache_bytes`)."""
    if not is_mixed(config) or config.grad_checkpointing or config.lora or config.weights_dtype != "fp32":
        return 0  # a LoRA base or a bf16 model is 16-bit already
    return 2 * _matmul_params(shapes)


def autocast_cache_bytes(config: RunConfig, shapes: ParameterShapes) -> int:
    """With AMP and checkpointing, the half-precision copy of every matmul weight stays in autocast's cache
    until the forward pass ends: the cache caches casts of leaf tensors that require grad, and is emptied
    when the outermost autocast exits, which accelerate's forward wrapper does as the forward returns, just
    before the end-of-forward hooks run. So the copies are not in the probe's activations, and backward
    (which recomputes each layer, casting again) does not hold them. Without checkpointing they are kept for
    backward anyway (`half_weight_copies_bytes`)."""
    if not autocast_on(config) or not config.grad_checkpointing or config.lora or config.weights_dtype != "fp32":
        return 0  # (FSDP2 and DeepSpeed compute in 16 bits without autocast: no cache)
    return 2 * _matmul_params(shapes)


def _matmul_params(shapes: ParameterShapes) -> int:
    return sum(rows * cols for rows, cols in shapes.matrices[shapes.embedding_tensors :])


def decoder_weight_casts_bytes(config: RunConfig, preset: Architecture | ModelPreset, shapes: ParameterShapes) -> int:
    """Autocast's 16-bit copies of fp32 weights that a decoder's forward pass leaves alive: of every matmul weight,
    the LM head's included (with tied embeddings the embedding matrix is cast for the head), without checkpointing;
    with it only the head's (outside the checkpointed layers; the layers' copies are in autocast's cache until the
    forward pass returns). LoRA's 16-bit base and 16-bit compute (FSDP2, ZeRO) make none; QLoRA's fp32 head one.
    Measured: 2,357 MiB on llama-3.2-1b, all 1.24 B parameters' worth; 0.49 GiB with checkpointing."""
    if not is_mixed(config) or config.liger or computes_in_16_bit(config) or (config.lora and not config.load_in_4bit):
        return 0
    arch = as_architecture(preset)
    head = 2 * arch.vocab_size * arch.embedding_width
    if config.grad_checkpointing or config.load_in_4bit:
        return head
    # a mixture of experts' weights are not cast: transformers' grouped matmul is no autocast operation
    return 2 * (_matmul_params(shapes) - expert_params(arch)) + (head if arch.tie_word_embeddings else 0)


def tied_embedding_gradient_bytes(config: RunConfig, preset: Architecture | ModelPreset) -> int:
    """What the gradient of a causal LM's tied embedding adds as the backward pass ends, beside every gradient: the
    LM head's gradient of the shared weight waits in autograd's input buffer for the embedding's (vocabulary × width,
    the weight's dtype), which arrives last and is added to it. Under autocast with fp32 weights the head's gradient
    comes out of the cast's backward, a fresh tensor, and the embedding's is added to it in place: one more
    vocabulary-sized tensor. Where the head's matmul ran in the weight's own dtype (bf16 weights, fp32) the buffer adds
    them out of place (`aten::add`): the sum beside both, two more. On the H100 command-r7b-4l (256,000 × 4,096)
    peaked 3.91 GiB above weights, gradients, optimizer state and cuBLAS's workspaces at batch 1, fp32 under AMP and
    bf16 weights alike. Frozen embeddings (LoRA, QLoRA) have none; Liger's fused loss and several ranks were not
    measured."""
    arch = as_architecture(preset)
    if not (
        arch.tie_word_embeddings
        and arch.objective == "causal-lm"
        and config.distributed == "none"
        and not (config.lora or config.load_in_4bit or config.liger)
    ):
        return 0
    element_bytes = parameter_element_bytes(config)
    copies = 1 if autocast_on(config) and element_bytes == 4 else 2
    return copies * element_bytes * arch.vocab_size * arch.embedding_width
