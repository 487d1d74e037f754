"""Model presets: the shapes of the models gpuanat trains when no weights are given.

Plain data, so the CLI can validate and the predictor can reason about shapes without torch.
The worker turns a preset into a transformers config and builds the model with random weights,
which have the same memory and speed as pretrained ones and need no download.
"""

from __future__ import annotations

from dataclasses import dataclass

DECODER_FAMILIES = ("llama", "qwen2", "mistral")
"""Decoder LLMs, trained as causal language models (labels = the input ids)."""


@dataclass(frozen=True)
class ModelPreset:
    name: str
    family: str
    """Which transformers config class builds it: "bert", "gpt2", or one of `DECODER_FAMILIES`."""
    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int
    vocab_size: int
    max_positions: int
    """Longest sequence the position embeddings allow."""
    description: str
    num_kv_heads: int | None = None
    """Key/value heads of grouped-query attention; None: as many as `num_heads`."""
    tie_word_embeddings: bool = False
    """The LM head shares the input embeddings' weights."""
    attention_bias: bool = False
    """Biases on the query, key and value projections (Qwen2)."""

    @property
    def objective(self) -> str:
        """ "causal-lm" for decoders, else "classification" (a 2-label head, as in the HF docs)."""
        return "causal-lm" if self.family in DECODER_FAMILIES else "classification"

    @property
    def kv_heads(self) -> int:
        return self.num_kv_heads or self.num_heads

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


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
        # Decoders: their published config.json values (Hugging Face Hub, 2026), random weights.
        ModelPreset(
            name="llama-3.2-1b",
            family="llama",
            hidden_size=2048,
            num_layers=16,
            num_heads=32,
            num_kv_heads=8,
            intermediate_size=8192,
            vocab_size=128256,
            max_positions=131072,
            tie_word_embeddings=True,
            description="meta-llama/Llama-3.2-1B shape (1.24B params), causal LM",
        ),
        ModelPreset(
            name="llama-3.1-8b",
            family="llama",
            hidden_size=4096,
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            intermediate_size=14336,
            vocab_size=128256,
            max_positions=131072,
            description="meta-llama/Llama-3.1-8B shape (8.03B params), causal LM",
        ),
        ModelPreset(
            name="qwen2.5-0.5b",
            family="qwen2",
            hidden_size=896,
            num_layers=24,
            num_heads=14,
            num_kv_heads=2,
            intermediate_size=4864,
            vocab_size=151936,
            max_positions=32768,
            tie_word_embeddings=True,
            attention_bias=True,
            description="Qwen/Qwen2.5-0.5B shape (494M params), causal LM",
        ),
        ModelPreset(
            name="qwen2.5-7b",
            family="qwen2",
            hidden_size=3584,
            num_layers=28,
            num_heads=28,
            num_kv_heads=4,
            intermediate_size=18944,
            vocab_size=152064,
            max_positions=32768,
            attention_bias=True,
            description="Qwen/Qwen2.5-7B shape (7.62B params), causal LM",
        ),
        ModelPreset(
            name="mistral-7b",
            family="mistral",
            hidden_size=4096,
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            intermediate_size=14336,
            vocab_size=32768,
            max_positions=32768,
            description="mistralai/Mistral-7B-v0.3 shape (7.25B params), causal LM",
        ),
        ModelPreset(
            name="llama-tiny",
            family="llama",
            hidden_size=64,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=128,
            vocab_size=32000,
            max_positions=2048,
            description="a few-MB Llama for CPU tests and smoke runs (causal LM, a 32k vocabulary)",
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
