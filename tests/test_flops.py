"""Achieved TFLOP/s and MFU (issue #18): the model's FLOPs per sample from its shape, against NVIDIA's dense peaks."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import last_json, run_cli

from gpuanat.core.measure.flops import dense_peak_tflops, flops_per_sample, math_mode, utilization
from gpuanat.core.vocabulary.config import RunConfig


def test_bert_large_flops_are_six_per_weight_and_token_plus_attention():
    """Written out from BERT-large's shape, not from gpuanat's parameter tables: 24 layers of four h×h and two h×i
    matrices, attention's QKᵀ and AV over 512 tokens."""
    h, i, layers, seq = 1024, 4096, 24, 512
    matmul = layers * (4 * h * h + 2 * h * i)
    attention = layers * 2 * 2 * seq * h
    assert flops_per_sample(RunConfig(seq_len=seq)) == (6 * matmul + 3 * attention) * seq
    # about 1.0 TFLOP a sample: the 310 samples/s on the H100 are 311 TFLOP/s, 31% of 989
    speed = utilization(RunConfig(precision="bf16", batch_size=128, tf32=True), 310, "NVIDIA H100 80GB HBM3", 1)
    assert speed.achieved_tflops == pytest.approx(311.6, abs=0.1) and speed.mfu == pytest.approx(0.315, abs=0.001)


def test_a_frozen_base_costs_four_flops_a_weight_and_a_tied_head_counts_as_a_matmul():
    llama = RunConfig(preset="llama-3.2-1b", seq_len=1024, precision="bf16")
    full, lora = flops_per_sample(llama), flops_per_sample(llama.replace(lora=16))
    layers, h, q, kv, i, vocab, seq = 16, 2048, 2048, 512, 8192, 128_256, 1024
    matmul = layers * (h * q + 2 * h * kv + q * h + 3 * h * i) + vocab * h  # the tied embedding as the LM head
    attention = layers * 2 * 2 * seq * q
    assert full == (6 * matmul + 3 * attention) * seq
    assert lora < full and lora > (4 * matmul + 3 * attention) * seq  # + the adapters' 6 a weight
    assert flops_per_sample(RunConfig(model="some/checkpoint")) is None


@pytest.mark.parametrize(
    ("name", "config", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", RunConfig(precision="bf16"), 989.4),
        ("NVIDIA H100 80GB HBM3", RunConfig(precision="fp32", tf32=True), 494.7),
        ("NVIDIA H100 80GB HBM3", RunConfig(precision="fp32"), 66.9),
        ("NVIDIA H100 PCIe", RunConfig(precision="fp16"), 756.5),
        ("NVIDIA H200", RunConfig(precision="bf16"), 989.4),
        ("NVIDIA A100-SXM4-80GB", RunConfig(precision="bf16"), 312.0),
    ],
)
def test_the_dense_peak_of_each_gpu_kind_and_math_mode(name, config, peak):
    assert dense_peak_tflops(name, math_mode(config)) == peak


def test_what_is_said_where_the_mfu_is_not_known():
    assert utilization(RunConfig(precision="bf16"), 100, "NVIDIA GeForce GTX 1080", 1).reason == (
        "no dense peak known for NVIDIA GeForce GTX 1080"
    )
    cpu = utilization(RunConfig(device="cpu"), 2.0, None, 1)
    assert cpu.achieved_tflops == pytest.approx(2.0 * flops_per_sample(RunConfig()) / 1e12) and cpu.mfu is None
    assert cpu.reason == "no peak known for a CPU"
    two = utilization(RunConfig(precision="bf16", gpus="2", distributed="ddp"), 600, "NVIDIA H200", 2)
    assert two.peak_tflops == pytest.approx(2 * 989.4)  # every rank's samples against both GPUs' peak


def test_a_cpu_run_reports_its_achieved_flops_and_why_no_mfu(db_path):
    completed = run_cli(
        ["run", "--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "64", "--json"], db_path
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = last_json(completed.stdout)
    config = RunConfig.from_json(result["config"])
    assert result["flops_per_sample"] == flops_per_sample(config)
    assert result["achieved_tflops"] == pytest.approx(
        flops_per_sample(config) * result["steady_samples_per_second"] / 1e12
    )
    assert result["mfu"] is None and result["unavailable"]["mfu"] == "no peak known for a CPU"
    human = run_cli(["history", "--format", "csv"], db_path).stdout
    assert "achieved_tflops" in human.splitlines()[0] or "TFLOP/s" in human.splitlines()[0]


# --- any model: the FLOPs the probe counts in the model itself (issue #29) -----------------------------------------


def _meta_model(model_config, causal: bool, lora: int = 0):
    """The model on the meta device (shapes, no memory), with LoRA as gpuanat adds it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    from gpuanat.worker.model import with_lora

    head = AutoModelForCausalLM if causal else AutoModelForSequenceClassification
    with torch.device("meta"):
        model = head.from_config(model_config)
    if not causal:
        model.config.num_labels = 2
    return with_lora(model, RunConfig(lora=lora)) if lora else model


def _counted(model, seq_len: int) -> int | None:
    from gpuanat.core.measure.flops import flops_per_sample_of_model
    from gpuanat.core.vocabulary.protocol import ModelInfo
    from gpuanat.worker.probe.model_flops import model_flops

    info = ModelInfo(
        params=0, trainable_params=0, weights_bytes=0, dtype="float32", total_steps=1, **model_flops(model)
    )
    return flops_per_sample_of_model(info, seq_len)


@pytest.mark.parametrize(
    ("preset", "lora"),
    [
        *((preset, 0) for preset in ("bert-base", "gpt2", "tiny", "llama-3.2-1b", "qwen2.5-0.5b", "mistral-7b")),
        # LoRA on the decoders (on a classifier the formula estimates its adapters: PEFT also trains a copy of the head)
        *((preset, 16) for preset in ("llama-3.2-1b", "qwen2.5-0.5b", "mistral-7b")),
    ],
)
def test_counted_in_the_model_a_preset_s_flops_are_its_formula_s(preset, lora):
    """Two counts that share nothing: the preset's formula from its dimensions, and the probe's walk of the model
    transformers builds (its linear layers, its config's attention)."""
    from gpuanat.core.vocabulary.presets import PRESETS
    from gpuanat.worker.model import preset_model_config

    config = RunConfig(preset=preset, seq_len=256, lora=lora)
    causal = PRESETS[preset].objective == "causal-lm"
    assert _counted(_meta_model(preset_model_config(PRESETS[preset]), causal, lora), 256) == flops_per_sample(config)


CONFIGS = Path(__file__).resolve().parent.parent / "benchmarks" / "configs"


def test_a_sliding_window_model_counts_its_windowed_layers_at_their_window():
    from transformers import AutoConfig

    gemma = AutoConfig.from_pretrained(CONFIGS / "gemma-3-1b")
    sliding = gemma.layer_types.count("sliding_attention")
    assert 0 < sliding < gemma.num_hidden_layers and gemma.sliding_window == 512
    h, i, width, kv, vocab, seq = 1152, 6912, 4 * 256, 256, 262_144, 2048
    matmul = 26 * (h * width + 2 * h * kv + width * h + 3 * h * i) + vocab * h  # tied head
    attention = (26 - sliding) * width * seq + sliding * width * 512
    assert _counted(_meta_model(gemma, causal=True), seq) == (6 * matmul + 3 * 2 * 2 * attention) * seq


def test_a_mixture_of_experts_counts_the_experts_a_token_visits():
    from transformers import AutoConfig

    granite = AutoConfig.from_pretrained(CONFIGS / "granite-3.1-1b-a400m")
    h, q, kv, experts, visited, i, vocab, seq = 1024, 1024, 512, 32, 8, 512, 49_155, 1024
    per_layer = h * q + 2 * h * kv + q * h + h * experts + visited * (h * 2 * i + i * h)  # router, visited experts
    matmul = 24 * per_layer + vocab * h
    assert _counted(_meta_model(granite, causal=True), seq) == (6 * matmul + 3 * 2 * 2 * 24 * q * seq) * seq


def test_a_run_of_a_config_json_reports_its_flops_and_a_short_run_says_why_it_has_none(db_path, tmp_path):
    from transformers import LlamaConfig

    model_dir = tmp_path / "tiny-llama"
    LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    ).save_pretrained(model_dir)
    args = [
        "run",
        "--model",
        str(model_dir / "config.json"),
        "--device",
        "cpu",
        "--seq-len",
        "32",
        "--batch-size",
        "4",
        "--json",
    ]
    completed = run_cli([*args, "--samples", "96"], db_path, extra_env={"HF_HUB_OFFLINE": "1"})
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = last_json(completed.stdout)
    h, i, q, kv, vocab, seq = 64, 128, 64, 32, 512, 32
    matmul = 2 * (h * q + 2 * h * kv + q * h + 3 * h * i) + vocab * h  # the untied LM head
    assert result["flops_per_sample"] == (6 * matmul + 3 * 2 * 2 * 2 * q * seq) * seq
    assert result["achieved_tflops"] == pytest.approx(
        result["flops_per_sample"] * result["steady_samples_per_second"] / 1e12
    )
    short = last_json(run_cli([*args, "--samples", "8"], db_path, extra_env={"HF_HUB_OFFLINE": "1"}).stdout)
    assert short["achieved_tflops"] is None and short["flops_per_sample"] == result["flops_per_sample"]
    assert short["unavailable"]["achieved_tflops"].startswith("no steady samples/s: ")
    assert short["unavailable"]["achieved_tflops"] == short["unavailable"]["mfu"]
