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
}
"""What each decoder family's modeling code fixes and its config does not say (transformers 5)."""

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
}
"""transformers' ACT2FN names by what they keep for backward (`architecture.ACTIVATION_KINDS`)."""

ALIASES = {
    "hidden_size": ("hidden_size", "n_embd", "d_model", "dim"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers", "n_layers"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads", "n_heads"),
    "kv_heads": ("num_key_value_heads", "num_kv_heads", "n_head_kv"),
    "intermediate_size": ("intermediate_size", "n_inner", "ffn_dim", "d_ff", "hidden_dim"),
    "max_positions": ("max_position_embeddings", "n_positions", "seq_length"),
    "activation": ("hidden_act", "hidden_activation", "activation_function"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "experts_per_token": ("num_experts_per_tok", "num_experts_per_token", "moe_topk"),
}
