"""The pre-run estimate: parameter shapes against the real models, state sizes against the probe."""

from __future__ import annotations

import pytest
from transformers import AutoModelForSequenceClassification, BertConfig, GPT2Config

from gpuanat.core.config import RunConfig
from gpuanat.core.predict import estimate_memory, parameter_shapes
from gpuanat.core.presets import PRESETS


def real_model(name: str):
    preset = PRESETS[name]
    if preset.family == "bert":
        config = BertConfig(vocab_size=preset.vocab_size, hidden_size=preset.hidden_size,
                            num_hidden_layers=preset.num_layers, num_attention_heads=preset.num_heads,
                            intermediate_size=preset.intermediate_size, max_position_embeddings=preset.max_positions)
    else:
        config = GPT2Config(vocab_size=preset.vocab_size, n_embd=preset.hidden_size, n_layer=preset.num_layers,
                            n_head=preset.num_heads, n_inner=preset.intermediate_size,
                            n_positions=preset.max_positions, pad_token_id=preset.vocab_size - 1)
    return AutoModelForSequenceClassification.from_config(config)


@pytest.mark.parametrize("name", ["tiny", "bert-base", "gpt2"])
def test_parameter_shapes_match_the_real_model(name):
    model = real_model(name)
    shapes = parameter_shapes(PRESETS[name])
    parameters = list(model.parameters())
    assert shapes.params == sum(p.numel() for p in parameters)
    assert shapes.tensors == len(parameters)
    assert sorted(shapes.vectors) == sorted(p.numel() for p in parameters if p.dim() == 1)
    assert shapes.buffer_bytes == sum(b.nbytes for b in model.buffers())


def test_tensor_band_estimates_for_bert_large():
    shapes = parameter_shapes(PRESETS["bert-large"])
    estimate = estimate_memory(RunConfig())
    assert shapes.params == 335_143_938  # bert-large-uncased with a 2-label head
    assert estimate.weights_bytes == 4 * shapes.params + 8192
    assert estimate.gradients_bytes == 4 * shapes.params
    assert estimate.optimizer_state_bytes == 8 * shapes.params + 4 * shapes.tensors
    assert estimate_memory(RunConfig(optim="sgd")).optimizer_state_bytes == 0


def test_techniques_move_the_estimate_the_right_way():
    vanilla = estimate_memory(RunConfig())
    assert estimate_memory(RunConfig(batch_size=8)).activations_bytes == 2 * vanilla.activations_bytes
    assert estimate_memory(RunConfig(grad_checkpointing=True)).activations_bytes < vanilla.activations_bytes / 5
    assert estimate_memory(RunConfig(attn="eager")).activations_bytes > vanilla.activations_bytes
    assert estimate_memory(RunConfig(optim="adafactor")).peak_allocated_bytes < vanilla.peak_allocated_bytes
    accumulating = estimate_memory(RunConfig(batch_size=1, grad_accum=4))
    assert accumulating.peak_allocated_bytes - accumulating.activations_bytes == (
        vanilla.peak_allocated_bytes - vanilla.activations_bytes + vanilla.gradients_bytes)
