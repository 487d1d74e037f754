"""What the caching allocator reserves (issue #50), against the H100: the allocator's history recorded in plain HF
Trainer runs (`benchmarks/llm_matrix.py --trace-dir`, benchmarks/results/h100/reserve/), the stream of allocations
gpuanat derives for the same runs (`allocation_stream`), and `gpuanat predict`'s peak reserved memory against the
measured runs of the development sets (benchmarks/results/h100/unseen, llm/decoders*). No GPU: recorded data,
replayed."""

from __future__ import annotations

import gzip
import json
import os
import sys
import tarfile

import pytest
from conftest import REPO, run_cli

from gpuanat.core.memory.allocation_stream import stream_for
from gpuanat.core.memory.allocator import CachingAllocator, replay, requests_of
from gpuanat.core.memory.measured_nearby import measured_nearby, technique_kind
from gpuanat.core.memory.model_config import architecture_of
from gpuanat.core.memory.predict import estimate_memory, peak_reserved_bytes
from gpuanat.core.vocabulary.config import RunConfig

RESULTS = REPO / "benchmarks" / "results" / "h100"
GIB = 1 << 30


def recorded_runs() -> dict[str, list[list]]:
    runs = {}
    for archive in sorted((RESULTS / "reserve").glob("traces_*.tgz")):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                file = tar.extractfile(member)
                if member.name.endswith(".json.gz") and file is not None:
                    with gzip.open(file, "rt") as unzipped:
                        recorded = json.load(unzipped)
                    runs[recorded["key"]] = recorded["events"]
    return runs


def reserved_peak(events: list[list]) -> int:
    reserved = peak = 0
    for action, _address, size, _stream in events:
        if action == "segment_alloc":
            reserved += size
            peak = max(peak, reserved)
        elif action == "segment_free":
            reserved -= size
    return peak


def test_replaying_a_recorded_run_reserves_what_it_reserved():
    """The allocator's rules, replayed on the requests a run made, reserve what torch reserved: within 1.5% on 9 of the
    10 runs that trained (smollm2 with bf16 weights: +7.4%, not explained)."""
    errors = {}
    for key, events in recorded_runs().items():
        if key == "qwen2.5-0.5b lm s2048 b4 bf16 adamw_bnb_8bit":
            continue  # (bitsandbytes was not installed there: the run failed as its model was built)
        requests = requests_of(events)
        replayed = replay(requests.operations, requests.sizes, 1 << 50)
        errors[key] = 100 * (replayed.peak_reserved_bytes - reserved_peak(events)) / reserved_peak(events)
    assert len(errors) == 10, sorted(errors)
    assert sum(abs(error) <= 1.5 for error in errors.values()) >= 9, errors
    assert max(abs(error) for error in errors.values()) < 8, errors


def large_segments(operations: list[int], sizes: list[int], large: int) -> list[int]:
    """The sizes of the segments of at least `large` bytes a replay reserves, in order."""
    allocator, blocks, segments = CachingAllocator(1 << 50), [], []
    for operation in operations:
        if operation < 0:
            before = len(allocator.reservations)
            blocks.append(allocator.malloc(sizes[len(blocks)]))
            segments += [size for size in allocator.reservations[before:] if size >= large]
        else:
            allocator.free(blocks[operation])
    return segments


@pytest.mark.parametrize(
    ("key", "config"),
    [
        (
            "llama-3.2-1b lm s2048 b4 bf16 adamw_torch_fused gc",
            RunConfig(preset="llama-3.2-1b", precision="bf16", seq_len=2048, batch_size=4, grad_checkpointing=True),
        ),
        (
            "smollm2-360m lm s1024 b4 bf16 adamw_torch_fused",
            RunConfig(
                model=str(REPO / "benchmarks" / "configs" / "smollm2-360m" / "config.json"),
                precision="bf16",
                seq_len=1024,
                batch_size=4,
            ),
        ),
    ],
)
def test_the_derived_stream_reserves_the_large_segments_the_run_reserved(key, config):
    """The logits' segments (batch × seq × vocabulary, 16-bit and fp32) of the first step, and those the second step
    must add because the gradients and the optimizer's states took the first ones' space: the same sizes in the same
    order."""
    arch = architecture_of(config)
    logits_16_bit = config.batch_size * config.seq_len * arch.vocab_size * 2
    recorded = requests_of(recorded_runs()[key])
    stream = stream_for(config.replace(max_steps=3), arch)
    assert stream is not None
    derived = large_segments(list(stream.operations), list(stream.sizes), logits_16_bit)
    assert derived == large_segments(list(recorded.operations), list(recorded.sizes), logits_16_bit)
    assert len(derived) >= 6, derived  # a 16-bit and three fp32 the first step, more the second


def development_runs():
    sys.path.insert(0, str(REPO / "benchmarks"))
    import llm_matrix

    os.environ.setdefault("GPUANAT_PREDICT_HELD_OUT", "1")
    for name in ("unseen/unseen.json", "llm/decoders.json", "llm/decoders_llama.json"):
        results = json.loads((RESULTS / name).read_text())
        for run in results["runs"]:
            if run.get("status") != "ok":
                continue
            case = llm_matrix.case_from_json(run["config"])
            config, caveats = llm_matrix.run_config_for(case, results["steps_per_config"])
            if caveats or any(refused in (config.model or "") for refused in ("deberta", "modernbert")):
                continue
            yield run, config


def test_the_predicted_peak_reserved_on_the_development_runs():
    """`gpuanat predict`'s peak reserved memory against the max_memory_reserved of the development runs (plain Trainer,
    H100): within 5% on at least 90% of them and within 10% on all but 2% (today: 160 of 175, and all 175)."""
    errors = []
    for run, config in development_runs():
        measured = run["max_memory_reserved_bytes"]
        errors.append(100 * (peak_reserved_bytes(estimate_memory(config)) - measured) / measured)
    assert len(errors) >= 170
    within_5 = sum(abs(error) <= 5 for error in errors)
    within_10 = sum(abs(error) <= 10 for error in errors)
    assert within_5 >= 0.9 * len(errors), (within_5, len(errors))
    assert within_10 >= 0.98 * len(errors), (within_10, len(errors))


def test_what_was_measured_nearby_names_the_runs_and_the_errors():
    qwen3 = RunConfig(
        model=str(REPO / "benchmarks" / "configs" / "qwen3-0.6b" / "config.json"), precision="bf16", lora=16
    )
    nearby = measured_nearby(qwen3, "qwen3")
    assert technique_kind(qwen3) == "LoRA"
    assert nearby.runs >= 2 and nearby.text.startswith(f"measured on {nearby.runs} H100 runs of qwen3 (LoRA)")
    assert "peak allocated" in nearby.text and "peak reserved" in nearby.text and nearby.trusted
    unknown = measured_nearby(RunConfig(precision="bf16", lora=16), "a-family-never-measured")
    assert unknown.runs == 0 and unknown.text.startswith("no a-family-never-measured run was measured; on ")


def test_predict_says_where_the_nearby_runs_were_off_by_more_than_10_percent(db_path):
    """Mixtral with LoRA and checkpointing: the reserve of its wrapped experts was 7-11% under on the H100, and the
    prediction says so, as a caveat (it is not `checked`)."""
    config = REPO / "benchmarks" / "configs" / "mixtral-8x7b-2l" / "config.json"
    flags = ["--model", str(config), "--precision", "bf16", "--lora", "16", "--grad-checkpointing"]
    text = run_cli(["predict", *flags, "--gpu-memory", "80GiB"], db_path).stdout
    assert "measured on 2 H100 runs of mixtral (LoRA + checkpointing)" in text
    assert "off by more than 10% there" in text and "Not checked: " in text
    assert "peak reserved" in text
    result = json.loads(run_cli(["predict", *flags, "--gpu-memory", "80GiB", "--json"], db_path).stdout)
    assert "off by more than 10% there" in result["measured_nearby"] and result["confidence"] == "unchecked"
    assert result["measured_nearby"] in result["caveat"]
    trusted = json.loads(run_cli(["predict", *flags[:-1], "--gpu-memory", "80GiB", "--json"], db_path).stdout)
    assert trusted["measured_nearby"].startswith("measured on 2 H100 runs of mixtral (LoRA): ")
    assert "off by more" not in trusted["measured_nearby"]
    assert result["peak_reserved_bytes"] > result["peak_allocated_bytes"]
    assert result["max_batch_method"] == "stream"
