"""Reading a model's Hugging Face config (a config.json, a model directory, or a cached Hub name, offline) into the
bytes model's one general `Architecture` — and a preset's dimensions the same way, as the config transformers would
write for it (no torch, no transformers).

The config's own fields give the dimensions (under each family's key names) and what varies within a family
(biases, parallel residual, q/k norms, partial rotary, dropout, sliding layers, experts). What a config does not
say because the family's code fixes it — which norm, where, fused projections, a gated MLP — is `FAMILY_LAYOUTS`
(`families`), read from transformers' modeling code, one line a family. A model_type not there is read as a
Llama-style decoder (or a BERT-style encoder) with the assumptions named in `Architecture.assumed`; a config that
lacks the dimensions, or an architecture this model cannot describe (DeBERTa's disentangled attention, ModernBERT),
is refused with why.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

from gpuanat.core.memory.architecture import Architecture
from gpuanat.core.memory.families import (
    ACTIVATIONS,
    ALIASES,
    ENCODER_FAMILIES,
    FAMILY_LAYOUTS,
    REFUSED_FAMILIES,
    falcon_layout,
)
from gpuanat.core.memory.unknown_family import Unreadable, read_unknown_layout
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.presets import PRESETS, ModelPreset


class UnreadableModel(Exception):
    """The model's config cannot be found or described; the message says why and what to do."""


def _first(data: dict[str, Any], field: str) -> Any:
    for key in ALIASES[field]:
        if data.get(key) is not None:
            return data[key]
    return None


def _positive_int(data: dict[str, Any], field: str, name: str) -> int:
    value = _first(data, field)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        keys = " or ".join(ALIASES[field])
        what = field.replace("_", " ")
        raise UnreadableModel(f"{name}: the config has no {keys} (a positive integer), so its {what} is unknown")
    return value


def is_causal_lm_config(data: dict[str, Any]) -> bool:
    """Trained as a causal LM: its `architectures` say so, else a family that is no encoder."""
    architectures = data.get("architectures") or []
    if architectures:
        return any(str(name).endswith("ForCausalLM") for name in architectures)
    return data.get("model_type") not in ENCODER_FAMILIES


def _rotary_dim(data: dict[str, Any], head_dim: int) -> int:
    if isinstance(data.get("rotary_dim"), int) and 0 < data["rotary_dim"] < head_dim:  # GPT-J, CodeGen: a width
        return int(data["rotary_dim"])
    rope = data.get("rope_parameters") or data.get("rope_scaling") or {}
    fraction = data.get("partial_rotary_factor", data.get("rotary_pct", rope.get("partial_rotary_factor")))
    return int(head_dim * fraction) if isinstance(fraction, (int, float)) and fraction < 1 else 0


def _dropout(data: dict[str, Any], key: str | None) -> float:
    value = data.get(key) if key else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.0


def read_architecture(data: dict[str, Any], name: str) -> Architecture:
    """The general description of the model a config dict describes (see the module's docstring)."""
    if not isinstance(data, dict):
        raise UnreadableModel(f"{name}: a config is a JSON object, as transformers writes config.json")
    family = data.get("model_type")
    if not isinstance(family, str) or not family:
        raise UnreadableModel(f"{name}: the config has no model_type, so its architecture is unknown")
    if family in REFUSED_FAMILIES:
        raise UnreadableModel(
            f"{name}: {family} is {REFUSED_FAMILIES[family]}, which gpuanat's memory model does not "
            "describe; `gpuanat run --model` still trains and measures it"
        )
    if isinstance(data.get("text_config"), dict) and "hidden_size" not in data:
        raise UnreadableModel(
            f"{name}: a multimodal config ({family}); give the text model's config (its text_config as a config.json)"
        )
    if not is_causal_lm_config(data) or family in ENCODER_FAMILIES:
        return _read_encoder(data, name, family)
    return _read_decoder(data, name, family)


def _layout(data: dict[str, Any], name: str, family: str, heads: int) -> tuple[dict[str, Any], tuple[str, ...]]:
    """What the family's code fixes (the table, Falcon's and MPT's switches), or what an unknown family's keys say."""
    if family == "falcon":
        return falcon_layout(data), ()
    if family == "mpt":
        attention: dict[str, Any] = data["attn_config"] if isinstance(data.get("attn_config"), dict) else {}
        dropout = _dropout(attention, "attn_pdrop")  # MPT's attention, its output and its MLP's: all attn_pdrop
        return {**FAMILY_LAYOUTS["mpt"], "dropout": dropout}, ()
    if family in FAMILY_LAYOUTS:
        return FAMILY_LAYOUTS[family], ()
    activation = str(_first(data, "activation") or "silu")
    try:
        layout, assumed = read_unknown_layout(data, family, heads, activation)
    except Unreadable as error:
        raise UnreadableModel(
            f"{name}: {family} is no family gpuanat knows and its config leaves unknown or contradicts what its "
            f"memory depends on: {error}"
        ) from None
    if data.get("auto_map"):
        assumed.append("the model runs custom code, which gpuanat cannot read")
    return layout, tuple(assumed)


def _buffer_bytes(layout: dict[str, Any], layers: int, positions: int, rotary_width: int) -> int:
    """Buffers a family's code registers beside the rotary frequencies: GPT-J's and CodeGen's fp32 sinusoid table
    (positions × rotary width), GPT-BigCode's boolean causal mask (positions²), one a layer in GPT-Neo, an fp32 one a
    layer and the int64 position ids in OpenAI GPT."""
    table = 4 * positions * rotary_width if layout.get("sinusoid_table") else 0
    if layout.get("positions") == "alibi" and layout.get("rotary_tables_unused"):  # Falcon builds them all the same
        table += 2 * (rotary_width // 2) * 4
    masks = {1: 1, "per_layer": layers}.get(layout.get("causal_mask_buffers", 0), 0)
    position_ids = 8 * positions if layout.get("position_ids_buffer") else 0
    mask_bytes = masks * positions * positions * int(layout.get("causal_mask_element_bytes", 1))
    return table + mask_bytes + position_ids


def _rotary_buffers(layout: dict[str, Any], layer_types: list[str]) -> int:
    """Rotary modules' frequency buffers: none with GPT-J's table, one set a layer type in OLMo-3."""
    if layout.get("sinusoid_table"):
        return 0
    if layout.get("rotary_per_layer_type") and layer_types:
        return len(set(layer_types))
    return int(layout.get("rotary_buffers", 1))


def _read_decoder(data: dict[str, Any], name: str, family: str) -> Architecture:
    h = _positive_int(data, "hidden_size", name)
    layers = _positive_int(data, "num_layers", name)
    heads = _positive_int(data, "num_heads", name)
    layout, assumed = _layout(data, name, family, heads)
    kv_heads = layout.get("kv_heads") or _first(data, "kv_heads") or (1 if data.get("multi_query") else heads)
    head_dim = data.get("head_dim") or h // heads
    intermediate = layout["mlp_ratio"] * h if "mlp_ratio" in layout else _first(data, "intermediate_size") or 4 * h
    vocab = data.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise UnreadableModel(f"{name}: the config has no vocab_size")
    activation_name = str(
        layout.get("activation")
        or data.get(layout.get("activation_key", ""))
        or _first(data, "activation")
        or ("bloom_gelu" if family == "bloom" else "silu")
    )
    activation_name = layout.get("activation_names", {}).get(activation_name, activation_name)
    activation = ACTIVATIONS.get(activation_name)
    if activation is None:
        activation = "saves_input"
        assumed += (f"its activation {activation_name!r} keeps only its input for backward",)
    experts = int(_first(data, "experts") or 0) if layout.get("moe") else 0
    moe_layers = 0
    expert_intermediate = shared_intermediate = 0
    if experts:
        expert_intermediate = int(data.get("moe_intermediate_size") or intermediate)
        step = int(data.get("decoder_sparse_step") or 1)
        dense_only = set(data.get("mlp_only_layers") or [])
        moe_layers = sum(1 for index in range(layers) if (index + 1) % step == 0 and index not in dense_only)
        shared_intermediate = int(data.get("shared_expert_intermediate_size") or 0)
    layer_types = data.get("layer_types") or []
    sliding_layers = sum(1 for kind in layer_types if kind == "sliding_attention")
    parallel = bool(data.get("use_parallel_residual", layout.get("parallel_residual", False)))
    post_norm = (family == "opt" and data.get("do_layer_norm_before") is False) or bool(layout.get("post_norm"))
    pre_norms = 0 if post_norm else layout.get("pre_norms", 1 if parallel and family == "stablelm" else 2)
    projection = data.get("word_embed_proj_dim") if family == "opt" else None
    attention_bias = bool(data.get("attention_bias", data.get("use_qkv_bias", layout.get("attention_bias", False))))
    qk_norm = "full" if data.get("qk_layernorm") and family == "stablelm" else layout.get("qk_norm", "none")
    if (family == "phi" and data.get("qk_layernorm")) or data.get(layout.get("qk_norm_key", "")):
        qk_norm = "head"
    mlp_bias = bool(data.get("mlp_bias", data.get("use_bias", layout.get("mlp_bias", False))))
    return Architecture(
        family=family,
        objective="causal-lm",
        hidden_size=h,
        num_layers=layers,
        num_heads=heads,
        kv_heads=int(kv_heads),
        head_dim=int(head_dim),
        intermediate_size=int(intermediate),
        vocab_size=vocab,
        max_positions=int(_first(data, "max_positions") or 0),
        tie_word_embeddings=bool(data.get("tie_word_embeddings", layout.get("tie_default", False))),
        attention_bias=attention_bias,
        output_bias=attention_bias if layout.get("output_bias_is_attention_bias") else layout.get("output_bias", False),
        mlp_bias=mlp_bias,
        gated_mlp=layout.get("gated_mlp", True),
        activation=activation,
        fused_qkv=layout.get("fused_qkv", False),
        fused_gate_up=layout.get("fused_gate_up", False),
        norm=layout.get("norm", "rms"),
        pre_norms=pre_norms,
        post_norms=layout.get("post_norms", 0),
        post_layer_norm=post_norm,
        parallel_residual=parallel,
        qk_norm=qk_norm,
        qk_norm_kind=layout.get("qk_norm_kind", "layer" if family in ("stablelm", "phi") else "rms"),
        final_norm=not post_norm,
        lm_head_bias=layout.get("lm_head_bias", False),
        positions=layout.get("positions", "rotary"),
        position_embedding_rows=(
            int(_first(data, "max_positions") or 0) + layout.get("position_offset", 0)
            if layout.get("positions") == "learned"
            else 0
        ),
        embedding_size=int(projection) if projection and projection != h else 0,
        embedding_norm=layout.get("embedding_norm", False),
        scaled_embedding=layout.get("scaled_embedding", False),
        rotary_buffers=_rotary_buffers(layout, layer_types),
        rotary_dim=_rotary_dim(data, int(head_dim)),
        sliding_window_layers=sliding_layers,
        sliding_window=int(data.get("sliding_window") or 0),
        experts=experts,
        experts_per_token=int(_first(data, "experts_per_token") or 0) if experts else 0,
        expert_intermediate_size=expert_intermediate,
        shared_expert_intermediate_size=shared_intermediate,
        shared_expert_gate=bool(layout.get("shared_expert_gate")) and shared_intermediate > 0,
        moe_layers=moe_layers,
        residual_dropout=layout.get("dropout", _dropout(data, layout.get("residual_dropout_key"))),
        residual_dropout_sites=layout.get("residual_dropout_sites", 2),
        embedding_dropout=_dropout(data, layout.get("embedding_dropout_key")),
        attention_dropout=layout.get(
            "dropout", _dropout(data, layout.get("attention_dropout_key", "attention_dropout"))
        ),
        final_logit_softcapping=float(data.get("final_logit_softcapping") or 0.0),
        logits_scaled=any(data.get(key) not in (None, 1, 1.0) for key in ("logit_scale", "logits_scaling")),
        kv_broadcast_to_heads=layout.get("kv_broadcast_to_heads", False),
        kv_expanded=layout.get("kv_expanded", False),
        materialized_mask_heads=layout.get("materialized_mask_heads", 0),
        bias_after_matmul=layout.get("bias_after_matmul", False),
        qkv_split_copies=layout.get("qkv_split_copies", False),
        eager_only=layout.get("eager_only", False),
        extra_buffer_bytes=_buffer_bytes(
            layout, layers, int(_first(data, "max_positions") or 0), _rotary_dim(data, int(head_dim)) or int(head_dim)
        ),
        assumed=assumed,
    )


def _read_encoder(data: dict[str, Any], name: str, family: str) -> Architecture:
    assumed: tuple[str, ...] = ()
    if family not in ENCODER_FAMILIES:
        assumed = (
            f"{family} is no family gpuanat knows: read as a BERT encoder (post-norm LayerNorm layers, "
            "learned positions) trained as a classifier",
        )
    h = _positive_int(data, "hidden_size", name)
    heads = _positive_int(data, "num_heads", name)
    intermediate = _first(data, "intermediate_size") or 4 * h
    vocab = data.get("vocab_size")
    if not isinstance(vocab, int) or vocab < 1:
        raise UnreadableModel(f"{name}: the config has no vocab_size")
    embedding_size = int(data.get("embedding_size") or h)
    return Architecture(
        family="bert" if family in ENCODER_FAMILIES and family != "distilbert" else family,
        objective="classification",
        hidden_size=h,
        num_layers=_positive_int(data, "num_layers", name),
        num_heads=heads,
        kv_heads=heads,
        head_dim=h // heads,
        intermediate_size=int(intermediate),
        vocab_size=vocab,
        max_positions=int(_first(data, "max_positions") or 512),
        norm="layer",
        gated_mlp=False,
        activation=ACTIVATIONS.get(str(_first(data, "activation") or "gelu"), "saves_input"),
        attention_bias=True,
        output_bias=True,
        mlp_bias=True,
        post_layer_norm=True,
        pre_norms=0,
        positions="learned",
        position_embedding_rows=int(_first(data, "max_positions") or 512),
        token_types=int(data.get("type_vocab_size", 0 if family == "distilbert" else 2) or 0),
        embedding_size=embedding_size if embedding_size != h else 0,
        embedding_norm=True,
        assumed=assumed,
    )


def preset_config(preset: ModelPreset) -> dict[str, Any]:
    """The config.json transformers would write for a preset's model (the worker builds the same one)."""
    if preset.family == "bert":
        return {
            "model_type": "bert",
            "architectures": ["BertForSequenceClassification"],
            "hidden_size": preset.hidden_size,
            "num_hidden_layers": preset.num_layers,
            "num_attention_heads": preset.num_heads,
            "intermediate_size": preset.intermediate_size,
            "vocab_size": preset.vocab_size,
            "max_position_embeddings": preset.max_positions,
            "type_vocab_size": 2,
            "hidden_act": "gelu",
        }
    if preset.family == "gpt2":
        return {
            "model_type": "gpt2",
            "architectures": ["GPT2ForSequenceClassification"],
            "n_embd": preset.hidden_size,
            "n_layer": preset.num_layers,
            "n_head": preset.num_heads,
            "n_inner": preset.intermediate_size,
            "vocab_size": preset.vocab_size,
            "n_positions": preset.max_positions,
            "activation_function": "gelu_new",
        }
    return {
        "model_type": preset.family,
        "architectures": [f"{preset.family.title()}ForCausalLM"],
        "hidden_size": preset.hidden_size,
        "num_hidden_layers": preset.num_layers,
        "num_attention_heads": preset.num_heads,
        "num_key_value_heads": preset.kv_heads,
        "intermediate_size": preset.intermediate_size,
        "vocab_size": preset.vocab_size,
        "max_position_embeddings": preset.max_positions,
        "tie_word_embeddings": preset.tie_word_embeddings,
        "hidden_act": "silu",
    }


@functools.cache
def preset_architecture(preset: ModelPreset) -> Architecture:
    if preset.family == "gpt2":  # a classifier: its own path in the bands (GPT-2's blocks as measured)
        return Architecture(
            family="gpt2",
            objective="classification",
            hidden_size=preset.hidden_size,
            num_layers=preset.num_layers,
            num_heads=preset.num_heads,
            kv_heads=preset.num_heads,
            head_dim=preset.head_dim,
            intermediate_size=preset.intermediate_size,
            vocab_size=preset.vocab_size,
            max_positions=preset.max_positions,
            norm="layer",
            gated_mlp=False,
            activation="tanh_composed",
            fused_qkv=True,
            attention_bias=True,
            output_bias=True,
            mlp_bias=True,
            positions="learned",
            position_embedding_rows=preset.max_positions,
        )
    return read_architecture(preset_config(preset), preset.name)


def config_path(model: str) -> Path:
    """The config.json of a --model: the file itself, a directory's, or a Hub name's in the local cache."""
    path = Path(model).expanduser()
    if model.endswith(".json"):
        return path
    if path.is_dir():
        return path / "config.json"
    from huggingface_hub import try_to_load_from_cache  # comes with transformers; imports no torch
    from huggingface_hub.errors import HFValidationError

    try:
        cached = try_to_load_from_cache(model, "config.json")
    except HFValidationError:
        cached = None
    if not isinstance(cached, str):
        raise UnreadableModel(
            f"{model}: not in the local Hugging Face cache (predictions read it offline); "
            f"`hf download {model} config.json`, or give a config.json"
        )
    return Path(cached)


@functools.lru_cache(maxsize=64)
def _read_file(path: str, modified_ns: int) -> Architecture:
    try:
        data = json.loads(Path(path).read_text())
    except OSError as error:
        raise UnreadableModel(f"{path}: {error.strerror or error}") from None
    except ValueError as error:
        raise UnreadableModel(f"{path} is not JSON: {error}") from None
    return read_architecture(data, path)


def model_architecture(model: str) -> Architecture:
    """The architecture of a --model (a config.json, a model directory or a cached Hub name)."""
    path = config_path(model)
    try:
        modified_ns = os.stat(path).st_mtime_ns
    except OSError as error:
        raise UnreadableModel(f"{model}: no config.json at {path} ({error.strerror})") from None
    return _read_file(str(path), modified_ns)


def architecture_of(config: RunConfig) -> Architecture:
    """The model a run trains: its --model's config, else its preset's. Raises UnreadableModel."""
    if config.model is not None:
        return model_architecture(config.model)
    return preset_architecture(PRESETS[config.preset])


def trains_causal_lm(config: RunConfig) -> bool:
    """Whether the run trains a causal LM (False where its --model cannot be read)."""
    try:
        return architecture_of(config).objective == "causal-lm"
    except UnreadableModel:
        return False
