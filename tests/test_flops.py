"""Achieved TFLOP/s and MFU (issue #18): the model's FLOPs per sample from its shape, against NVIDIA's dense peaks."""

from __future__ import annotations

import pytest
from conftest import last_json, run_cli

from gpuanat.core.run.config import RunConfig
from gpuanat.core.run.flops import dense_peak_tflops, flops_per_sample, math_mode, utilization


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


@pytest.mark.parametrize(("name", "config", "peak"), [
    ("NVIDIA H100 80GB HBM3", RunConfig(precision="bf16"), 989.4),
    ("NVIDIA H100 80GB HBM3", RunConfig(precision="fp32", tf32=True), 494.7),
    ("NVIDIA H100 80GB HBM3", RunConfig(precision="fp32"), 66.9),
    ("NVIDIA H100 PCIe", RunConfig(precision="fp16"), 756.5),
    ("NVIDIA H200", RunConfig(precision="bf16"), 989.4),
    ("NVIDIA A100-SXM4-80GB", RunConfig(precision="bf16"), 312.0),
])
def test_the_dense_peak_of_each_gpu_kind_and_math_mode(name, config, peak):
    assert dense_peak_tflops(name, math_mode(config)) == peak


def test_what_is_said_where_the_mfu_is_not_known():
    assert utilization(RunConfig(precision="bf16"), 100, "NVIDIA GeForce GTX 1080", 1).reason == (
        "no dense peak known for NVIDIA GeForce GTX 1080")
    cpu = utilization(RunConfig(device="cpu"), 2.0, None, 1)
    assert cpu.achieved_tflops == pytest.approx(2.0 * flops_per_sample(RunConfig()) / 1e12) and cpu.mfu is None
    assert cpu.reason == "no peak known for a CPU"
    two = utilization(RunConfig(precision="bf16", gpus="2", distributed="ddp"), 600, "NVIDIA H200", 2)
    assert two.peak_tflops == pytest.approx(2 * 989.4)  # every rank's samples against both GPUs' peak


def test_a_cpu_run_reports_its_achieved_flops_and_why_no_mfu(db_path):
    completed = run_cli(["run", "--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "64",
                         "--json"], db_path)
    assert completed.returncode == 0, completed.stderr[-2000:]
    result = last_json(completed.stdout)
    config = RunConfig.from_json(result["config"])
    assert result["flops_per_sample"] == flops_per_sample(config)
    assert result["achieved_tflops"] == pytest.approx(
        flops_per_sample(config) * result["steady_samples_per_second"] / 1e12)
    assert result["mfu"] is None and result["unavailable"]["mfu"] == "no peak known for a CPU"
    human = run_cli(["history", "--format", "csv"], db_path).stdout
    assert "achieved_tflops" in human.splitlines()[0] or "TFLOP/s" in human.splitlines()[0]
