"""What each transformers family's modeling code fixes and its config does not say, read from transformers' code:
the decoder layouts (`FAMILY_LAYOUTS`), the encoder families, the families refused and why, the activations by what
they keep for backward, and the config keys each dimension goes by (`ALIASES`). `model_config` reads a config with
these (no torch, no transformers).
"""

from __future__ import annotations

from typing import Any

LLAMA_LAYOUT: dict[str, Any] = {}
"""A Llama decoder layer: RMSNorm before attention and before the MLP, separate q/k/v/o, a gated SiLU MLP, rotary."""
LAYER_NORM_PLAIN_MLP: dict[str, Any] = {
    "norm": "layer",
    "gated_mlp": False,
    "attention_bias": True,
    "output_bias": True,
    "mlp_bias": True,
}

FAMILY_LAYOUTS: dict[str, dict[str, Any]] = {
    # Llama's layer, as is
    **dict.fromkeys(
        (
            "llama",
            "mistral",
            "ministral",
            "granite",
            "smollm3",
            "exaone4",
            "helium",
            "arcee",
            "seed_oss",
            "glm",
            "hunyuan_v1_dense",
            "ernie4_5",
        ),
        LLAMA_LAYOUT,
    ),
    "qwen2": {"attention_bias": True},
    "qwen3": {"qk_norm": "head"},
    "mixtral": {"moe": True},
    "granitemoe": {"moe": True},
    "olmoe": {"moe": True, "qk_norm": "full"},
    "qwen2_moe": {"moe": True, "attention_bias": True, "shared_expert_gate": True},
    "qwen3_moe": {"moe": True, "qk_norm": "head"},
    "phi3": {"fused_qkv": True, "fused_gate_up": True},
    "gemma": {"norm": "rms_fp32", "tie_default": True, "scaled_embedding": True},
    "gemma2": {"norm": "rms_fp32", "post_norms": 2, "tie_default": True, "scaled_embedding": True},
    "gemma3_text": {
        "norm": "rms_fp32",
        "post_norms": 2,
        "qk_norm": "head",
        "qk_norm_kind": "rms_fp32",
        "rotary_buffers": 2,
        "tie_default": True,
        "scaled_embedding": True,
    },
    "olmo": {"norm": "layer_no_bias"},
    "olmo2": {"norm": "rms_fp32", "pre_norms": 0, "post_norms": 2, "qk_norm": "full", "qk_norm_kind": "rms_fp32"},
    "olmo3": {
        "norm": "rms_fp32",
        "pre_norms": 0,
        "post_norms": 2,
        "qk_norm": "full",
        "qk_norm_kind": "rms_fp32",
        "rotary_per_layer_type": True,
    },
    "glm4": {"post_norms": 2, "fused_gate_up": True},
    "phi": {
        **LAYER_NORM_PLAIN_MLP,
        "pre_norms": 1,
        "parallel_residual": True,
        "lm_head_bias": True,
        "residual_dropout_key": "resid_pdrop",
        "embedding_dropout_key": "embd_pdrop",
    },
    "stablelm": {"norm": "layer", "residual_dropout_key": "hidden_dropout", "residual_dropout_sites": 1},
    "gpt_neox": {
        **LAYER_NORM_PLAIN_MLP,
        "fused_qkv": True,
        "parallel_residual": True,
        "residual_dropout_key": "hidden_dropout",
    },
    "bloom": {
        "eager_only": True,
        **LAYER_NORM_PLAIN_MLP,
        "fused_qkv": True,
        "positions": "alibi",
        "embedding_norm": True,
        "mlp_ratio": 4,
        "residual_dropout_key": "hidden_dropout",
        "tie_default": True,
    },
    "opt": {
        **LAYER_NORM_PLAIN_MLP,
        "positions": "learned",
        "position_offset": 2,
        "residual_dropout_key": "dropout",
        "tie_default": True,
    },
    "starcoder2": {
        **LAYER_NORM_PLAIN_MLP,
        "residual_dropout_key": "residual_dropout",
        "embedding_dropout_key": "embedding_dropout",
    },
    "gpt2": {
        **LAYER_NORM_PLAIN_MLP,
        "fused_qkv": True,
        "positions": "learned",
        "residual_dropout_key": "resid_pdrop",
        "embedding_dropout_key": "embd_pdrop",
        "tie_default": True,
    },
    # Issue #50: families read from transformers 5.24's modeling code (unchanged in 5.17's where it matters here)
    "gptj": {
        **LAYER_NORM_PLAIN_MLP,
        "attention_bias": False,
        "output_bias": False,
        "pre_norms": 1,
        "parallel_residual": True,
        "lm_head_bias": True,
        "sinusoid_table": True,
        "residual_dropout_key": "resid_pdrop",
        "embedding_dropout_key": "embd_pdrop",
        "attention_dropout_key": "attn_pdrop",
    },
    "codegen": {
        **LAYER_NORM_PLAIN_MLP,
        "attention_bias": False,
        "output_bias": False,
        "fused_qkv": True,
        "qkv_split_copies": True,
        "pre_norms": 1,
        "parallel_residual": True,
        "lm_head_bias": True,
        "sinusoid_table": True,
        "residual_dropout_key": "resid_pdrop",
        "embedding_dropout_key": "embd_pdrop",
        "attention_dropout_key": "attn_pdrop",
    },
    "gpt_bigcode": {
        **LAYER_NORM_PLAIN_MLP,
        "fused_qkv": True,
        "positions": "learned",
        "causal_mask_buffers": 1,
        "tie_default": True,
        "residual_dropout_key": "resid_pdrop",
        "embedding_dropout_key": "embd_pdrop",
        "attention_dropout_key": "attn_pdrop",
    },
    "gpt_neo": {
        "eager_only": True,
        **LAYER_NORM_PLAIN_MLP,
        "attention_bias": False,
        "positions": "learned",
        "causal_mask_buffers": "per_layer",
        "tie_default": True,
        "residual_dropout_key": "resid_dropout",
        "embedding_dropout_key": "embed_dropout",
    },
    "openai-gpt": {
        "eager_only": True,
        **LAYER_NORM_PLAIN_MLP,
        "fused_qkv": True,
        "post_norm": True,
        "positions": "learned",
        "mlp_ratio": 4,
        "activation_key": "afn",
        "activation_names": {"gelu": "gelu_new"},
        "causal_mask_buffers": "per_layer",
        "causal_mask_element_bytes": 4,
        "position_ids_buffer": True,
        "tie_default": True,
        "residual_dropout_key": "resid_pdrop",
        "embedding_dropout_key": "embd_pdrop",
        "attention_dropout_key": "attn_pdrop",
    },
    "persimmon": {
        **LAYER_NORM_PLAIN_MLP,
        "fused_qkv": True,
        "qk_norm_key": "qk_layernorm",
        "qk_norm_kind": "layer",
        "residual_dropout_key": "hidden_dropout",
        "residual_dropout_sites": 1,
    },
    "nemotron": {"norm": "layer_1p", "gated_mlp": False, "output_bias_is_attention_bias": True},
    "cohere": {"norm": "layer_python", "pre_norms": 1, "parallel_residual": True, "tie_default": True},
    "cohere2": {"norm": "layer_python", "pre_norms": 1, "parallel_residual": True, "tie_default": True},
    "mpt": {
        "eager_only": True,
        "norm": "layer_weight_only",
        "gated_mlp": False,
        "fused_qkv": True,
        "mlp_ratio": 4,
        "activation": "gelu",
        "positions": "alibi",
        "tie_default": True,
    },
}
"""What each decoder family's modeling code fixes and its config does not say (transformers 5)."""

MODULE_NAMES: dict[str, dict[str, str]] = {
    "phi": {"o": "dense"},
    "phi3": {"qkv": "qkv_proj", "gate_up": "gate_up_proj"},
    "gpt_neox": {"qkv": "query_key_value", "o": "dense", "fc1": "dense_h_to_4h", "fc2": "dense_4h_to_h"},
    "bloom": {"qkv": "query_key_value", "o": "dense", "fc1": "dense_h_to_4h", "fc2": "dense_4h_to_h"},
    "falcon": {"qkv": "query_key_value", "o": "dense", "fc1": "dense_h_to_4h", "fc2": "dense_4h_to_h"},
    "persimmon": {"qkv": "query_key_value", "o": "dense", "fc1": "dense_h_to_4h", "fc2": "dense_4h_to_h"},
    "opt": {"o": "out_proj"},
    "starcoder2": {"fc1": "c_fc", "fc2": "c_proj"},
    "gpt2": {"qkv": "c_attn", "o": "c_proj", "fc1": "c_fc", "fc2": "c_proj"},
    "gpt_bigcode": {"qkv": "c_attn", "o": "c_proj", "fc1": "c_fc", "fc2": "c_proj"},
    "gpt_neo": {"o": "out_proj", "fc1": "c_fc", "fc2": "c_proj"},
    "openai-gpt": {"qkv": "c_attn", "o": "c_proj", "fc1": "c_fc", "fc2": "c_proj"},
    "gptj": {"o": "out_proj", "fc1": "fc_in", "fc2": "fc_out"},
    "codegen": {"qkv": "qkv_proj", "o": "out_proj", "fc1": "fc_in", "fc2": "fc_out"},
    "mpt": {"qkv": "Wqkv", "o": "out_proj", "fc1": "up_proj", "fc2": "down_proj"},
    "nemotron": {"fc1": "up_proj", "fc2": "down_proj"},
}
"""Module names of a layer's projections where a family does not use Llama's (q_proj … down_proj, fc1, fc2)."""


def falcon_layout(data: dict[str, Any]) -> dict[str, Any]:
    """Falcon's layer, which its config's switches choose (modeling_falcon.py): `new_decoder_architecture` (40B/180B:
    grouped key/value heads broadcast to every head and flattened — copies — two norms read by a parallel block),
    `parallel_attn` (7B: one norm read by attention and MLP), `multi_query` (one key/value head, which SDPA gets
    without `enable_gqa`), `alibi` (no rotary; the ALiBi slopes built into its float mask, batch × heads × seq², one
    for all layers; without ALiBi the mask is materialized all the same, batch × seq²), `bias` (on every projection,
    added after the matmul by FalconLinear)."""
    heads = data.get("num_attention_heads") or data.get("n_head")
    new = bool(data.get("new_decoder_architecture"))
    multi_query = bool(data.get("multi_query", True)) and not new
    parallel = bool(data.get("parallel_attn", True)) or new
    bias = bool(data.get("bias", False))
    two_norms = new and data.get("num_ln_in_parallel_attn") in (None, 2)
    return {
        **LAYER_NORM_PLAIN_MLP,
        "attention_bias": bias,
        "output_bias": bias,
        "mlp_bias": bias,
        "fused_qkv": True,
        "kv_heads": data.get("num_kv_heads") if new else 1 if multi_query else heads,
        "kv_broadcast_to_heads": multi_query and isinstance(heads, int) and heads > 1,
        "kv_expanded": new,
        "pre_norms": 2 if two_norms or not parallel else 1,
        "parallel_residual": parallel,
        "positions": "alibi" if data.get("alibi") else "rotary",
        "materialized_mask_heads": heads if data.get("alibi") else 1,
        "rotary_tables_unused": True,
        "bias_after_matmul": True,
        "tie_default": True,
        "residual_dropout_key": "hidden_dropout",
        "residual_dropout_sites": 1,
    }


ENCODER_FAMILIES = ("bert", "roberta", "xlm-roberta", "camembert", "electra", "distilbert")
"""BERT-style encoders (post-norm LayerNorm layers, learned positions), trained as 2-label classifiers."""
REFUSED_FAMILIES = {
    "deberta": "DeBERTa's disentangled attention",
    "deberta-v2": "DeBERTa's disentangled attention",
    "modernbert": "ModernBERT's unpadded, alternating attention",
    "t5": "an encoder-decoder",
    "bart": "an encoder-decoder",
    "mamba": "a state-space model, not attention layers",
    "mamba2": "a state-space model",
    "jamba": "a hybrid of attention and Mamba layers",
    "deepseek_v2": "DeepSeek's latent attention (MLA)",
    "deepseek_v3": "DeepSeek's latent attention (MLA)",
}
"""Families whose layers this model does not describe, and why."""

ACTIVATIONS = {
    "silu": "saves_input",
    "swish": "saves_input",
    "gelu": "saves_input",
    "gelu_pytorch_tanh": "saves_input",
    "gelu_python": "saves_input",
    "gelu_accurate": "tanh_composed",
    "relu": "saves_output",
    "gelu_new": "tanh_composed",
    "gelu_fast": "tanh_composed",
    "quick_gelu": "sigmoid_composed",
    "bloom_gelu": "saves_input",
    "relu2": "squared_relu",
}
"""transformers' ACT2FN names by what they keep for backward (`architecture.ACTIVATION_KINDS`)."""

ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "hidden_dim", "ffn_hidden_size"),
    "max_positions": ("max_position_embeddings", "n_positions", "seq_length"),
    "activation": ("hidden_act", "hidden_activation", "activation_function", "activation"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok", "num_experts_per_token", "moe_topk"),
}
