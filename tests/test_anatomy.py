"""Band assembly: the bands add up to NVML's device used; what cannot be measured says why."""

from __future__ import annotations

import sys
from pathlib import Path

from gpuanat.core.measure.anatomy import (
    BAND_NAMES,
    assemble_bands,
    bands_of_one_moment,
    gradients_after_backward_bytes,
    stack_problems,
    stack_total_bytes,
)
from gpuanat.core.vocabulary.protocol import ProbeBands

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))
from bands_check import check_results  # noqa: E402

GIB = 1024**3
PROBE = ProbeBands(
    weights_bytes=1_340 * 1024**2,
    gradients_bytes=1_340 * 1024**2,
    optimizer_state_bytes=2_680 * 1024**2,
    activations_bytes=6 * GIB,
    activations_method="allocator",
    batch_bytes=16_384,
    measured_at_step=3,
)


def test_bands_add_up_to_device_total():
    bands = assemble_bands(
        PROBE,
        reserved_bytes=14 * GIB,
        device_used_bytes=16 * GIB + 300 * 1024**2,
        device_total_bytes=80 * GIB,
        process_used_bytes=14 * GIB + 500 * 1024**2,
    )
    values = bands.to_json()
    assert bands.unavailable == {}
    assert values["other_processes_bytes"] == 16 * GIB + 300 * 1024**2 - (14 * GIB + 500 * 1024**2)
    assert values["cuda_context_bytes"] == 500 * 1024**2
    # No accumulation: no gradient is alive at the end of forward, when the memory peaks.
    assert values["temporaries_and_cache_bytes"] == 14 * GIB - (1_340 + 2_680) * 1024**2 - 6 * GIB
    # The bands are one moment's, the end of forward: the gradients band is what is alive then (none), the whole
    # stack adds up to the device's used memory, and with free to its total.
    assert values["gradients_bytes"] == 0
    assert stack_total_bytes(values) == sum(values[name] for name in BAND_NAMES[:-1]) == 16 * GIB + 300 * 1024**2
    assert stack_total_bytes(values) + values["free_bytes"] == 80 * GIB
    entry = {
        "bands": values,
        "device_memory_used_bytes": 16 * GIB + 300 * 1024**2,
        "gradients_after_backward_bytes": gradients_after_backward_bytes(PROBE),
    }
    assert stack_problems(entry) == [] and entry["gradients_after_backward_bytes"] == 1_340 * 1024**2


def test_a_stack_with_the_gradients_maximum_in_it_does_not_add_up():
    """Issue #30, seen on the H100: a TRL run's watch record had the gradients' maximum after backward (4.15 GB) in
    the stack, the cache figured without it: the bands summed to 22.74 GB against NVML's 18.59 GB."""
    bands = assemble_bands(
        PROBE,
        reserved_bytes=14 * GIB,
        device_used_bytes=16 * GIB,
        device_total_bytes=80 * GIB,
        process_used_bytes=15 * GIB,
    ).to_json()
    mixed = {"bands": {**bands, "gradients_bytes": PROBE.gradients_bytes}, "device_memory_used_bytes": 16 * GIB}
    assert stack_problems(mixed) == [
        f"result: the bands sum to {16 * GIB + PROBE.gradients_bytes:,} B, "
        f"+{100 * PROBE.gradients_bytes / (16 * GIB):.2f}% off the device's "
        f"{16 * GIB:,} B"
    ]
    assert stack_problems({**mixed, "bands": {**bands, "cuda_context_bytes": -1}})[0] == (
        "result: cuda_context_bytes is negative (-1 B)"
    )


def test_results_written_before_the_bands_were_one_moment_s_read_as_now():
    old = {
        "bands": {"weights_bytes": 10, "gradients_bytes": 10, "temporaries_and_cache_bytes": 30},
        "gradients_at_forward_end_bytes": 0,
        "ranks": [{"rank": 0, "bands": {"gradients_bytes": 10}, "gradients_at_forward_end_bytes": 0}],
    }
    new = bands_of_one_moment(old)
    assert new["bands"] == {"weights_bytes": 10, "gradients_bytes": 0, "temporaries_and_cache_bytes": 30}
    assert new["gradients_after_backward_bytes"] == 10 and "gradients_at_forward_end_bytes" not in new
    assert new["ranks"] == [{"rank": 0, "bands": {"gradients_bytes": 0}, "gradients_after_backward_bytes": 10}]
    assert old["bands"]["gradients_bytes"] == 10  # the stored result is not changed
    assert bands_of_one_moment(new) is new


def test_every_committed_result_and_record_adds_up_within_one_percent():
    """The GPU results and records committed under benchmarks/results and tests/data (H100, H200, several ranks),
    read as gpuanat reads old history rows: every band >= 0, every stack beside a device reading within 1% of it.
    As written, 87 of the 130 beside a reading were off by more than 1% (the gradients' maximum in the stack)."""
    checked = check_results(
        sorted(
            path
            for folder in (REPO / "benchmarks" / "results", REPO / "tests" / "data")
            for pattern in ("*.json", "*.jsonl")
            for path in folder.rglob(pattern)
            if '"bands"' in path.read_text(errors="replace")
        )
    )
    assert checked["problems"] == []
    assert checked["with_device_used"] >= 130 and checked["max_abs_error_percent"] <= 1.0


def test_accumulated_gradients_are_part_of_the_peak():
    accumulating = ProbeBands(**{**PROBE.__dict__, "gradients_at_forward_end_bytes": PROBE.gradients_bytes})
    bands = assemble_bands(
        accumulating,
        reserved_bytes=14 * GIB,
        device_used_bytes=16 * GIB,
        device_total_bytes=80 * GIB,
        process_used_bytes=15 * GIB,
    )
    assert bands.temporaries_and_cache_bytes == 14 * GIB - (1_340 + 1_340 + 2_680) * 1024**2 - 6 * GIB


def test_first_step_has_no_optimizer_state_at_the_end_of_forward():
    # Step 1 of the docs' vanilla run on the H100 (bert-large fp32 batch 4; benchmarks/results/h100/predict):
    # the optimizer state is created by the first optimizer step, after the forward pass, in blocks the
    # activations freed, so reserved memory is less than weights + optimizer state + activations.
    weights, optimizer_state, activations, reserved = 1_340_583_944, 2_681_153_076, 3_380_170_704, 5_582_618_624
    first_step = ProbeBands(
        weights_bytes=weights,
        gradients_bytes=1_340_575_752,
        optimizer_state_bytes=optimizer_state,
        activations_bytes=activations,
        activations_method="allocator",
        batch_bytes=16_384,
        measured_at_step=1,
        optimizer_state_at_forward_end_bytes=0,
    )
    readings = {
        "reserved_bytes": reserved,
        "device_used_bytes": 6_370_000_000,
        "device_total_bytes": 85_520_809_984,
        "process_used_bytes": 6_360_000_000,
    }
    bands = assemble_bands(first_step, **readings)
    assert bands.optimizer_state_bytes == 0
    assert bands.temporaries_and_cache_bytes == reserved - weights - activations == 861_863_976
    # Before the probe measured the state at the end of forward, the step's final state was used: the cache came out
    # negative, 1,819,289,100 B below zero. A negative band is never shown: it is missing, and the reason says why.
    older_probe = ProbeBands(**{**first_step.__dict__, "optimizer_state_at_forward_end_bytes": None})
    older = assemble_bands(older_probe, **readings)
    assert older.temporaries_and_cache_bytes is None
    assert "by 1,819,289,100 B" in older.unavailable["temporaries_and_cache_bytes"]
    later = ProbeBands(**{**first_step.__dict__, "optimizer_state_at_forward_end_bytes": optimizer_state})
    assert assemble_bands(later, **readings).optimizer_state_bytes == optimizer_state


def test_readings_that_cannot_add_up_give_no_negative_band_but_say_why():
    # Issue #15: Trainer's silent DataParallel over 2 H200s, read as one GPU, gave other processes −16.9 GB and a
    # CUDA context of 18.5 GB. Each negative difference becomes a missing band with the numbers behind it.
    probe = ProbeBands(
        weights_bytes=1_340_583_944,
        gradients_bytes=0,
        optimizer_state_bytes=2_681_153_076,
        activations_bytes=3_000_000_000,
        activations_method="allocator",
        batch_bytes=16_384,
        measured_at_step=3,
        optimizer_state_at_forward_end_bytes=2_681_153_076,
    )
    bands = assemble_bands(
        probe,
        reserved_bytes=8_000_000_000,
        device_used_bytes=19_500_000_000,
        device_total_bytes=150_000_000_000,
        process_used_bytes=36_404_290_304,
    )
    assert bands.other_processes_bytes is None
    assert "36,404,290,304 B" in bands.unavailable["other_processes_bytes"]
    assert bands.cuda_context_bytes == 36_404_290_304 - 8_000_000_000  # positive differences stay
    too_little_reserved = assemble_bands(
        probe,
        reserved_bytes=4_000_000_000,
        device_used_bytes=5_000_000_000,
        device_total_bytes=150_000_000_000,
        process_used_bytes=4_500_000_000,
    )
    assert too_little_reserved.temporaries_and_cache_bytes is None
    assert all(
        value is None or value >= 0 for value in too_little_reserved.to_json().values() if not isinstance(value, dict)
    )


def test_cpu_run_has_tensor_bands_only_with_reasons():
    bands = assemble_bands(
        PROBE,
        reserved_bytes=None,
        device_used_bytes=None,
        device_total_bytes=None,
        process_used_bytes=None,
        no_gpu_reason="CPU run: it uses no GPU memory",
    )
    assert bands.weights_bytes == PROBE.weights_bytes and bands.activations_bytes == PROBE.activations_bytes
    assert bands.cuda_context_bytes is None and bands.other_processes_bytes is None
    assert set(bands.unavailable) == {
        "other_processes_bytes",
        "cuda_context_bytes",
        "temporaries_and_cache_bytes",
        "free_bytes",
    }


def test_missing_per_process_reading_is_null_not_zero():
    bands = assemble_bands(
        PROBE, reserved_bytes=14 * GIB, device_used_bytes=16 * GIB, device_total_bytes=80 * GIB, process_used_bytes=None
    )
    assert bands.cuda_context_bytes is None and bands.other_processes_bytes is None
    assert "per-process" in bands.unavailable["cuda_context_bytes"]
    assert bands.free_bytes == 64 * GIB
