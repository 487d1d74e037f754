"""The activations kept from the forward pass to the backward pass, and the temporaries above them, per model
family (no torch).

The classifiers (BERT, GPT-2) from the coefficients fitted on bert-large (`precision`), GPT-2's blocks as autograd
saves them; the decoders (Llama, Qwen2, Mistral) tensor by tensor as `benchmarks/saved_tensors.py` listed them on
the H100, with their logits; Liger's fused loss, which keeps gradients in the logits' place; and the cuBLAS
workspaces.
"""

from __future__ import annotations

from gpuanat.core.memory.architecture import Architecture
from gpuanat.core.memory.bands.decoder_layers import (
    eager_scores_bytes,
    layer_bytes_per_token,
    outside_layers_bytes_per_token,
    residual_element_bytes,
    wrapped_expert_gradient_bytes,
    wrapped_expert_weights_bytes,
)
from gpuanat.core.memory.bands.precision import (
    autocast_on,
    coefficients,
    is_mixed,
    parameter_element_bytes,
    without_autocast_in_16_bit,
)
from gpuanat.core.memory.bands.weights import half_weight_copies_bytes
from gpuanat.core.memory.shapes import (
    ParameterShapes,
    as_architecture,
    attention_linears,
    layer_linears,
    lora_adapted_inputs_per_layer,
)
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.presets import ModelPreset

CUBLAS_WORKSPACE_BYTES = 72_702_916
"""cuBLAS/cuBLASLt workspaces, allocated through torch's allocator at the first matmul and kept:
allocated memory after a step minus weights and optimizer state, median of the fitted rows."""


def autocast_extra_bytes_per_token_hidden(preset: Architecture | ModelPreset) -> int:
    """What autocast saves for backward beyond a model computing in 16 bits, per token and hidden unit and layer:
    it casts an fp32 activation anew for each linear that reads it (BERT's separate query, key and value: two 16-bit
    copies more than one; GPT-2's fused c_attn: none), and the LayerNorms (two a layer) run in fp32 on the fp32
    residual stream, so their saved inputs take 4 bytes, not 2. BERT: 2 × 2 + 2 × 2 = 8 of the 42.29 fitted under
    autocast, leaving 34.3 — which the 6.50 GiB measured with FSDP and ZeRO reproduce within 1%."""
    extra_input_copies = 0 if as_architecture(preset).fused_qkv else 2
    return 2 * extra_input_copies + 2 * 2


BERT_LARGE_LAYERS = 24
"""The layers of the model the BERT coefficients were fitted on."""


def gpt2_layer_bytes_per_token(config: RunConfig, preset: Architecture | ModelPreset) -> int:
    """What autograd keeps of one GPT-2 block per token, as `benchmarks/saved_tensors.py` listed it on the H100 (gpt2,
    bf16 autocast: 69,184 B/token = 26h + 16i + 64): the two LayerNorms' fp32 inputs (autocast runs them in fp32:
    8h), the 16-bit casts c_attn and c_fc read (4h), the attention's 16-bit q, k, v, output and c_attn's output (12h),
    two dropout masks (2h), and GPT-2's tanh GELU, whose `pow` autocast runs in fp32: three fp32 intermediates (12i)
    beside its 16-bit input and the 16-bit cast c_proj reads (4i) — the reason the BERT coefficients, which know
    nothing of it, were 31-49% low for gpt2. In fp32 (not measured) the same tensors at 4 bytes: 42h + 20i."""
    h, i = preset.hidden_size, preset.intermediate_size
    statistics = 4 * preset.num_heads + 16  # SDPA's log-sum-exp, the LayerNorms' means and deviations
    if is_mixed(config):
        return 26 * h + 16 * i + statistics
    return 42 * h + 20 * i + statistics


def activations_bytes(config: RunConfig, preset: Architecture | ModelPreset, shapes: ParameterShapes) -> int:
    s, b, h, a, layers = config.seq_len, config.batch_size, preset.hidden_size, preset.num_heads, preset.num_layers
    c = coefficients(config)
    eager_scores = a * s * s * c.eager_per_score if config.attn == "eager" else 0.0
    if config.grad_checkpointing:
        # Each layer's input is kept (the residual stream: fp32 under autocast, 16-bit without; with bf16 weights HF
        # Trainer still runs autocast, whose fp32 LayerNorms and per-linear casts keep what they keep for fp32 weights:
        # roberta-base and distilbert-base on the H100, docs/any-model.md), plus what is outside
        # the layers; the fitted coefficient is bert-large's, 24 layers, so it is split: 4 bytes a layer, the rest once.
        residual = 2 if without_autocast_in_16_bit(config) else 4
        per_sample = s * h * (layers * residual + c.checkpointed - BERT_LARGE_LAYERS * 4)
        per_sample += s * layers * selective_saved_bytes_per_token(config, as_architecture(preset))
    elif preset.family == "gpt2":
        per_sample = layers * (s * gpt2_layer_bytes_per_token(config, preset) + eager_scores) + s * 7 * h
    else:
        per_token_hidden = c.activations_per_layer - (
            autocast_extra_bytes_per_token_hidden(preset) if without_autocast_in_16_bit(config) else 0
        )
        per_sample = layers * (s * h * per_token_hidden + eager_scores)
    per_sample += s * lora_dropout_bytes_per_token(config, preset) * (1 if config.grad_checkpointing else layers)
    return int(b * per_sample) + half_weight_copies_bytes(config, shapes) + CUBLAS_WORKSPACE_BYTES


def selective_saved_bytes_per_token(config: RunConfig, arch: Architecture) -> int:
    """What selective checkpointing keeps of one layer beyond its input, per token: the outputs of the matmuls and
    fused attention its policy sees, in the compute dtype, and attention's log-sum-exp (fp32 a head); 0 without it.
    Eager, every linear layer's output. With compiled regions the policy sees only what runs outside them — the
    attention's input projections and SDPA — and each compiled region is recomputed whole (bert-large, pure bf16,
    on the H100: 19.13 GiB at batch 128 and 36.29 at 256 measured, benchmarks/results/h100/tune54/selective.jsonl)."""
    if not (config.grad_checkpointing and config.selective_checkpointing):
        return 0
    linears = attention_linears(arch)[:-1] if config.compile_regions else layer_linears(arch)
    outputs = sum(rows for _, (rows, _columns) in linears) + arch.query_width
    return outputs * (2 if is_mixed(config) else 4) + 4 * arch.num_heads


def lora_dropout_bytes_per_token(config: RunConfig, preset: Architecture | ModelPreset) -> int:
    """What LoRA's dropout adds to one layer's saved tensors, per token: its mask, a byte an input element of every
    adapted projection, and without mixed precision the dropped copy of the input too (4 bytes), which the adapter
    then keeps in place of the input it shared with the base layer. Under mixed precision the adapter keeps a 16-bit
    cast of its input with or without dropout, so the mask is all (llama-3.2-1b and qwen2.5-0.5b, seq 1024, batch 4,
    on the H100: +1,256 and +954.5 MiB measured, 1,280 and 960 MiB this way)."""
    if not (config.lora and config.lora_dropout):
        return 0
    return lora_adapted_inputs_per_layer(preset, config) * (1 if is_mixed(config) else 1 + 4)


def logits_element_bytes(config: RunConfig) -> int:
    """Bytes per element of the logits a causal LM returns: fp32 (accelerate converts a model's outputs to fp32
    under autocast), 16-bit where FSDP2 or DeepSpeed compute in 16 bits, autocast off."""
    return 2 if without_autocast_in_16_bit(config) else 4


def decoder_activations_bytes(config: RunConfig, model: Architecture | ModelPreset) -> tuple[int, int]:
    """(activations, of which logits) of a causal LM at the end of the forward pass, per `benchmarks/saved_tensors.py`
    and the H100 matrix (docs/llm.md): every layer's saved tensors (`decoder_layers.layer_bytes_per_token`) — with
    checkpointing only each layer's input, in the residual stream's dtype — then what the embeddings' side, the final
    norm and the LM head's input keep, the loss's fp32 log-probabilities and the logits the model returns
    (batch × seq × vocab, fp32: accelerate converts a model's outputs to fp32 under autocast; 16-bit where FSDP2 or
    DeepSpeed compute in 16 bits, autocast off, the loss upcasting a copy it does not keep: on 2 H200s llama-3.1-8b's
    were 0.24 GiB at seq 1024, and the activations fell by that much per 1,024 tokens under both), with Gemma's
    soft-capping its tanh. Eager attention adds its probabilities, a sliding window its boolean mask (one for all
    layers), Falcon its float mask where its attention keeps it (`Architecture.materialized_mask_heads`), LoRA on
    experts PEFT wraps their merged weights (`wrapped_expert_weights_bytes`, per MoE layer; with checkpointing the
    recomputed layer's, in backward). Autocast's weight copies are `decoder_weight_casts_bytes`."""
    arch = as_architecture(model)
    s, b, h, layers = config.seq_len, config.batch_size, arch.hidden_size, arch.num_layers
    masks = lora_dropout_bytes_per_token(config, arch)
    if config.grad_checkpointing:  # LoRA dropout's masks: the recomputed layer's (not measured)
        per_token = layers * (residual_element_bytes(config) * h + selective_saved_bytes_per_token(config, arch))
        per_token += masks
    else:
        per_token = (
            arch.dense_layers * layer_bytes_per_token(config, arch)
            + arch.moe_layers * layer_bytes_per_token(config, arch, moe=True)
            + layers * masks
        )
    per_token += outside_layers_bytes_per_token(config, arch)
    eager = 0 if config.grad_checkpointing else layers * arch.num_heads * s * s * eager_scores_bytes(config, arch)
    sliding_mask = s * s if arch.sliding_window_layers and not config.grad_checkpointing else 0
    falcon_mask = s * s * arch.materialized_mask_heads * falcon_mask_bytes_per_score(config, arch)
    logits = b * s * arch.vocab_size * logits_element_bytes(config)
    log_probabilities = b * s * arch.vocab_size * 4
    softcapping = b * s * arch.vocab_size * (2 if is_mixed(config) else 4) if arch.final_logit_softcapping else 0
    merged = 0 if config.grad_checkpointing else arch.moe_layers * wrapped_expert_weights_bytes(config, arch)
    per_sample = s * per_token + eager + sliding_mask + falcon_mask
    return b * per_sample + logits + log_probabilities + softcapping + merged, logits


def wrapped_expert_backward_bytes(config: RunConfig, arch: Architecture) -> int:
    """What the backward of the last MoE layer holds beyond what the forward pass kept, where PEFT wraps its experts
    (0 elsewhere): the merged weight's gradient (`wrapped_expert_gradient_bytes`) and, with checkpointing, the layer's
    recomputed tensors. The loss's fp32 log-probabilities are freed by then (the caller takes them off)."""
    transient = wrapped_expert_gradient_bytes(config, arch)
    if transient and config.grad_checkpointing:
        transient += config.batch_size * config.seq_len * layer_bytes_per_token(config, arch, moe=True)
    return transient


def falcon_mask_bytes_per_score(config: RunConfig, arch: Architecture) -> int:
    """What Falcon's materialized float mask (`Architecture.materialized_mask_heads` × seq² a sequence, built in the
    embeddings' dtype) keeps, per score: the fused SDPA kernel saves the mask it reads, none where the attention is
    eager or torch's math attention (multi-query: it adds the mask, which keeps nothing). Built in fp32 under autocast
    (fp32 weights), SDPA's autocast casts it to 16 bits in every layer — a cast of a tensor that needs no gradient,
    which autocast does not cache — so each layer keeps its own 16-bit copy (falcon-rw-1b on the H100, AMP, seq 1024:
    24 layers × 32 heads × 2 bytes = 6 GiB at batch 4). With checkpointing the layer's inputs keep the one mask."""
    if config.grad_checkpointing:
        return residual_element_bytes(config)
    if config.attn == "eager" or arch.kv_broadcast_to_heads:
        return 0
    if autocast_on(config) and residual_element_bytes(config) == 4:
        return arch.num_layers * 2
    return residual_element_bytes(config)


def checkpointed_math_attention_bytes(config: RunConfig, arch: Architecture) -> int:
    """With checkpointing, what a layer whose attention is torch's math attention (Falcon's multi-query layers under
    SDPA) holds while backward recomputes it, above the weights, gradients and optimizer state: the recomputed
    layer's saved tensors, its fp32 probabilities among them, and the softmax's backward beside them, the gradient
    of the probabilities and of the scores, two more fp32 score-sized tensors (the same code on the CPU, where
    `_softmax_backward_data` is the peak). With full fine-tuning the moment is the first layer's, every gradient
    made; with LoRA the last layer's, which comes first, every layer's kept input beside it. The H100 held about
    0.2 GiB a sequence more (falcon-7b-8l, seq 1024: 4.89 GiB above the weights, gradients, optimizer state and
    cuBLAS's workspaces at batch 4, this 3.99), which the code read here does not show; `predict` says so."""
    if not (config.grad_checkpointing and arch.kv_broadcast_to_heads and config.attn != "eager"):
        return 0
    s, b = config.seq_len, config.batch_size
    scores = arch.num_heads * s * s * eager_scores_bytes(config, arch)
    recomputed = s * layer_bytes_per_token(config, arch) + 3 * scores
    kept_inputs = s * arch.num_layers * residual_element_bytes(config) * arch.hidden_size if config.lora else 0
    return b * (recomputed + kept_inputs)


def temporaries_bytes(config: RunConfig, preset: Architecture | ModelPreset) -> int:
    s, b, h, a = config.seq_len, config.batch_size, preset.hidden_size, preset.num_heads
    c = coefficients(config)
    if config.grad_checkpointing:
        eager_scores = a * s * s * c.eager_recompute_per_score if config.attn == "eager" else 0.0  # one layer's
        recompute = c.recompute_temporaries
        if preset.family == "gpt2":  # one recomputed block: GPT-2's, not BERT's (fitted), with the same backward extra
            recompute += gpt2_layer_bytes_per_token(config, preset) / h - c.activations_per_layer
        return int(b * (s * h * recompute + eager_scores) + c.recompute_constant_bytes)
    return int(b * s * h * c.backward_temporaries)


def _lm_head_input_element_bytes(config: RunConfig) -> int:
    """Bytes per element of the hidden states the LM head reads: the final norm's output, 16-bit on LoRA's 16-bit
    base, else fp32 (fp32 weights, also under autocast, which leaves norms alone; QLoRA's norms are fp32)."""
    return 2 if config.lora and not config.load_in_4bit and is_mixed(config) else 4


def liger_chunk_tokens(config: RunConfig, preset: Architecture | ModelPreset) -> int:
    """Tokens per chunk of Liger's fused linear cross-entropy (liger-kernel 0.8 `fused_linear_cross_entropy_forward`,
    `chunk_mem_const` 1): the b·s tokens split so one chunk's logits are about as large as the hidden states,
    ceil(V / h) chunks, the chunk rounded up to a power of two, at most b·s."""
    tokens = config.batch_size * config.seq_len
    chunks = -(-preset.vocab_size // preset.hidden_size)
    return min(1 << max(0, (-(-tokens // chunks) - 1).bit_length()), tokens)


def liger_kept_bytes(config: RunConfig, preset: Architecture | ModelPreset) -> int:
    """What Liger's fused linear cross-entropy keeps from the forward pass to the backward pass, in place of the
    logits and the loss's log-probabilities: it computes the gradients in the forward pass and saves them — the
    hidden states' (b·s·h, their dtype), and, where the LM head trains (no LoRA), the head's (V·h, in the head's
    dtype: `zeros_like(weight)`, bf16 for a model held in bf16)."""
    hidden = config.batch_size * config.seq_len * preset.hidden_size * _lm_head_input_element_bytes(config)
    head = 0 if config.lora else parameter_element_bytes(config) * preset.vocab_size * preset.hidden_size
    return hidden + head


def liger_transient_bytes(config: RunConfig, preset: Architecture | ModelPreset) -> int:
    """What Liger's fused loss allocates and frees again inside the forward pass, above what it keeps: the per-token
    fp32 losses, one chunk's logits (16-bit under autocast, else fp32) and its hidden-state gradient (fp32 at most),
    and, where the LM head is fp32 under autocast, the 16-bit casts of the head that a chunk's matmuls make: one at a
    time for QLoRA's frozen fp32 head; two for a trained fp32 head (fp32 weights), whose memory snapshot on the H100
    shows both alive at the peak, the logits matmul's and the hidden-state gradient's (liger-kernel 0.8.5)."""
    if not config.liger:
        return 0
    chunk = liger_chunk_tokens(config, preset)
    logits_element = 2 if is_mixed(config) else 4
    trained_fp32_head = not config.lora and parameter_element_bytes(config) == 4
    head_casts = 2 if trained_fp32_head else 1 if config.load_in_4bit else 0
    head_cast = head_casts * 2 * preset.vocab_size * preset.hidden_size if is_mixed(config) else 0
    return (
        4 * config.batch_size * config.seq_len
        + chunk * preset.vocab_size * logits_element
        + chunk * preset.hidden_size * 4
        + head_cast
    )
