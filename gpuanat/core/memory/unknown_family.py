"""A decoder config whose `model_type` is in no layout table (`families.FAMILY_LAYOUTS`), read for what its own keys
say (issue #50): key/value heads (`num_key_value_heads`, `num_kv_heads`, `multi_query`), positions (rotary keys,
`alibi`, or neither), the norm's kind and biases (`rms_norm_eps` or `layer_norm_eps`, `bias`, `use_bias`, `no_bias`,
`attention_bias`, `mlp_bias`), a parallel residual (`parallel_attn`, `use_parallel_residual`, `parallel_residual`) and
the MLP's kind (`hidden_act`, a gated MLP where a key says so). What the keys leave open is assumed and named; what
they leave open or contradict where the answer moves the memory by more than about 10% — the key/value heads, the
residual, a gated or plain MLP — is a refusal with the reason, never a number (no torch, no transformers).
"""

from __future__ import annotations

from typing import Any

ROTARY_KEYS = ("rope_theta", "rope_parameters", "rope_scaling", "rotary_pct", "partial_rotary_factor", "rotary_dim")
LAYER_NORM_KEYS = ("layer_norm_eps", "layer_norm_epsilon")
RMS_NORM_KEYS = ("rms_norm_eps",)
PARALLEL_KEYS = ("parallel_attn", "use_parallel_residual", "parallel_residual")
GATED_KEYS = ("gated_mlp", "use_gated_mlp", "mlp_gated", "glu")
GATED_ACTIVATIONS = ("silu", "swish", "swiglu")
"""Activations transformers' decoder families use only in gated MLPs (gate, up and down)."""


class Unreadable(Exception):
    """What the config leaves unknown or contradicts, where it changes the memory by more than about 10%."""


def _flag(data: dict[str, Any], key: str) -> bool | None:
    value = data.get(key)
    return value if isinstance(value, bool) else None


def _kv_heads(data: dict[str, Any], heads: int) -> tuple[int, str | None]:
    multi_query = _flag(data, "multi_query")
    counts = {key: data[key] for key in ("num_key_value_heads", "num_kv_heads", "n_head_kv") if data.get(key)}
    if multi_query and any(count != 1 for count in counts.values()):
        named = ", ".join(f"{key} {value}" for key, value in counts.items())
        raise Unreadable(f"multi_query says one key/value head and {named} says otherwise")
    if len(set(counts.values())) > 1:
        raise Unreadable(f"its key/value head counts disagree ({counts})")
    if multi_query:
        return 1, None
    if counts:
        return int(next(iter(counts.values()))), None
    return heads, "one key/value head a query head (no num_key_value_heads, num_kv_heads or multi_query)"


def _parallel(data: dict[str, Any]) -> tuple[bool, int, str | None]:
    """(parallel residual, pre-norms, assumption)."""
    said = {key: data[key] for key in PARALLEL_KEYS if isinstance(data.get(key), bool)}
    if len(set(said.values())) > 1:
        raise Unreadable(f"its parallel-residual keys disagree ({said})")
    if not any(said.values()):
        return False, 2, None
    if "use_parallel_residual" in said:
        return True, 2, "a parallel block with a norm before attention and one before the MLP (GPT-NeoX's)"
    return True, 1, "a parallel block with one norm read by attention and the MLP (GPT-J's, Falcon-7B's)"


def _biases(data: dict[str, Any]) -> tuple[bool, bool, list[str]]:
    """(attention biases, MLP biases, assumptions) from `attention_bias`, `mlp_bias`, `bias`, `use_bias`, `no_bias`."""
    general = [value for value in (data.get("bias"), data.get("use_bias")) if isinstance(value, bool)]
    if isinstance(data.get("no_bias"), bool):
        general.append(not data["no_bias"])
    if len(set(general)) > 1:
        raise Unreadable("its bias keys disagree (bias, use_bias, no_bias)")
    default = general[0] if general else None
    attention = _flag(data, "attention_bias")
    mlp = _flag(data, "mlp_bias")
    assumed = []
    if attention is None and default is None:
        assumed.append("no biases on the attention's projections")
    if mlp is None and default is None:
        assumed.append("no biases on the MLP's projections")
    attention_bias = attention if attention is not None else bool(default)
    return attention_bias, mlp if mlp is not None else bool(default), assumed


def read_unknown_layout(
    data: dict[str, Any], family: str, heads: int, activation: str
) -> tuple[dict[str, Any], list[str]]:
    """The layout of an unknown family's layer from its config's keys, and what was assumed. Raises Unreadable."""
    assumed: list[str] = []
    kv_heads, kv_assumed = _kv_heads(data, heads)
    assumed += [kv_assumed] if kv_assumed else []
    parallel, pre_norms, parallel_assumed = _parallel(data)
    assumed += [parallel_assumed] if parallel_assumed else []
    attention_bias, mlp_bias, bias_assumed = _biases(data)
    assumed += bias_assumed
    layer_norm = any(data.get(key) is not None for key in LAYER_NORM_KEYS)
    rms_norm = any(data.get(key) is not None for key in RMS_NORM_KEYS)
    if layer_norm == rms_norm:
        assumed.append(
            "RMSNorm (the config names both norms' epsilons)" if layer_norm else "RMSNorm (the config names no norm)"
        )
    norm = "layer" if layer_norm and not rms_norm else "rms"
    if norm == "layer" and not mlp_bias and not attention_bias:
        norm = "layer_weight_only"
    attention: dict[str, Any] = data["attn_config"] if isinstance(data.get("attn_config"), dict) else {}
    alibi = data.get("alibi") is True or attention.get("alibi") is True
    rotary = any(data.get(key) is not None for key in ROTARY_KEYS)
    if alibi and rotary and data.get("position_embedding_type") == "rotary":
        raise Unreadable("it names both ALiBi and rotary positions")
    positions = "alibi" if alibi else "rotary"
    if not alibi and not rotary:
        assumed.append(
            "rotary positions: the config names neither rotary nor ALiBi positions, and a learned position table "
            "(max_position_embeddings rows) cannot be told from it"
        )
    gated_said = [data[key] for key in GATED_KEYS if isinstance(data.get(key), bool)]
    if len(set(gated_said)) > 1:
        raise Unreadable(f"its gated-MLP keys disagree ({', '.join(GATED_KEYS)})")
    if gated_said:
        gated = gated_said[0]
    elif activation in GATED_ACTIVATIONS:
        gated = True
        assumed.append(f"a gated MLP (gate, up, down), as every {activation} decoder in transformers")
    else:
        raise Unreadable(
            f"its MLP's kind: hidden_act {activation!r} and no key saying gated (gate, up and down) or plain (two "
            "projections), which differ by half the MLP's parameters"
        )
    assumed.insert(0, f"{family} is no family gpuanat knows: its layer read from its config's keys")
    layout = {
        "kv_heads": kv_heads,
        "norm": norm,
        "pre_norms": pre_norms,
        "parallel_residual": parallel,
        "attention_bias": attention_bias,
        "output_bias": attention_bias,
        "mlp_bias": mlp_bias,
        "gated_mlp": gated,
        "positions": positions,
    }
    return layout, assumed
