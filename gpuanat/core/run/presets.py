"""Model presets: the shapes of the models gpuanat trains when no weights are given.

Plain data, so the CLI can validate and the predictor can reason about shapes without torch.
The worker turns a preset into a transformers config and builds the model with random weights,
which have the same memory and speed as pretrained ones and need no download.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ModelPreset:
    name: str
    family: str
    """Which transformers config class builds it: "bert" or "gpt2"."""
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    """Longest sequence the position embeddings allow."""
    description: str


PRESETS: dict[str, ModelPreset] = {
    preset.name: preset
    for preset in (
        ModelPreset(
            name="bert-large",
            family="bert",
            hidden_size=1024,
            num_layers=24,
            num_heads=16,
            intermediate_size=4096,
            vocab_size=30522,
            max_positions=512,
            description="bert-large-uncased shape (335M params), the HF docs' reference workload",
        ),
        ModelPreset(
            name="bert-base",
            family="bert",
            hidden_size=768,
            num_layers=12,
            num_heads=12,
            intermediate_size=3072,
            vocab_size=30522,
            max_positions=512,
            description="bert-base-uncased shape (110M params)",
        ),
        ModelPreset(
            name="gpt2",
            family="gpt2",
            hidden_size=768,
            num_layers=12,
            num_heads=12,
            intermediate_size=3072,
            vocab_size=50257,
            max_positions=1024,
            description="gpt2 (124M params) with a sequence-classification head",
        ),
        ModelPreset(
            name="tiny",
            family="bert",
            hidden_size=64,
            num_layers=2,
            num_heads=2,
            intermediate_size=128,
            vocab_size=30522,
            max_positions=512,
            description="a few-MB BERT for CPU tests and smoke runs",
        ),
    )
}

DEFAULT_PRESET = "bert-large"
