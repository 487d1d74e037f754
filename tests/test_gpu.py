"""GPU-only checks, run on the lent GPU machine by `scripts/gpu_check.sh tests` (skipped without CUDA).

The same real CLI and worker as the CPU tests, on bert-base: exact tensor bytes on the device,
SDPA vs eager activations, and a real CUDA out-of-memory that releases the GPU.
"""

from __future__ import annotations

import pytest
from conftest import last_json, run_cli

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
BERT_BASE = ["--preset", "bert-base", "--device", "cuda", "--seq-len", "512", "--samples", "64", "--max-steps", "6"]


def bert_base_counts() -> dict[str, int]:
    from transformers import AutoModelForSequenceClassification, BertConfig

    model = AutoModelForSequenceClassification.from_config(BertConfig())  # BertConfig() is bert-base
    parameters = list(model.parameters())
    return {
        "params": sum(p.numel() for p in parameters),
        "tensors": len(parameters),
        "buffer_bytes": sum(b.numel() * b.element_size() for b in model.buffers()),
    }


def test_exact_bytes_on_the_gpu(db_path):
    completed = run_cli(["run", *BERT_BASE, "--batch-size", "8", "--json"], db_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    counts = bert_base_counts()
    bands = result["bands"]
    assert bands["weights_bytes"] == 4 * counts["params"] + counts["buffer_bytes"]
    assert bands["gradients_bytes"] == 4 * counts["params"]
    # fused AdamW keeps its fp32 step counters on the device too
    assert bands["optimizer_state_bytes"] == 8 * counts["params"] + 4 * counts["tensors"]
    assert result["peak_allocated_bytes"] > bands["weights_bytes"] + bands["gradients_bytes"]
    assert result["device_memory_used_bytes"] >= result["peak_reserved_bytes"]
    # The CUDA context, kernels and library workspaces of one process: hundreds of MiB, not GiBs.
    assert 200 * 1024**2 < bands["cuda_context_bytes"] < 3 * 1024**3
    assert bands["temporaries_and_cache_bytes"] >= 0


def test_eager_attention_keeps_the_s_squared_probabilities(db_path):
    results = {}
    for attn in ("sdpa", "eager"):
        completed = run_cli(["run", *BERT_BASE, "--batch-size", "8", "--attn", attn, "--json"], db_path)
        assert completed.returncode == 0, completed.stderr[-3000:]
        results[attn] = last_json(completed.stdout)["bands"]["activations_bytes"]
    # eager saves softmax output and dropout mask per layer: ≥ 12 layers × 12 heads × 512² × 4 B × batch 8
    assert results["eager"] - results["sdpa"] >= 12 * 12 * 512 * 512 * 4 * 8


def test_real_oom_is_recorded_and_the_memory_released(db_path):
    import pynvml

    completed = run_cli(
        ["run", "--preset", "bert-large", "--device", "cuda", "--batch-size", "512", "--max-steps", "2", "--json"],
        db_path,
    )
    assert completed.returncode == 3, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert result["status"] == "oom" and result["error"]["kind"] == "oom"
    assert result["peak_allocated_bytes"] > 1024**3
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        pids = [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)]
    finally:
        pynvml.nvmlShutdown()
    assert pids == [], f"processes still holding GPU memory: {pids}"
