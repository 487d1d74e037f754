"""A driver that stops answering while gpuanat starts (issue #53): the NVML calls before the first sample —
initialisation, GPU count, handles, names, memory, the source's set-up — wait at most the start-up deadline, then
gpuanat goes on without the GPU and says which one did not answer.

No GPU here: NVML is the H200 pair recorded under DDP, replayed (GPUANAT_NVML_REPLAY), and a fault plan
(GPUANAT_NVML_FAULTS) with `"from_sample": -1` — the calls at start-up, before the first sample — makes a call block
for minutes, as a hung driver does. Real `gpuanat watch --json`, `predict` and `run` subprocesses, and the real
dashboard headless.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import TINY_CPU, run_cli, start_cli
from test_tui import TINY, wait_for

from gpuanat.core.measure.nvml_faults import FAULTS_VARIABLE, REPLAY_VARIABLE
from gpuanat.core.measure.nvml_guard import STARTUP_DEADLINE_S
from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.store.history import HistoryStore
from gpuanat.tui.app import GpuAnatApp

TWO_H200 = Path(__file__).resolve().parent / "data" / "h200x2_ddp_trace.jsonl"
HUNG_S = 600.0
"""How long the blocked call blocks: longer than any of these tests may take, so that waiting for it would hang."""
GPU_0_HUNG = {"gpu": 0, "block_s": HUNG_S, "from_sample": -1, "until_sample": 0}
"""GPU 0's first call at start-up (its handle) blocks."""
INIT_HUNG = {"gpu": None, "block_s": HUNG_S, "from_sample": -1, "until_sample": 0}
"""NVML's initialisation blocks."""
GPU_0_SAID = f"GPU 0 not answering (NVML did not return within {STARTUP_DEADLINE_S:g} s at start-up)"


def hung_env(tmp_path: Path, fault: dict) -> dict[str, str]:
    plan = tmp_path / "faults.json"
    plan.write_text(json.dumps({"faults": [fault]}))
    return {REPLAY_VARIABLE: str(TWO_H200), FAULTS_VARIABLE: str(plan)}


def test_watch_json_starts_and_says_the_gpu_did_not_answer(tmp_path):
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        watch = start_cli(
            ["watch", str(target.pid), "--json", "--interval", "0.2", "--duration", "2"],
            None,
            extra_env=hung_env(tmp_path, GPU_0_HUNG),
        )
        stdout, stderr = watch.communicate(timeout=90)
    finally:
        target.kill()
        target.wait()
    assert watch.returncode == 0, stderr
    records = [json.loads(line) for line in stdout.splitlines()]
    assert len(records) >= 5  # it sampled the process's host metrics all along
    assert {record["gpu_memory_reason"] for record in records} == {f"no GPU readings: {GPU_0_SAID}"}
    assert all(record["gpus"] == [] for record in records)


@pytest.mark.asyncio
async def test_the_dashboard_starts_and_says_the_gpu_did_not_answer(tmp_path, db_path, monkeypatch):
    for name, value in hung_env(tmp_path, GPU_0_HUNG).items():
        monkeypatch.setenv(name, value)
    app = GpuAnatApp(TINY, db_path=db_path, sampler_factory=open_source, sample_interval_s=0.1)
    async with app.run_test(size=(160, 40)) as pilot:
        status = app.dashboard.status_line
        await wait_for(pilot, lambda: GPU_0_SAID in status.render().plain, timeout_s=30, what="the reason")
        await wait_for(
            pilot, lambda: app.dashboard.live_charts.latest_sample is not None, timeout_s=30, what="a host sample"
        )


def test_predict_says_nvml_did_not_answer_instead_of_waiting(tmp_path):
    predicted = run_cli(["predict", "--preset", "tiny", "--json"], None, extra_env=hung_env(tmp_path, INIT_HUNG))
    assert predicted.returncode == 0, predicted.stderr
    result = json.loads(predicted.stdout)
    assert result["gpu_memory_source"] == (
        f"no GPU memory to fit: NVML not answering (NVML did not return within {STARTUP_DEADLINE_S:g} s at "
        "start-up); give --gpu-memory"
    )


def test_a_run_starts_trains_and_records_why_it_has_no_gpu_readings(tmp_path, db_path):
    ran = run_cli(["run", *TINY_CPU, "--json"], db_path, timeout_s=240, extra_env=hung_env(tmp_path, INIT_HUNG))
    assert ran.returncode == 0, ran.stderr
    with HistoryStore(db_path, read_only=True) as store:
        (run,) = store.runs()
    assert run.status == "ok" and run.result.steps
    assert run.environment["nvml"]["reason"] == (
        f"NVML not answering (NVML did not return within {STARTUP_DEADLINE_S:g} s at start-up)"
    )
