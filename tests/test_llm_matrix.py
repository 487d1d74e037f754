"""benchmarks/llm_matrix.py on the CPU: its smoke set trains every code path (full, LoRA, the QLoRA path unquantized,
BERT and gpt2 with both heads) with plain HF Trainer and records what the GPU sets record; Liger's process-wide
patches are put back after a configuration that used them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "benchmarks"))
import llm_matrix

BENCHMARKS = Path(__file__).parent.parent / "benchmarks"

RECORD_KEYS = {
    "key",
    "config",
    "status",
    "steps",
    "max_memory_allocated_bytes",
    "max_memory_reserved_bytes",
    "params_total",
    "params_trainable",
    "weights_bytes_by_dtype",
    "logits_bytes",
    "bands",
    "seconds",
    "build_s",
    "train_s",
    "predicted",
    "allocated_at_start_bytes",
    "build_peak_allocated_bytes",
}


def test_the_smoke_set_trains_every_configuration_on_the_cpu(tmp_path):
    out = tmp_path / "smoke.json"
    completed = subprocess.run(
        [
            sys.executable,
            str(BENCHMARKS / "llm_matrix.py"),
            "--set",
            "smoke",
            "--device",
            "cpu",
            "--steps",
            "1",
            "--out",
            str(out),
            "--model-dir",
            str(tmp_path / "models"),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": ""},
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    runs = json.loads(out.read_text())["runs"]
    assert [run["key"] for run in runs] == [case.key for case in llm_matrix.smoke_set("cpu")]
    for run in runs:
        assert run["status"] == "ok", (run["key"], run.get("error"), run.get("traceback"))
        assert run.keys() >= RECORD_KEYS, (run["key"], RECORD_KEYS - run.keys())
        assert run["max_memory_allocated_bytes"] is None  # no allocator peaks on the CPU
        assert len(run["steps"]) == 1 and run["bands"]["weights_bytes"] > 0
        assert run["trainable_tensors_with_grad"] == run["trainable_tensors"] > 0  # gradients reach every adapter
        assert run["predicted"]["peak_allocated_bytes"] > 0
        if run["config"]["lora"]:
            assert 0 < run["params_trainable"] < run["params_total"]
        else:
            assert run["params_trainable"] == run["params_total"]
        if run["config"]["objective"] == "causal-lm":  # batch × seq × vocabulary, fp32
            vocabulary = llm_matrix.PRESETS[run["config"]["preset"]].vocab_size
            assert run["logits_bytes"] == run["config"]["batch_size"] * 64 * vocabulary * 4
        if run["config"]["grad_checkpointing"]:
            assert run["checkpointing"]["enabled"]
    qlora = [run for run in runs if run["config"]["qlora"]]
    assert [run["qlora_base"] for run in qlora] == ["loaded", "reused"]
    full = next(run for run in runs if run["key"] == "llama-tiny lm s64 b2 fp32 adamw_torch_fused")
    for band in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes", "logits_bytes"):
        assert full["bands"][band] == full["predicted"][band], band
    assert "lm s64" in completed.stdout and "statuses: ok" in completed.stdout


def test_liger_patches_are_put_back_after_the_configuration(tmp_path):
    """Liger's apply function (run by the Trainer inside the block) rebinds the family's module globals and class
    methods for the whole process: what it writes there, as it does, is undone on the way out."""
    from transformers.models.llama import modeling_llama

    original_mlp, original_forward = modeling_llama.LlamaMLP, modeling_llama.LlamaForCausalLM.__dict__["forward"]
    with llm_matrix.liger_patched(llm_matrix.Case("llama-tiny", "causal-lm", 64, 2, liger=True)) as info:
        assert info == {"applied": "TrainingArguments(use_liger_kernel=True)", "fused_linear_cross_entropy": True}
        modeling_llama.LlamaMLP = type("LigerSwiGLUMLP", (original_mlp,), {})
        modeling_llama.LlamaForCausalLM.forward = lambda self, *args, **kwargs: None
        modeling_llama.liger_added_global = True
    assert modeling_llama.LlamaMLP is original_mlp
    assert modeling_llama.LlamaForCausalLM.__dict__["forward"] is original_forward
    assert not hasattr(modeling_llama, "liger_added_global")
    with llm_matrix.liger_patched(
        llm_matrix.Case("qwen3-0.6b", "causal-lm", 64, 2, liger=True, liger_loss=False)
    ) as info:  # a config.json's family
        assert not info["fused_linear_cross_entropy"]
        arguments, _ = llm_matrix.training_arguments(
            llm_matrix.Case("qwen3-0.6b", "causal-lm", 64, 2, liger=True, liger_loss=False),
            llm_matrix.Context(device="cpu", steps=1, probe=False, qlora=None),
            str(tmp_path),
        )
        assert arguments.use_liger_kernel and arguments.liger_kernel_config == {"fused_linear_cross_entropy": False}
