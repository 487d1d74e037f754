"""What a model is, for the bytes model: the one place where a model's architecture is turned into parameter shapes
and the per-layer sizes the bands use (no torch).

From a preset's dimensions (`ModelPreset`): every parameter tensor of the model as gpuanat trains it (a 2-label
classifier, or a decoder's causal LM), which of them are the embeddings, its buffers; one decoder layer's linear
projections and their module names; the LoRA adapters PEFT adds to them; and the matrices QLoRA holds in 4 bits.
The bands (`weights`, `optimizer`, `activations`, `parallel`) read a model only through these and the preset's
dimensions, so a model that is no preset (a Hugging Face config.json) is taught to the bytes model here.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuanat.core.run.config import RunConfig
from gpuanat.core.run.presets import ModelPreset

NUM_LABELS = 2


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


def _adapted_layer_linears(preset: ModelPreset, config: RunConfig) -> list[tuple[int, int]]:
    """(out, in) of the linear layers LoRA adapts in one layer: for decoders exactly as PEFT picks them
    ("all-linear": every projection but the LM head), for the classifiers an estimate, their non-embedding matrices
    spread over the layers (PEFT also trains a copy of their head)."""
    if preset.objective == "causal-lm":
        wanted = (set(DECODER_LINEAR_NAMES) if config.lora_targets == "all-linear"
                  else {name.strip() for name in config.lora_targets.split(",")})
        return [shape for name, shape in zip(DECODER_LINEAR_NAMES, decoder_linear_shapes(preset), strict=True)
                if name in wanted]
    full = parameter_shapes(preset)
    return list(full.matrices[full.embedding_tensors:])


def lora_shapes(preset: ModelPreset, config: RunConfig) -> ParameterShapes:
    """The LoRA adapters' parameters: A (rank × in) and B (out × rank) on each adapted linear layer."""
    rank = config.lora
    targeted = (_adapted_layer_linears(preset, config) * preset.num_layers if preset.objective == "causal-lm"
                else _adapted_layer_linears(preset, config))
    matrices = [shape for out, inp in targeted for shape in ((rank, inp), (out, rank))]
    return ParameterShapes(params=sum(r * c for r, c in matrices), tensors=len(matrices), matrices=tuple(matrices),
                           vectors=(), embedding_params=0, embedding_tensors=0, buffer_bytes=0)


def lora_adapted_inputs_per_layer(preset: ModelPreset, config: RunConfig) -> int:
    """Σ in_features of the projections LoRA adapts in one layer (the classifiers' estimate: per layer on average)."""
    inputs = sum(inp for _, inp in _adapted_layer_linears(preset, config))
    return inputs if preset.objective == "causal-lm" else inputs // preset.num_layers


def quantized_matrices(preset: ModelPreset) -> list[tuple[int, int]]:
    """The matrices QLoRA holds in 4 bits: every linear layer of a decoder's layers. Transformers keeps the output
    embeddings (the LM head, tied or not) and the input embeddings, which are no linear layers, out."""
    return decoder_linear_shapes(preset) * preset.num_layers
