"""`gpuanat sweep` on the CPU: the docs' whole table, real runs where the CPU can, skipped rows elsewhere."""

from __future__ import annotations

import json

import pytest
from conftest import run_cli

from gpuanat.core.percent import percent_delta
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.sweep import EXPERIMENTS

SWEEP = ["sweep", "--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "16"]


@pytest.mark.timeout(900)  # a dozen processes that each import torch: ~20 s apiece on the GPU machines' CPUs
def test_sweep_runs_the_docs_table_and_skips_what_needs_a_gpu(db_path):
    completed = run_cli([*SWEEP, "--json"], db_path, timeout_s=900)
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = json.loads(completed.stdout.strip().splitlines()[-1])
    assert [row["name"] for row in rows] == [experiment.name for experiment in EXPERIMENTS]
    by_name = {row["name"]: row for row in rows}
    for name in ("vanilla", "grad accumulation", "+ grad checkpointing", "bf16", "adafactor"):
        assert by_name[name]["status"] == "ok", by_name[name]
    reasons = {row["name"]: row["reason"] for row in rows if row["status"] == "skipped"}
    # 8-bit Adam also names bitsandbytes where it is missing (as in CI), not where it is installed
    assert reasons.pop("8-bit adam").startswith("8-bit Adam (adamw_bnb_8bit) needs a CUDA GPU")
    assert reasons == {
        "fp16": "fp16 needs a CUDA GPU; use bf16 or fp32 on CPU",
        "accum + gc + fp16": "fp16 needs a CUDA GPU; use bf16 or fp32 on CPU",
        "tf32": "tf32 needs a CUDA GPU (Ampere or newer)",
        "accum + gc + fp16 + adafactor": "fp16 needs a CUDA GPU; use bf16 or fp32 on CPU",
        "accum + gc + fp16 + 8-bit adam": "fp16 needs a CUDA GPU; use bf16 or fp32 on CPU",
    }
    vanilla = by_name["vanilla"]
    for row in rows:
        if row["status"] == "ok":
            assert row["samples_per_second_delta"] == percent_delta(
                row["samples_per_second"], vanilla["samples_per_second"]
            )
            assert row["time_delta"] == percent_delta(row["train_runtime_s"], vanilla["train_runtime_s"])
    assert vanilla["time_delta"] == 0.0
    # The accumulating experiments train the same 16 samples as 1 × 4 micro-batches per step.
    assert by_name["grad accumulation"]["steps"] == 4 and by_name["grad accumulation"]["samples"] == 16
    assert by_name["+ grad checkpointing"]["config"]["grad_checkpointing"] is True
    assert by_name["bf16"]["config"]["precision"] == "bf16"
    # Each experiment ran in its own process and landed in the history under its name.
    history = json.loads(run_cli(["history", "--json"], db_path).stdout)
    assert [run["name"] for run in history] == [
        "vanilla",
        "grad accumulation",
        "+ grad checkpointing",
        "bf16",
        "adafactor",
    ]
    with HistoryStore(db_path) as store:
        training_pids = {run.environment["pid"] for run in store.runs()}
    assert len(training_pids) == 5
    # The first run starts cold; each later one is taken by the process prepared as the one before ran or ended
    # (gpuanat.core.run.warm): a process of its own still, as the pids above say.
    started = [
        by_name[name]["start"] for name in ("vanilla", "grad accumulation", "+ grad checkpointing", "bf16", "adafactor")
    ]
    assert started[0] == {
        "warm": False,
        "prepared_for_s": None,
        "imports_done": None,
        "cold_reason": "no process was prepared",
    }
    assert all(start["warm"] and start["cold_reason"] is None for start in started[1:]), started
    table = run_cli([*SWEEP, "--only", "vanilla", "--only", "tf32"], db_path, timeout_s=300)
    assert table.returncode == 0
    assert "tf32 needs a CUDA GPU" in table.stdout and "Δ time" in table.stdout
