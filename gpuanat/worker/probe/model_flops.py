"""A model's FLOPs a token, counted from the model itself: the same count for a preset, a user's config.json, a
checkpoint or a script's model, with no table of families.

As `gpuanat.core.measure.flops` counts them (PaLM, appendix B): every matmul weight costs 2 FLOPs a token forward and
4 backward when it trains, 2 when it is frozen (its input's gradient only); attention's QKᵀ and AV cost
2 × 2 × positions × heads × head_dim a token and layer forward, 3 times that in training. The matmul weights are
the model's linear layers (`nn.Linear` and its subclasses, 4-bit ones by their logical shape, transformers'
`Conv1D`, a router's weight) and a mixture of experts' stacked expert weights, scaled by the share of experts a
token visits; embeddings are lookups, not matmuls; a sequence classifier's pooler and head act on one token a
sample and are left out. The attention's shape comes from the model's config (heads, head_dim, layers, sliding windows).
"""

from __future__ import annotations

from typing import Any

from torch import nn

ONE_TOKEN_HEADS = ("classifier", "score", "pooler")
"""A sequence classifier's modules that act on one token a sample (BERT's pooler and classifier, GPT-2's score)."""


def _linear_weights(module: nn.Module) -> int | None:
    """in × out of a linear layer (of any storage: a 4-bit weight is packed), None for other modules. A module
    that is no embedding but holds a 2-D `weight` of its own multiplies by it too (transformers' Conv1D in GPT-2,
    a mixture of experts' router)."""
    if isinstance(module, nn.Linear):
        return module.in_features * module.out_features
    weight = module._parameters.get("weight")
    if weight is not None and weight.dim() == 2 and not isinstance(module, nn.Embedding):
        return weight.numel()
    return None


def _is_sequence_classifier(model: nn.Module) -> bool:
    return any(type(part).__name__.endswith("ForSequenceClassification") for part in model.modules())


def _config(model: nn.Module) -> Any:
    config = getattr(model, "config", None)
    if config is None:  # a PEFT wrapper: the base model's
        config = getattr(getattr(model, "base_model", None), "config", None)
    return getattr(config, "text_config", None) or config


def matmul_flops_per_token(model: nn.Module) -> int:
    """6 × the trained matmul weights + 4 × the frozen ones a token uses."""
    classifier = _is_sequence_classifier(model)
    config = _config(model)
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    experts_per_token = getattr(config, "num_experts_per_tok", None)
    total = 0
    for name, module in model.named_modules():
        if classifier and any(part in ONE_TOKEN_HEADS for part in name.split(".")):
            continue
        weights = _linear_weights(module)
        if weights is not None:
            trains = any(parameter.requires_grad for parameter in module.parameters(recurse=False))
            total += (6 if trains else 4) * weights
            continue
        if experts and experts_per_token and "expert" in name.rsplit(".", 1)[-1].lower():
            for parameter in module.parameters(recurse=False):
                if parameter.dim() == 3:  # (experts, out, in): each token visits experts_per_token of them
                    share = parameter.numel() * experts_per_token // experts
                    total += (6 if parameter.requires_grad else 4) * share
    return total


def attention_widths(model: nn.Module) -> tuple[int | None, dict[str, int] | None]:
    """(Σ heads × head_dim of the layers attending to every position, the same by window for sliding-window
    layers); (None, None) where the config does not say."""
    config = _config(model)
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not (isinstance(layers, int) and isinstance(heads, int) and heads > 0):
        return None, None
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if isinstance(hidden, int) else None)
    if not isinstance(head_dim, int):
        return None, None
    width = heads * head_dim
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None) or []
    sliding = sum(1 for kind in layer_types if kind == "sliding_attention") if isinstance(window, int) else 0
    windowed = {str(window): sliding * width} if sliding else None
    return (layers - sliding) * width, windowed


def model_flops(model: nn.Module) -> dict[str, Any]:
    """The ModelInfo fields of the model's FLOPs; empty where they cannot be counted (never raises)."""
    try:
        full, windowed = attention_widths(model)
        if full is None:
            return {}
        return {
            "matmul_flops_per_token": matmul_flops_per_token(model),
            "attention_width": full,
            "windowed_attention_width": windowed,
        }
    except Exception:  # a model this does not understand: no FLOPs, and the run goes on
        return {}
