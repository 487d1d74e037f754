"""On a GPU: stop signals and a killed gpuanat during real bert-large training, read from outside through NVML.

For each scenario it starts `gpuanat run` (bert-large, bf16, batch 16, far more samples than it will train), waits
for the moment the scenario names, delivers the fault, and then reads NVML every 0.1 s until the training process
has left the device's compute processes and the device's used memory is back within 64 MiB of what it was before
the run. It reports gpuanat's exit code, the run's status as printed (--json) and as the history holds it after a
writable open, the steps recorded, and how long the GPU memory took to come back.

    python3 benchmarks/fault_check.py --out fault_check.json [--scenario NAME ...]

Scenarios: sigterm, sighup (gpuanat run stopped by a signal at step 20), sigkill (gpuanat killed at step 20),
sigkill-starting (gpuanat killed as soon as its child holds a CUDA context, before the first step).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pynvml

REPO = Path(__file__).resolve().parent.parent
RUN = ["--preset", "bert-large", "--precision", "bf16", "--batch-size", "16", "--samples", "200000", "--json"]
STEP_OF_FAULT = 20
RELEASED_WITHIN_BYTES = 64 * 1024**2
"""Device memory counts as given back when it is this close to the reading before the run."""
POLL_S = 0.1
SCENARIOS = {
    "sigterm": ("step", signal.SIGTERM),
    "sighup": ("step", signal.SIGHUP),
    "sigkill": ("step", signal.SIGKILL),
    "sigkill-starting": ("cuda-context", signal.SIGKILL),
}


def _device_used_bytes(handle: Any) -> int:
    return pynvml.nvmlDeviceGetMemoryInfo(handle).used


def _compute_pids(handle: Any) -> set[int]:
    return {process.pid for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)}


def _max_step(db: Path) -> int:
    with (
        contextlib.suppress(sqlite3.Error),
        contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection,
    ):
        return connection.execute("SELECT MAX(step) FROM steps").fetchone()[0] or 0
    return 0


def _training_child(parent: psutil.Process) -> psutil.Process | None:
    for child in parent.children():
        with contextlib.suppress(psutil.Error):
            if "--events-fd" in child.cmdline():  # the training child, not the capability probe
                return child
    return None


def run_scenario(name: str, handle: Any, workdir: Path) -> dict[str, Any]:
    moment, fault = SCENARIOS[name]
    db = workdir / f"{name}.sqlite"
    env = {**os.environ, "GPUANAT_DB": str(db), "PYTHONUNBUFFERED": "1"}
    baseline_bytes = _device_used_bytes(handle)
    stdout_path = workdir / f"{name}.stdout"
    with open(stdout_path, "w") as stdout, open(workdir / f"{name}.stderr", "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuanat", "run", *RUN],
            cwd=REPO,
            env=env,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
        )
    started_s = time.monotonic()
    parent = psutil.Process(process.pid)
    child = None
    while True:
        assert process.poll() is None, f"{name}: gpuanat ended before the fault ({process.returncode})"
        child = child or _training_child(parent)
        if moment == "cuda-context" and child is not None and child.pid in _compute_pids(handle):
            break
        if moment == "step" and _max_step(db) >= STEP_OF_FAULT:
            break
        assert time.monotonic() - started_s < 300, f"{name}: the moment never came"
        time.sleep(POLL_S / 2)
    assert child is not None
    tree = [child, *child.children(recursive=True)]
    fault_at_s = time.monotonic()
    steps_at_fault = _max_step(db)
    used_at_fault = _device_used_bytes(handle)
    process.send_signal(fault)
    gpuanat_exit_s = child_gone_s = memory_back_s = None
    while time.monotonic() - fault_at_s < 120:
        now_s = time.monotonic() - fault_at_s
        if gpuanat_exit_s is None and process.poll() is not None:
            gpuanat_exit_s = now_s
        if child_gone_s is None and child.pid not in _compute_pids(handle) and not any(p.is_running() for p in tree):
            child_gone_s = now_s
        if memory_back_s is None and _device_used_bytes(handle) - baseline_bytes <= RELEASED_WITHIN_BYTES:
            memory_back_s = now_s
        if None not in (gpuanat_exit_s, child_gone_s, memory_back_s):
            break
        time.sleep(POLL_S)
    lines = stdout_path.read_text().strip().splitlines()
    printed = json.loads(lines[-1]) if lines and lines[-1].startswith("{") else None
    from gpuanat.core.store.history import HistoryStore

    with HistoryStore(db) as store:  # a writable open: it finalises a run whose recorder is gone
        (row,) = store.runs()
        stored_steps = len(store.steps(row.id))
    return {
        "scenario": name,
        "signal": fault.name,
        "moment": moment,
        "steps_at_fault": steps_at_fault,
        "gpuanat_exit_code": process.returncode,
        "gpuanat_exit_s": gpuanat_exit_s,
        "training_processes_gone_s": child_gone_s,
        "device_memory_back_s": memory_back_s,
        "device_used_before_run_bytes": baseline_bytes,
        "device_used_at_fault_bytes": used_at_fault,
        "device_used_after_bytes": _device_used_bytes(handle),
        "printed_status": printed["status"] if printed else None,
        "printed_steps": printed["steps"] if printed else None,
        "history_status": row.status,
        "history_steps": stored_steps,
        "history_result_steps": row.result.steps,
        "history_finished_at": row.finished_at,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), default=None)
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    results: dict[str, Any] = {
        "gpu": pynvml.nvmlDeviceGetName(handle),
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "run": RUN,
        "scenarios": [],
    }
    with tempfile.TemporaryDirectory(prefix="gpuanat-faults-") as workdir:
        for name in args.scenario or list(SCENARIOS):
            outcome = run_scenario(name, handle, Path(workdir))
            print(json.dumps(outcome), flush=True)
            results["scenarios"].append(outcome)
            args.out.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
