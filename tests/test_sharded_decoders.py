"""7-8B decoders sharded over 2 H200s, recorded (benchmarks/results/h200x2/sharded_reference/, issue #34): a plain HF
Trainer outside gpuanat (reference-CASE.jsonl, a line a rank) and `gpuanat run` of the same training (run-CASE.json).
The memory model predicts every rank's peaks from the config alone; it was fitted on the cases in the folder itself
(FSDP2's backward units and cache, ZeRO-2's step) and these tests hold it there and on the held-out ones
(held_out/: qwen2.5-7b, batch 2, LoRA at seq 4096, ZeRO-2)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuanat.core.memory.predict import (
    estimate_memory,
    peak_device_bytes,
    peak_reserved_bytes,
    prediction_caveat,
    prediction_json,
)
from gpuanat.core.run.config import RunConfig

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "h200x2" / "sharded_reference"
CASES = sorted(RESULTS.glob("run-*.json")) + sorted((RESULTS / "held_out").glob("run-*.json"))
PRESETS = {"mistral": "mistral-7b", "qwen": "qwen2.5-7b"}
"""The checkpoints were random weights of these presets' configs (llama-3.1-8b's from benchmarks/configs)."""


def _recorded(run_path: Path) -> tuple[RunConfig, dict, list[dict]]:
    result = json.loads([line for line in run_path.read_text().splitlines() if line.startswith("{")][-1])
    case = run_path.stem.removeprefix("run-")
    config = dataclasses.replace(RunConfig.from_json(result["config"]), model=None,
                                 preset=PRESETS.get(case.split("-")[0], "llama-3.1-8b"))
    reference_path = run_path.with_name(f"reference-{case}.jsonl")
    references = [json.loads(line) for line in reference_path.read_text().splitlines()]
    return config, result, references


def test_every_case_is_recorded_for_both_ranks():
    names = {path.stem for path in CASES}
    assert {"run-random-1024", "run-fsdp-4096", "run-lora-1024", "run-zero3-1024", "run-mistral-2048",
            "run-qwen-2048", "run-zero2-1024"} <= names
    for path in CASES:
        _, result, references = _recorded(path)
        assert result["status"] == "ok" and len(result["ranks"]) == len(references) == 2, path.name


@pytest.mark.parametrize("run_path", CASES, ids=lambda path: path.parent.name + "/" + path.stem)
def test_gpuanat_measures_what_the_plain_trainer_holds_and_its_bands_add_up_to_nvml(run_path):
    """The same training under gpuanat and under a plain Trainer: the same peak allocated on every GPU, to the byte;
    gpuanat's bands of a rank add up to NVML's reading of its GPU."""
    _, result, references = _recorded(run_path)
    by_gpu = {rank["gpu_index"]: rank for rank in result["ranks"]}
    for reference in references:
        rank = by_gpu[reference["local_rank"]]
        assert rank["peak_allocated_bytes"] == reference["peak_allocated_bytes"]
        used = sum(value for name, value in rank["bands"].items() if name != "free_bytes" and value)
        assert used == rank["device_memory_used_bytes"]


@pytest.mark.parametrize("run_path", CASES, ids=lambda path: path.parent.name + "/" + path.stem)
def test_each_ranks_peaks_are_predicted_within_ten_percent_of_the_plain_trainer(run_path):
    config, result, references = _recorded(run_path)
    estimate = estimate_memory(config)
    state = {"weights_bytes": estimate.weights_bytes, "optimizer_state_bytes": estimate.optimizer_state_bytes}
    for reference in references:
        assert estimate.peak_allocated_bytes == pytest.approx(reference["peak_allocated_bytes"], rel=0.035)
        assert peak_reserved_bytes(estimate) == pytest.approx(reference["peak_reserved_bytes"], rel=0.10)
        assert peak_device_bytes(estimate) == pytest.approx(reference["device_used_bytes"], rel=0.10)
    for rank in result["ranks"]:  # the state the ranks hold: exact to DeepSpeed's padding (4 KiB of 8-48 GB)
        exact_to = 4096 if config.distributed.startswith("zero") else 0
        measured = {**{name: rank["bands"][name] for name in state},
                    "gradients_bytes": rank["gradients_after_backward_bytes"]}
        for name, predicted in {**state, "gradients_bytes": estimate.gradients_bytes}.items():
            assert abs(measured[name] - predicted) <= exact_to, name


def test_what_was_measured_is_predicted_without_a_caveat_and_the_rest_says_why():
    llama = RunConfig(preset="llama-3.1-8b", gpus="2", precision="bf16", grad_checkpointing=True, seq_len=2048)
    for distributed in ("fsdp", "zero3"):
        assert prediction_json(dataclasses.replace(llama, distributed=distributed))["confidence"] == "checked"
    assert "measured once" in prediction_caveat(dataclasses.replace(llama, distributed="zero2"))
    assert "not measured under ddp" in prediction_caveat(dataclasses.replace(llama, distributed="ddp"))
    assert "with checkpointing only" in prediction_caveat(
        dataclasses.replace(llama, distributed="fsdp", grad_checkpointing=False))
    assert "measured on 2" in prediction_caveat(dataclasses.replace(llama, distributed="fsdp", gpus="8"))


def test_the_reference_script_trains_on_the_cpu():
    """benchmarks/reference_sharded_trainer.py's smoke test (2 small layers, no sharding, LoRA on): what the GPU calls
    run, kept working between them."""
    script = RESULTS.parents[2] / "reference_sharded_trainer.py"
    completed = subprocess.run([sys.executable, str(script), "--config", str(RESULTS.parents[2] / "configs" /
                                "llama-3.1-8b"), "--tiny", "--lora", "4", "--steps", "2", "--seq-len", "16"],
                               capture_output=True, text=True, timeout=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = json.loads([text for text in completed.stdout.splitlines() if text.startswith('{"')][-1])
    assert line["steps"] == 2 and line["lora"] == 4 and line["s_per_step_median"] > 0


LORA_PEAK = RESULTS.parent / "lora_peak"


@pytest.mark.parametrize(("name", "preset", "within"), [
    ("run-lora1024.json", "llama-3.1-8b", 0.005), ("run-lora4096.json", "llama-3.1-8b", 0.005),
    ("run-mistral-lora1024.json", "mistral-7b", 0.05), ("run-mistral-lora2048.json", "mistral-7b", 0.05),
])
def test_lora_under_fsdp2_peaks_at_the_loss(name, preset, within):
    """`gpuanat run --memory-snapshot` of llama-3.1-8b with LoRA under FSDP2 (lora_peak/): the peak is inside the loss,
    the LM head's unit held twice (its all-gather buffer and its unsharded parameters) beside the fp32 logits; the
    model has that moment (0.5% at both lengths). mistral-7b's runs were held out from it (within 5%)."""
    result = json.loads(Path(LORA_PEAK / name).read_text().strip().splitlines()[-1])
    config = dataclasses.replace(RunConfig.from_json(result["config"]), model=None, preset=preset)
    predicted = estimate_memory(config)
    for rank in result["ranks"]:
        assert predicted.peak_allocated_bytes == pytest.approx(rank["peak_allocated_bytes"], rel=within)
    snapshot = LORA_PEAK / name.replace("run-", "peak-")
    if snapshot.exists():
        peak = next(iter(json.loads(snapshot.read_text())["snapshots"].values()))
        assert peak["peak_allocation"]["place"].startswith("transformers/loss/loss_utils.py")
        held = {place.split(" ")[0]: value["bytes"] for place, value in peak["by_place"].items()}
        head_unit = 2 * 128_256 * 4096  # llama-3.1-8b's LM head in 16 bits, gathered twice
        for place in ("_fsdp_collectives.py:59", "_fsdp_param.py:931"):  # to FSDP2's padding (8 KiB)
            assert held[f"torch/distributed/fsdp/_fully_shard/{place}"] == pytest.approx(head_unit, abs=16384)
