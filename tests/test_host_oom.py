"""A run on the CPU that runs out of host memory ends `oom` (exit 3) and says host memory (RAM), not the GPU's; and
`gpuanat predict --device cpu` predicts host memory: no CUDA context, no allocator reserve, no GPU to fit.

The out-of-memory runs are real: `gpuanat run` and `gpuanat run --script` under a lowered address-space limit
(RLIMIT_AS, inherited by every process gpuanat starts), so that one allocation of the first training step cannot be
had on any machine, whatever its RAM. The numbers are in `HOST_LIMIT_BYTES`'s docstring.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest
import torch
from conftest import last_json, run_cli, start_cli, state_bytes
from transformers import BertConfig

from gpuanat.cli.run import out_of_memory_line
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.worker.out_of_memory import (
    failed_allocation_bytes,
    is_host_out_of_memory,
    is_out_of_memory,
    out_of_memory_message,
)

GIB = 1 << 30
SEQUENCE = 131_072
HEADS = 16
FAILING_ALLOCATION_BYTES = HEADS * SEQUENCE * SEQUENCE * 4
"""Eager attention's fp32 scores of one sequence of the first training step: 16 heads × 131,072² × 4 B = 1 TiB."""
HOST_LIMIT_BYTES = 128 * GIB
"""The address space each process of a run may map. The most a process of these runs mapped (VmPeak; the failing
allocation maps nothing): with torch 2.13 (CPU) and transformers 5.24 on a 2-core box, 0.39 GiB gpuanat, 0.59 GiB
its capability probe, 2.6 GiB the training child (0.75 GiB of it resident at most), 2.3 GiB the script child; with torch
2.11+cu130 on a 16-core H200 box, 3.7 GiB once torch is imported, 16.2 GiB once `torch.cuda.is_available()` has
initialised the driver, 19.9 GiB after a few CPU steps of this model with HF Trainer imported. 128 GiB leaves 6×
the most; the allocation that must fail is 8× above it. Everything the step allocates before the scores is a few
tensors of 131,072 tokens × 64 × 4 B = 32 MiB, so the run never holds more than it does here, on any machine."""


def lowered_address_space() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (HOST_LIMIT_BYTES, HOST_LIMIT_BYTES))


def long_sequence_bert(directory: Path) -> Path:
    """A BERT as small as the tiny preset (one layer) whose positions reach `SEQUENCE`, as a config.json."""
    path = directory / "long-bert" / "config.json"
    path.parent.mkdir()
    config = BertConfig(
        vocab_size=1000,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=HEADS,
        intermediate_size=128,
        max_position_embeddings=SEQUENCE,
    )
    path.write_text(config.to_json_string())
    return path


def run_under_the_limit(args: list[str], db: Path) -> tuple[int, str, str]:
    process = start_cli(args, db, offline_hub=True, preexec_fn=lowered_address_space)
    stdout, stderr = process.communicate(timeout=300)
    return process.returncode, stdout, stderr


def test_out_of_memory_is_the_gpus_or_the_hosts_and_nothing_else():
    with pytest.raises(RuntimeError) as host:  # 1 EiB: more than any machine's address space
        torch.empty(1 << 60, dtype=torch.uint8)
    with pytest.raises(MemoryError) as python:
        bytearray(1 << 60)
    gpu = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 MiB. GPU 0 has a total capacity of …")
    assert is_out_of_memory(host.value) and is_host_out_of_memory(host.value)
    assert failed_allocation_bytes(host.value) == 1 << 60 == failed_allocation_bytes(str(host.value))
    assert out_of_memory_message(host.value).startswith("out of host memory (RAM): DefaultCPUAllocator: ")
    assert is_out_of_memory(python.value) and failed_allocation_bytes(python.value) is None
    assert out_of_memory_message(python.value) == "out of host memory (RAM): MemoryError"
    assert is_out_of_memory(gpu) and not is_host_out_of_memory(gpu)
    assert failed_allocation_bytes(gpu) is None  # CUDA's size is rounded: no exact count to give
    assert out_of_memory_message(gpu) == str(gpu)
    for other in (RuntimeError("the loss went NaN"), ValueError("can't allocate memory"), KeyboardInterrupt()):
        assert not is_out_of_memory(other)


def test_a_cpu_run_out_of_host_memory_ends_oom_with_exit_3(tmp_path, db_path):
    model = long_sequence_bert(tmp_path)
    returncode, stdout, stderr = run_under_the_limit(
        [
            *("run", "--model", str(model), "--device", "cpu", "--attn", "eager", "--seq-len", str(SEQUENCE)),
            *("--batch-size", "1", "--samples", "1", "--json"),
        ],
        db_path,
    )
    assert returncode == 3, stderr[-3000:]
    result = last_json(stdout)
    assert result["status"] == "oom" and result["error"]["kind"] == "oom" and result["error"]["step"] == 1
    message = result["error"]["message"]
    assert message.startswith("out of host memory (RAM): DefaultCPUAllocator: can't allocate memory")
    assert failed_allocation_bytes(message) == FAILING_ALLOCATION_BYTES  # the scores, exactly
    failure = result["out_of_memory"]  # the anatomy at the failing allocation (#49): read from the traceback
    assert failure["failed_allocation_bytes"] == FAILING_ALLOCATION_BYTES
    assert (failure["phase"], failure["step"]) == ("forward", 1)
    assert failure["module"] == "bert.encoder.layer.0.attention.self"  # eager attention's scores: query x key
    assert failure["operation"].startswith("attn_weights = torch.matmul(query, key.transpose(")
    assert (
        failure["operation"].endswith("(transformers/models/bert/modeling_bert.py:126)")
        or ".py:" in failure["operation"]
    )
    weights = sum(row["parameters_bytes"] for row in result["modules"])
    assert weights == result["bands"]["weights_bytes"] > 0  # the model's, module by module
    assert "gpuanat: out of host memory (RAM) at step 1; try a smaller --batch-size" in stderr
    assert "GPU" not in stderr and "CUDA" not in stderr and "Traceback" not in stderr
    (finding,) = [finding for finding in result["diagnosis"] if finding["bottleneck"] == "memory-bound"]
    assert finding["evidence"] == "the run ran out of host memory (RAM)"
    assert "bnb" not in finding["fix"] and "expandable" not in finding["fix"]  # CUDA's alone


SCRIPT = f"""
import contextlib
import sys

import torch

import gpuanat.probe

model = torch.nn.Linear(8, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
tracked = "--probe" in sys.argv
with gpuanat.probe.track(model, optimizer, total_steps=3) if tracked else contextlib.nullcontext() as probe:
    for step in range(1, 4):
        rows = {FAILING_ALLOCATION_BYTES // 32} if step == 2 else 4  # step 2: a batch of 1 TiB (8 fp32 a row)
        loss = model(torch.randn(rows, 8)).sum()
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if tracked:
            probe.step(samples=rows, loss=loss)
"""
"""A loop of one's own whose second step's batch cannot be had; with `--probe`, gpuanat's probe tracks it."""


@pytest.mark.parametrize("probe", [False, True], ids=["the script runner says", "the probe says"])
def test_a_script_out_of_host_memory_ends_oom_with_exit_3(tmp_path, db_path, probe):
    """Without a probe the script runner reports the exception that ended the script; with `track`, the probe
    reports it first, in the step it was in."""
    script = tmp_path / "huge_batch.py"
    script.write_text(SCRIPT)
    returncode, stdout, stderr = run_under_the_limit(
        ["run", "--script", str(script), "--json", "--", *(["--probe"] if probe else [])], db_path
    )
    assert returncode == 3, stderr[-3000:]
    result = last_json(stdout)
    assert result["status"] == "oom" and result["error"]["kind"] == "oom"
    assert failed_allocation_bytes(result["error"]["message"]) == FAILING_ALLOCATION_BYTES
    assert "GPU" not in stderr and "CUDA" not in stderr
    if probe:  # the probe said which step, and the CPU it ran on
        assert result["error"]["step"] == 2
        assert "gpuanat: the script ran out of host memory (RAM): RuntimeError: " in stderr
    else:
        assert "gpuanat: the script ran out of memory: out of host memory (RAM): DefaultCPUAllocator" in stderr


def test_the_oom_line_of_a_gpu_run_is_as_it_was():
    """The injected OOM of tests/test_failures.py runs on the CPU, so the GPU's line is checked here, on the
    result of a GPU run."""
    config = RunConfig(batch_size=384)
    result = RunResult.from_json(
        {
            "status": "oom",
            "config": config.to_json(),
            "device": "cuda",
            "peak_allocated_bytes": 78 * GIB,
            "error": {"kind": "oom", "message": "CUDA out of memory.", "step": 1, "flag": None},
        }
    )
    assert out_of_memory_line(config, result) == (
        "out of GPU memory at step 1 (peak allocated 78.00 GiB); try a smaller --batch-size, --grad-checkpointing "
        "or --precision bf16"
    )
    on_the_cpu = config.replace(device="cpu")
    assert out_of_memory_line(on_the_cpu, result) == (
        "out of host memory (RAM) at step 1; try a smaller --batch-size, --grad-checkpointing or --precision bf16"
    )


def test_predict_on_the_cpu_speaks_of_host_memory_and_no_cuda_context(db_path):
    flags = ["--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--batch-size", "4"]
    human = run_cli(["predict", *flags], db_path, timeout_s=60)
    assert human.returncode == 0, human.stderr
    lines = human.stdout.splitlines()
    assert lines[0] == "Prediction for tiny bs4, seq 32, in host memory (process RAM):"
    (context,) = [line for line in lines if line.lstrip().startswith("cuda context")]
    assert context.split()[2:] == ["—", "(CPU", "run:", "no", "CUDA", "context)"]
    (device,) = [line for line in lines if line.lstrip().startswith("peak device")]
    assert "—" in device and "no GPU memory" in device
    assert lines[-1] == "Largest batch that fits: — (CPU run: its tensors are in host memory, no GPU's)"
    assert "give --gpu-memory" not in human.stdout and "NVML" not in human.stdout
    result = json.loads(run_cli(["predict", *flags, "--json"], db_path, timeout_s=60).stdout)
    assert result["cuda_context_bytes"] is None and result["peak_reserved_bytes"] is None
    assert result["peak_device_bytes"] is None and result["gpu_memory_bytes"] is None
    assert set(result["unavailable"]) == {"cuda_context_bytes", "peak_reserved_bytes", "peak_device_bytes"}
    assert result["max_batch_size"] is None and result["fit_ladder"] is None
    gpu = json.loads(run_cli(["predict", *flags[:2], *flags[4:], "--json"], db_path, timeout_s=60).stdout)
    assert result["peak_allocated_bytes"] < gpu["peak_allocated_bytes"]  # no cuBLAS workspaces
    assert "unavailable" not in gpu and gpu["cuda_context_bytes"] > 0
    refused = run_cli(["predict", *flags, "--gpu-memory", "24GiB"], db_path, timeout_s=60)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1 and "--gpu-memory" in refused.stderr


def test_predict_on_the_cpu_matches_a_cpu_run(db_path):
    """The weights, gradients and optimizer state exactly, and (eager attention) the activations within 5%: with the
    GPU's cuBLAS workspaces counted they were 14× the measured."""
    flags = ["--preset", "tiny", "--device", "cpu", "--attn", "eager", "--seq-len", "64", "--batch-size", "8"]
    predicted = json.loads(run_cli(["predict", *flags, "--json"], db_path, timeout_s=60).stdout)
    completed = run_cli(["run", *flags, "--samples", "16", "--json"], db_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    measured = last_json(completed.stdout)
    assert state_bytes(measured) == {key: predicted[key] for key in state_bytes(measured)}
    assert measured["bands"]["activations_bytes"] == pytest.approx(predicted["activations_bytes"], rel=0.05)
