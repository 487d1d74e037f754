"""What a model is, for the bytes model: the one place where a model's architecture (`Architecture`, read from a
config.json or a preset the same way) is turned into parameter shapes and the per-layer sizes the bands use (no torch).

Every parameter tensor of the model as gpuanat trains it (a 2-label classifier, or a decoder's causal LM), which of
them are the embeddings, its buffers; one layer's linear projections and their module names; the LoRA adapters PEFT
adds to them; and the matrices QLoRA holds in 4 bits. The bands (`weights`, `optimizer`, `activations`, `parallel`)
read a model only through these and the architecture's dimensions.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuanat.core.memory.architecture import Architecture
from gpuanat.core.memory.families import MODULE_NAMES
from gpuanat.core.memory.model_config import preset_architecture
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.presets import ModelPreset

NUM_LABELS = 2


def as_architecture(model: Architecture | ModelPreset) -> Architecture:
    """A preset is read as the config transformers would write for it."""
    return model if isinstance(model, Architecture) else preset_architecture(model)


@dataclass(frozen=True)
class ParameterShapes:
    params: int
    tensors: int
    matrices: tuple[tuple[int, int], ...]
    """Every 2-D parameter's shape (a mixture of experts' 3-D weights as (experts × rows, columns))."""
    vectors: tuple[int, ...]
    """Every 1-D parameter's length."""
    embedding_params: int
    embedding_tensors: int
    """The first `embedding_tensors` of `matrices` are the embeddings."""
    buffer_bytes: int


_DEFAULT_NAMES = {
    "q": "q_proj",
    "k": "k_proj",
    "v": "v_proj",
    "qkv": "qkv_proj",
    "o": "o_proj",
    "gate": "gate_proj",
    "up": "up_proj",
    "gate_up": "gate_up_proj",
    "down": "down_proj",
    "fc1": "fc1",
    "fc2": "fc2",
}


def _named(arch: Architecture, roles: list[tuple[str, tuple[int, int]]]) -> list[tuple[str, tuple[int, int]]]:
    names = {**_DEFAULT_NAMES, **MODULE_NAMES.get(arch.family, {})}
    return [(names[role], shape) for role, shape in roles]


def attention_linears(arch: Architecture) -> list[tuple[str, tuple[int, int]]]:
    """(module name, (out, in)) of one layer's attention projections: q, k, v (or one fused), then the output."""
    h, q, kv = arch.hidden_size, arch.query_width, arch.kv_width
    qkv = [("qkv", (q + 2 * kv, h))] if arch.fused_qkv else [("q", (q, h)), ("k", (kv, h)), ("v", (kv, h))]
    return _named(arch, [*qkv, ("o", (h, q))])


def gated_mlp_linears(arch: Architecture, width: int, fused: bool = False) -> list[tuple[str, tuple[int, int]]]:
    h = arch.hidden_size
    up = [("gate_up", (2 * width, h))] if fused else [("gate", (width, h)), ("up", (width, h))]
    return _named(arch, [*up, ("down", (h, width))])


def mlp_linears(arch: Architecture) -> list[tuple[str, tuple[int, int]]]:
    """(module name, (out, in)) of a dense layer's MLP: gate and up (or one fused) and down, or fc1 and fc2."""
    h, i = arch.hidden_size, arch.intermediate_size
    if arch.gated_mlp:
        return gated_mlp_linears(arch, i, arch.fused_gate_up)
    return _named(arch, [("fc1", (i, h)), ("fc2", (h, i))])


def layer_linears(arch: Architecture, moe: bool = False) -> list[tuple[str, tuple[int, int]]]:
    """The linear layers (nn.Linear) of one layer, which LoRA's "all-linear" adapts and QLoRA quantizes: a mixture of
    experts' layer has its attention's and its shared expert's (the experts are 3-D weights, the router neither)."""
    if not moe:
        return attention_linears(arch) + mlp_linears(arch)
    shared = (
        gated_mlp_linears(arch, arch.shared_expert_intermediate_size) if arch.shared_expert_intermediate_size else []
    )
    if arch.shared_expert_gate:
        shared.append(("shared_expert_gate", (1, arch.hidden_size)))
    return attention_linears(arch) + shared


def model_linears(arch: Architecture) -> list[tuple[str, tuple[int, int]]]:
    """Linear layers outside the layers but the LM head: OPT's projections into and out of a narrower embedding."""
    if arch.embedding_size and arch.objective == "causal-lm":
        return [
            ("project_in", (arch.hidden_size, arch.embedding_size)),
            ("project_out", (arch.embedding_size, arch.hidden_size)),
        ]
    return []


_QWEN2_MOE_V4_NAMES = {"gate": "router", "gate_proj": "gate_up", "up_proj": "gate_up", "down_proj": "down"}
PEFT_EXPERT_PARAMETERS: dict[str, dict[str, str]] = {
    "mixtral": {"gate": "router", "w1": "gate_up", "w3": "gate_up", "w2": "down"},
    "qwen3_moe": _QWEN2_MOE_V4_NAMES,
    "olmoe": _QWEN2_MOE_V4_NAMES,
}
"""The families whose router and experts PEFT adapts as parameters, and which v4 module name stands for which of them
("router": the router's weight; "gate_up", "down": the experts' 3-D weights). transformers 5 fused each family's
per-expert linear layers into 3-D parameters and made its router a module of its own; PEFT (0.21.0-0.21.2,
`utils/transformers_weight_conversion._convert_peft_config_moe`) converts a LoRA config for the families whose
weights transformers converts from v4 (`conversion_mapping._MODEL_TO_CONVERSION_PATTERN`, 5.17-5.24: Mixtral's own,
and Qwen2-MoE's pattern, which Qwen3-MoE and OLMoE use — Qwen2-MoE itself is not listed, so it is not converted):
"all-linear" (or a list naming them) targets the v4 names, which become `target_parameters` — a `ParamWrapper` on
the router's weight and on each of the experts' two weights, gate-up at twice the rank (PEFT's `rank_pattern`: two
v4 matrices fused) — and leave `target_modules`, so a dense layer's MLP of the same names is not adapted either.
GraniteMoE's and Qwen2-MoE's routers and experts (and a shared expert's linear layers, which "all-linear" adapts)
stay as the other families' are."""


def lora_target_names(arch: Architecture, config: RunConfig) -> set[str]:
    """The module names of the linear layers LoRA adapts, as PEFT picks them: "all-linear", every one but the LM head
    (a mixture of experts' 3-D expert weights and its router are no linear layers here); else those named. Where PEFT
    adapts a family's experts as parameters (`PEFT_EXPERT_PARAMETERS`), their v4 names are not modules'."""
    names = {name for moe in (False, True) for name, _ in layer_linears(arch, moe)}
    names |= {name for name, _ in model_linears(arch)}
    if config.lora_targets != "all-linear":
        names &= {name.strip() for name in config.lora_targets.split(",")}
    return names - PEFT_EXPERT_PARAMETERS.get(arch.family, {}).keys() if arch.moe_layers else names


def lora_expert_parameters(arch: Architecture, config: RunConfig) -> set[str]:
    """Which of a mixture of experts' parameters LoRA adapts through PEFT's `ParamWrapper` ("router", "gate_up",
    "down"; `PEFT_EXPERT_PARAMETERS`): with "all-linear" all three; else those whose v4 names are listed."""
    v4_names = PEFT_EXPERT_PARAMETERS.get(arch.family, {})
    if not (config.lora and arch.moe_layers and v4_names):
        return set()
    if config.lora_targets == "all-linear":
        return set(v4_names.values())
    listed = {name.strip() for name in config.lora_targets.split(",")}
    # gate-up only with both its v4 names (PEFT refuses to adapt half of a fused weight)
    return {part for part in set(v4_names.values()) if all(n in listed for n, p in v4_names.items() if p == part)}


def lora_expert_matrices(arch: Architecture, config: RunConfig) -> dict[str, list[tuple[int, int]]]:
    """The adapters PEFT's `ParamWrapper` adds to one MoE layer, by parameter: lora_A (rank·experts × in) and lora_B
    (out × rank·experts) of each 3-D expert weight (gate-up at twice the rank), lora_A and lora_B of the router's."""
    rank, e, h, width = config.lora, arch.experts, arch.hidden_size, arch.expert_intermediate_size
    shapes = {
        "router": [(rank, h), (e, rank)],
        "gate_up": [(2 * rank * e, h), (2 * width, 2 * rank * e)],
        "down": [(rank * e, width), (h, rank * e)],
    }
    return {name: shapes[name] for name in sorted(lora_expert_parameters(arch, config))}


def expert_params(arch: Architecture) -> int:
    """The parameters of a mixture of experts' expert weights (3-D, used by transformers' grouped matmul)."""
    return arch.moe_layers * arch.experts * 3 * arch.expert_intermediate_size * arch.hidden_size


def _norm_vectors(arch: Architecture, width: int, count: int, kind: str | None = None) -> list[int]:
    kind = kind or arch.norm
    per_norm = {"layer": [width, width], "layer_1p": [width, width], "layer_no_bias": []}.get(kind, [width])
    return per_norm * count


def layer_vectors(arch: Architecture, moe: bool) -> list[int]:
    """Every 1-D parameter of one layer (norms' weights and biases, the linear layers' biases)."""
    return _layer_vectors(arch, moe)


def _layer_vectors(arch: Architecture, moe: bool) -> list[int]:
    h, q, kv = arch.hidden_size, arch.query_width, arch.kv_width
    vectors = _norm_vectors(arch, h, arch.pre_norms + arch.post_norms + (2 if arch.post_layer_norm else 0))
    if arch.qk_norm == "head":  # one norm over each head's query, one over its key: LayerNorms with a bias
        vectors += _norm_vectors(arch, arch.head_dim, 2, arch.qk_norm_kind)
    elif arch.qk_norm == "full":
        vectors += [q, kv]
    if arch.attention_bias:
        vectors += [q + 2 * kv] if arch.fused_qkv else [q, kv, kv]
    if arch.output_bias:
        vectors += [h]
    if arch.mlp_bias and not moe:
        if arch.gated_mlp:
            i = arch.intermediate_size
            vectors += [2 * i, h] if arch.fused_gate_up else [i, i, h]
        else:
            vectors += [arch.intermediate_size, h]
    if moe and arch.router_bias:
        vectors += [arch.experts]
    return vectors


def _decoder_shapes(arch: Architecture) -> tuple[list[tuple[int, int]], list[int], int, int]:
    h, v = arch.hidden_size, arch.vocab_size
    embeddings = [(v, arch.embedding_width)]
    if arch.positions == "learned":
        embeddings.append((arch.position_embedding_rows, h))
    matrices: list[tuple[int, int]] = [*embeddings, *(shape for _, shape in model_linears(arch))]
    vectors: list[int] = _norm_vectors(arch, h, 1) if arch.embedding_norm else []
    for index in range(arch.num_layers):
        moe = index >= arch.dense_layers
        matrices += [shape for _, shape in layer_linears(arch, moe)]
        if moe:
            e, width = arch.experts, arch.expert_intermediate_size
            matrices += [(arch.experts, h), (e * 2 * width, h), (e * h, width)]  # router, experts' gate-up, down
        vectors += _layer_vectors(arch, moe)
    if arch.final_norm:
        vectors += _norm_vectors(arch, h, 1)
    if not arch.tie_word_embeddings:
        matrices += [(v, arch.embedding_width)]  # LM head
    if arch.lm_head_bias:
        vectors += [v]
    rotary = arch.rotary_dim or arch.head_dim
    buffer_bytes = 2 * (rotary // 2) * 4 * arch.rotary_buffers if arch.positions == "rotary" else 0
    buffer_bytes += (4 if arch.scaled_embedding else 0) + arch.extra_buffer_bytes
    return matrices, vectors, len(embeddings), buffer_bytes


def _encoder_shapes(arch: Architecture) -> tuple[list[tuple[int, int]], list[int], int, int]:
    """A BERT-style encoder with its 2-label head (BERT's pooler and classifier, RoBERTa's and ELECTRA's dense and
    out_proj, DistilBERT's pre_classifier and classifier: the same shapes)."""
    h, i, e = arch.hidden_size, arch.intermediate_size, arch.embedding_width
    embeddings = [(arch.vocab_size, e), (arch.position_embedding_rows, e)]
    if arch.token_types:
        embeddings.append((arch.token_types, e))
    matrices: list[tuple[int, int]] = list(embeddings)
    vectors = [e, e]  # embedding LayerNorm
    if arch.embedding_size:
        matrices.append((h, e))  # ELECTRA's embeddings_project
        vectors.append(h)
    for _ in range(arch.num_layers):
        matrices += [(h, h)] * 4 + [(i, h), (h, i)]
        vectors += [h] * 4 + [i, h] + [h, h] * 2
    matrices += [(h, h), (NUM_LABELS, h)]
    vectors += [h, NUM_LABELS]
    # position_ids (and token_type_ids): int64 buffers of max_positions entries
    buffer_bytes = (2 if arch.token_types else 1) * arch.position_embedding_rows * 8
    return matrices, vectors, len(embeddings), buffer_bytes


def _gpt2_classifier_shapes(arch: Architecture) -> tuple[list[tuple[int, int]], list[int], int, int]:
    h, i, v, p = arch.hidden_size, arch.intermediate_size, arch.vocab_size, arch.max_positions
    embeddings = [(v, h), (p, h)]
    matrices = list(embeddings)
    vectors: list[int] = []
    for _ in range(arch.num_layers):
        matrices += [(h, 3 * h), (h, h), (h, i), (i, h)]
        vectors += [h, h, 3 * h, h, h, h, i, h]
    vectors += [h, h]  # final LayerNorm
    matrices += [(NUM_LABELS, h)]  # score head, no bias
    return matrices, vectors, len(embeddings), 0


def parameter_shapes(model: Architecture | ModelPreset) -> ParameterShapes:
    """The parameter tensors of the model: a 2-label classifier, or a decoder's causal LM."""
    arch = as_architecture(model)
    if arch.objective == "causal-lm":
        matrices, vectors, embedding_tensors, buffer_bytes = _decoder_shapes(arch)
    elif arch.family == "gpt2":
        matrices, vectors, embedding_tensors, buffer_bytes = _gpt2_classifier_shapes(arch)
    else:
        matrices, vectors, embedding_tensors, buffer_bytes = _encoder_shapes(arch)
    params = sum(rows * cols for rows, cols in matrices) + sum(vectors)
    return ParameterShapes(
        params=params,
        tensors=len(matrices) + len(vectors),
        matrices=tuple(matrices),
        vectors=tuple(vectors),
        embedding_params=sum(r * c for r, c in matrices[:embedding_tensors]),
        embedding_tensors=embedding_tensors,
        buffer_bytes=buffer_bytes,
    )


def _adapted_layer_linears(arch: Architecture, config: RunConfig, moe: bool = False) -> list[tuple[int, int]]:
    """(out, in) of the linear layers LoRA adapts in one layer: for decoders exactly as PEFT picks them
    ("all-linear": every projection but the LM head; else those named), for the classifiers an estimate, their
    non-embedding matrices spread over the layers (PEFT also trains a copy of their head)."""
    if arch.objective == "causal-lm":
        adapted = lora_target_names(arch, config)
        return [shape for name, shape in layer_linears(arch, moe) if name in adapted]
    full = parameter_shapes(arch)
    return list(full.matrices[full.embedding_tensors :])


def _adapted_linears(arch: Architecture, config: RunConfig) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Every linear layer LoRA adapts in the model, and the adapters of the experts' parameters PEFT wraps."""
    if arch.objective != "causal-lm":
        return _adapted_layer_linears(arch, config), []
    adapted = (
        _adapted_layer_linears(arch, config) * arch.dense_layers
        + _adapted_layer_linears(arch, config, moe=True) * arch.moe_layers
    )
    targets = lora_target_names(arch, config)
    experts = [shape for matrices in lora_expert_matrices(arch, config).values() for shape in matrices]
    return adapted + [shape for name, shape in model_linears(arch) if name in targets], experts * arch.moe_layers


def lora_shapes(model: Architecture | ModelPreset, config: RunConfig) -> ParameterShapes:
    """The LoRA adapters' parameters: A (rank × in) and B (out × rank) on each adapted linear layer, and on the
    experts' parameters PEFT wraps (`lora_expert_matrices`)."""
    rank = config.lora
    linears, experts = _adapted_linears(as_architecture(model), config)
    matrices = [shape for out, inp in linears for shape in ((rank, inp), (out, rank))] + experts
    return ParameterShapes(
        params=sum(r * c for r, c in matrices),
        tensors=len(matrices),
        matrices=tuple(matrices),
        vectors=(),
        embedding_params=0,
        embedding_tensors=0,
        buffer_bytes=0,
    )


def lora_adapted_inputs_per_layer(model: Architecture | ModelPreset, config: RunConfig) -> int:
    """Σ in_features of the projections LoRA adapts in one layer (the classifiers' estimate: per layer on average)."""
    arch = as_architecture(model)
    inputs = sum(inp for _, inp in _adapted_layer_linears(arch, config))
    return inputs if arch.objective == "causal-lm" else inputs // arch.num_layers


def quantized_matrices(model: Architecture | ModelPreset) -> list[tuple[int, int]]:
    """The matrices QLoRA holds in 4 bits: every linear layer of a decoder. Transformers keeps the output embeddings
    (the LM head, tied or not) and the input embeddings, which are no linear layers, out."""
    arch = as_architecture(model)
    return (
        [shape for _, shape in layer_linears(arch)] * arch.dense_layers
        + [shape for _, shape in layer_linears(arch, moe=True)] * arch.moe_layers
        + [shape for _, shape in model_linears(arch)]
    )
