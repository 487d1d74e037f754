"""A GPU that falls over mid-run (issue #53): NVML faults injected at the NVML boundary of real processes.

No GPU here: NVML is an H200 pair recorded under DDP (tests/data/h200x2_ddp_trace.jsonl) played back through pynvml's
names (GPUANAT_NVML_REPLAY), and a fault plan (GPUANAT_NVML_FAULTS) makes its calls fail — the GPU lost, an unknown
error, a timeout, a call that blocks as a driver that stops answering, an XID the driver reports — in a real
`gpuanat watch --json`, a real `gpuanat run` and the real dashboard headless.
"""

from __future__ import annotations

import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import last_json, run_cli, start_cli
from test_tui import TINY, wait_for

from gpuanat.core.measure.nvml_faults import FAULTS_VARIABLE, REPLAY_VARIABLE
from gpuanat.core.measure.nvml_guard import NVML_DEADLINE_S
from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.measure.process_tree import HostOnlySource
from gpuanat.core.store.history import HistoryStore
from gpuanat.tui.app import GpuAnatApp

TWO_H200 = Path(__file__).resolve().parent / "data" / "h200x2_ddp_trace.jsonl"


def fault_env(tmp_path: Path, faults: list[dict]) -> dict[str, str]:
    plan = tmp_path / "faults.json"
    plan.write_text(json.dumps({"faults": faults}))
    return {REPLAY_VARIABLE: str(TWO_H200), FAULTS_VARIABLE: str(plan)}


def test_watch_json_goes_on_through_each_nvml_fault_names_the_gpu_and_recovers(tmp_path):
    faults = [
        {"gpu": 1, "error": "GPU_IS_LOST", "from_sample": 5, "until_sample": 12},
        {"gpu": 1, "xid": 79, "from_sample": 5},
        {"gpu": 0, "error": "UNKNOWN", "from_sample": 15, "until_sample": 18},
        {"gpu": 1, "error": "TIMEOUT", "from_sample": 21, "until_sample": 24},
        {"gpu": 0, "block_s": 4.0, "from_sample": 27},
    ]
    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started_s = time.monotonic()
        watch = start_cli(
            ["watch", str(target.pid), "--json", "--interval", "0.1", "--duration", "9"],
            None,
            extra_env=fault_env(tmp_path, faults),
        )
        stdout, stderr = watch.communicate(timeout=60)
        took_s = time.monotonic() - started_s
    finally:
        target.kill()
        target.wait()
    assert watch.returncode == 0, stderr
    records = [json.loads(line) for line in stdout.splitlines()]
    errors = [{gpu["index"]: gpu["nvml_error"] for gpu in record["gpus"]} for record in records]

    def seen(text: str, gpu: int) -> list[int]:
        return [at for at, record in enumerate(errors) if text in (record[gpu] or "")]

    lost = seen("GPU 1 lost (NVML: GPU is lost)", 1)
    unknown = seen("GPU 0 not readable (NVML: Unknown Error)", 0)
    timeout = seen("GPU 1 not readable (NVML: Timeout)", 1)
    blocked = seen(f"GPU 0 not answering (an NVML call did not return within {NVML_DEADLINE_S:g} s)", 0)
    assert lost == list(range(5, 12))  # the plan's samples, each record the sample of its number
    assert unknown == list(range(15, 18))
    assert timeout == list(range(21, 24))
    assert len(blocked) >= 5  # 2 s of the 4 s block at 0.1 s, past the deadline
    assert all(errors[at][1] == "GPU 1 not read (NVML is waiting on GPU 0)" for at in blocked)
    # while one GPU failed, the other was read; after each fault, both were read again
    assert all(records[at]["gpus"][0]["used_bytes"] is not None for at in lost + timeout)
    assert all(records[at]["gpus"][1]["used_bytes"] is not None for at in unknown)
    for last in (lost[-1], unknown[-1], timeout[-1], blocked[-1]):
        after = records[last + 1]["gpus"]
        assert [gpu["nvml_error"] for gpu in after] == [None, None]
        assert all(gpu["used_bytes"] is not None and gpu["total_bytes"] for gpu in after)
    # the watched process holds no memory on the recorded GPUs: where a GPU gave no readings that is not known
    assert {records[at]["gpu_memory_bytes"] for at in range(5)} == {0}
    assert all(records[at]["gpu_memory_bytes"] is None for at in lost + unknown + timeout + blocked)
    assert records[lost[0]]["gpu_memory_reason"] == "GPU 1 lost (NVML: GPU is lost)"
    # the driver's XID, carried by GPU 1's records from the sample that read it on (a minute: the whole watch)
    xids = [(record["gpus"][0]["xid_errors"], record["gpus"][1]["xid_errors"]) for record in records]
    assert xids[:5] == [(None, None)] * 5
    assert all(pair == (None, [79]) for pair in xids[5:] if pair[1] is not None)
    assert sum(pair == (None, [79]) for pair in xids) >= len(records) - 5 - len(blocked)
    # records went on: one gap of the deadline where the call blocked, else the interval
    times = [record["t"] for record in records]
    gaps = [later - earlier for earlier, later in itertools.pairwise(times)]
    assert max(gaps) < NVML_DEADLINE_S + 1.0
    assert gaps[blocked[0] - 1] >= NVML_DEADLINE_S - 0.1  # the sample that met the blocked call waited for it
    assert statistics.median(gaps) < 0.2
    assert times[-1] >= 9.0 and took_s < 30


def test_a_cpu_run_whose_sampler_faults_ends_with_its_status_steps_and_result(tmp_path, db_path):
    faults = [
        {"gpu": 0, "block_s": 3.0, "from_sample": 2},  # the driver stops answering, then answers
        {"gpu": 1, "error": "GPU_IS_LOST", "from_sample": 1},  # GPU 1 never comes back
    ]
    args = ["run", "--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "64", "--batch-size", "4"]
    completed = run_cli([*args, "--json"], db_path, extra_env=fault_env(tmp_path, faults))
    assert completed.returncode == 0, completed.stderr
    result = last_json(completed.stdout)
    assert result["status"] == "ok"
    assert result["steps"] == 16
    faults_said = result["unavailable"]["gpu_readings"]
    assert "GPU 1 lost (NVML: GPU is lost) in " in faults_said
    assert faults_said.endswith("still failing at the end")
    with HistoryStore(db_path) as store:
        (row,) = store.runs()
        assert row.status == "ok"
        assert len(store.steps(row.id)) == 16
        samples = store.samples(row.id)
    assert any(gpu.get("nvml_error") == "GPU 1 lost (NVML: GPU is lost)" for s in samples for gpu in s["gpus"])


@pytest.mark.asyncio
async def test_the_dashboard_keeps_painting_while_nvml_blocks_and_says_which_gpu_failed(tmp_path, db_path, monkeypatch):
    for name, value in fault_env(
        tmp_path,
        [
            {"gpu": 1, "error": "GPU_IS_LOST", "from_sample": 3, "until_sample": 10},
            {"gpu": 1, "xid": 79, "from_sample": 3},
            {"gpu": 0, "block_s": 6.0, "from_sample": 20},
        ],
    ).items():
        monkeypatch.setenv(name, value)
    app = GpuAnatApp(TINY, db_path=db_path, sampler_factory=open_source, sample_interval_s=0.1)
    async with app.run_test(size=(160, 40)) as pilot:
        dashboard = app.dashboard

        def status() -> str:
            return dashboard.status_line.render().plain

        await wait_for(pilot, lambda: "GPU 1 lost (NVML: GPU is lost)" in status(), timeout_s=30, what="GPU 1 lost")
        assert "GPU 1 reported XID 79 (GPU has fallen off the bus)" in status()
        await wait_for(pilot, lambda: "lost" not in status(), timeout_s=30, what="GPU 1 back")
        await wait_for(pilot, lambda: "GPU 0 not answering" in status(), timeout_s=30, what="the blocked call")
        # NVML's call is still blocked (6 s): the paint tick goes on, painting the samples that say so
        painted_at = []
        for _ in range(8):
            started_s = time.monotonic()
            await pilot.pause(0.1)
            assert time.monotonic() - started_s < 1.0  # the event loop is not held by the blocked call
            painted_at.append(dashboard.live_charts.latest_sample.t_s)
            assert "GPU 0 not answering" in status()
        assert len(set(painted_at)) >= 4
        assert "NVIDIA H200" in status()
        await wait_for(pilot, lambda: "not answering" not in status(), timeout_s=30, what="NVML answering again")
        latest = dashboard.live_charts.latest_sample
        assert all(gpu.nvml_error is None and gpu.used_bytes is not None for gpu in latest.gpus)


def test_a_fault_plan_that_cannot_be_used_makes_nvml_unavailable_with_the_reason(tmp_path, monkeypatch):
    plan = tmp_path / "faults.json"
    monkeypatch.setenv(REPLAY_VARIABLE, str(TWO_H200))
    monkeypatch.setenv(FAULTS_VARIABLE, str(plan))
    said = []
    for text in ('{"faults": [{"gpu": 0, "error": "ON_FIRE"}]}', '{"faults": [{"gpu": 0}]}', "not json"):
        plan.write_text(text)
        source, status = open_source()
        source.close()
        assert not status.available and isinstance(source, HostOnlySource)  # host metrics still
        said.append(status.reason)
    assert "unknown NVML error 'ON_FIRE'" in said[0]
    assert "each fault needs one of error, block_s and xid" in said[1]
    assert said[2].startswith(f"{plan}: not a fault plan (JSONDecodeError")
