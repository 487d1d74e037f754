"""The kernel rules on real H100 profiles: every kernel of the seven profiled runs of benchmarks/operations_check.sh
(bert-large fp32/bf16, eager and --compile-regions, eager attention; llama-3.2-1b bf16, with and without Liger),
recorded in tests/data/operations/h100_kernels.json, classified again by today's rules; and the diagnosis of a
GPU-bound run given those runs' anatomies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_diagnose import RUNS, compare_runs, diagnose

from gpuanat.core.operations.anatomy import memory_bound_share, operations_anatomy
from gpuanat.core.operations.classify import GROUPS, group_of, op_base
from gpuanat.core.vocabulary.protocol import KernelRow, Operations

DATA = json.loads((Path(__file__).parent / "data" / "operations" / "h100_kernels.json").read_text())
PROFILED = {run["check"]: run for run in DATA["runs"]}


def reclassified(run: dict) -> list[KernelRow]:
    return [
        KernelRow(**{**row, "group": group_of(row["name"], row["op"], optimizer=row["optimizer"], device="cuda")})
        for row in run["kernels"]
    ]


def anatomy_of(name: str) -> dict:
    run = PROFILED[name]
    return operations_anatomy(
        Operations(
            device="cuda",
            first_step=run["first_step"],
            profiled_steps=run["profiled_steps"],
            wall_s=run["wall_s"],
            processing_s=run["processing_s"],
            kernels=reclassified(run),
        )
    )


def test_the_recorded_runs_are_the_ones_the_issue_names():
    assert set(PROFILED) == {
        "bert-fp32",
        "bert-bf16",
        "bert-fp32-compile-regions",
        "bert-bf16-compile-regions",
        "bert-bf16-eager-attention",
        "llama-3.2-1b-bf16",
        "llama-3.2-1b-bf16-liger",
    }
    assert all(run["gpu_name"] == "NVIDIA H100 80GB HBM3" for run in DATA["runs"])


@pytest.mark.parametrize("name", sorted(PROFILED))
def test_every_kernel_lands_in_one_group_and_the_groups_add_up_to_the_trace(name):
    run = PROFILED[name]
    anatomy = anatomy_of(name)
    assert sum(anatomy[group]["time_s"] for group in GROUPS) == pytest.approx(run["device_time_s"], rel=1e-9)
    # the device time read from the profile is the trace's own sum of kernels, copies and memsets
    assert run["device_time_s"] == pytest.approx(run["trace_device_time_s"], rel=0.01)
    assert anatomy["contractions"]["flop_share"] >= 0.93  # contractions dominate the FLOPs, as in the paper
    assert anatomy["other"]["time_share"] < 0.02  # nothing of weight unrecognised


@pytest.mark.parametrize("name", sorted(PROFILED))
def test_kernels_go_where_their_operator_and_their_name_say(name):
    for row in reclassified(PROFILED[name]):
        base, kernel = op_base(row.op), row.name
        if row.optimizer:
            expected = "optimizer"
        elif kernel.startswith(("Memcpy", "Memset")):
            expected = "memory_copies"
        elif kernel.startswith("triton_poi_"):
            expected = "elementwise"
        elif kernel.startswith(("triton_per_", "triton_red_")):
            expected = "normalizations"
        elif kernel.startswith(("nvjet_", "sm80_xmma_gemm", "sm90_xmma_gemm")) or "flash_" in kernel:
            expected = "contractions"
        elif base in (
            "native_layer_norm",
            "native_layer_norm_backward",
            "_softmax",
            "_softmax_backward_data",
            "_log_softmax",
            "_log_softmax_backward_data",
        ):
            expected = "normalizations"
        elif base in ("embedding_dense_backward", "embedding", "gather"):
            expected = "other"
        elif base in ("_to_copy", "copy_", "gelu", "gelu_backward", "native_dropout", "add_", "mul", "silu"):
            expected = "elementwise"
        else:
            continue
        assert row.group == expected, (kernel[:100], row.op)


def test_on_the_h100_bf16_moves_the_time_to_the_memory_bound_kernels():
    """fp32's products are slow enough to hide the rest; in bf16 they run 11× faster and the normalizations and
    element-wise operators (autocast's casts among them) take a third of the GPU time, as in the paper."""
    fp32, bf16 = anatomy_of("bert-fp32"), anatomy_of("bert-bf16")
    assert memory_bound_share(fp32) < 0.1
    assert memory_bound_share(bf16) > 0.3
    assert bf16["contractions"]["tflops_per_s"] > 8 * fp32["contractions"]["tflops_per_s"]
    eager_attention = anatomy_of("bert-bf16-eager-attention")
    assert eager_attention["normalizations"]["time_s"] > bf16["normalizations"]["time_s"]  # softmax, unfused


def test_a_gpu_bound_run_spending_its_time_moving_memory_is_told_how_to_fuse():
    gpu_bound = RUNS["bf16 batch 32"]
    assert [finding.bottleneck for finding in diagnose(gpu_bound)] == ["gpu-bound"]
    moving = {**gpu_bound, "operations_anatomy": anatomy_of("bert-bf16")}
    findings = diagnose(moving)
    assert [finding.bottleneck for finding in findings] == ["gpu-bound", "data-movement"]
    assert "--compile-regions" in findings[1].fix and "--liger" not in findings[1].fix  # an encoder: no Liger
    assert "normalizations and element-wise operators took" in findings[1].evidence
    computing = {**gpu_bound, "operations_anatomy": anatomy_of("bert-fp32")}
    assert [finding.bottleneck for finding in diagnose(computing)] == ["gpu-bound"]
    host_bound = {**RUNS["bf16"], "operations_anatomy": anatomy_of("bert-bf16")}
    assert "data-movement" not in [finding.bottleneck for finding in diagnose(host_bound)]


def test_compare_shows_what_compile_regions_fused_away():
    eager = {"operations_anatomy": anatomy_of("bert-bf16")}
    compiled = {"operations_anatomy": anatomy_of("bert-bf16-compile-regions")}
    comparison = compare_runs([1, 2], [{"compile_regions": False}, {"compile_regions": True}], [eager, compiled])
    rows = {row.key: row for row in comparison.metrics}
    elementwise = rows["ops_elementwise_s"]
    assert elementwise.values[0] == pytest.approx(eager["operations_anatomy"]["elementwise"]["time_s"] / 3)
    assert elementwise.deltas_percent[1] < -20  # Triton fused the GELU and the dropout/residual adds
    assert abs(rows["ops_contractions_s"].deltas_percent[1]) < 5  # the products are the same cuBLAS kernels
    assert rows["ops_device_s"].deltas_percent[1] < 0
    unprofiled = compare_runs([1, 2], [{}, {}], [{}, {}])
    assert not [row for row in unprofiled.metrics if row.key.startswith("ops_")]  # no rows of dashes
