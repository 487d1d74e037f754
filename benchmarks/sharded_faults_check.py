"""On 2 or more GPUs: a decoder sharded by FSDP2 under `gpuanat run`, then a fault, read from outside through NVML.

Scenarios: stop (SIGTERM to gpuanat at step 3, as Ctrl+C or a job scheduler stops it), kill-rank (SIGKILL to rank 1's
training process at step 3, as the kernel's OOM killer or a failed node does), oom (a configuration that cannot fit:
no checkpointing, batch 8 at seq 8192). For each it reports gpuanat's exit code, the printed status and every rank's,
the steps recorded, and how long until no process is left on any of the run's GPUs and their memory is back within
64 MiB of the reading before the run. One JSON line a scenario:

    python3 benchmarks/sharded_faults_check.py --model /dev/shm/llama-3.1-8b --out faults.jsonl [--gpus 2]
        [--scenario stop --scenario kill-rank --scenario oom]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import pynvml
from fault_check import RELEASED_WITHIN_BYTES, REPO, _max_step  # this folder: the one-GPU fault check's helpers

STEP_OF_FAULT = 3
SCENARIOS = ("stop", "kill-rank", "oom")


def _rank_process(parent: psutil.Process, local_rank: str) -> psutil.Process | None:
    for process in parent.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            if process.environ().get("LOCAL_RANK") == local_rank and "torchrun" not in " ".join(process.cmdline()):
                return process
    return None


def run_scenario(name: str, model: str, gpus: int, handles: list[Any], workdir: Path) -> dict[str, Any]:
    db = workdir / f"{name}.sqlite"
    flags = ["--model", model, "--gpus", str(gpus), "--distributed", "fsdp", "--precision", "bf16", "--json"]
    if name == "oom":
        flags += ["--batch-size", "8", "--seq-len", "8192", "--samples", "64", "--max-steps", "4"]
    else:
        flags += ["--grad-checkpointing", "--batch-size", "1", "--seq-len", "1024", "--samples", "100000"]
    before = [pynvml.nvmlDeviceGetMemoryInfo(handle).used for handle in handles]
    stdout_path = workdir / f"{name}.stdout"
    with open(stdout_path, "w") as stdout, open(workdir / f"{name}.stderr", "w") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "gpuanat", "run", *flags],
            cwd=REPO,
            stdout=stdout,
            stderr=stderr,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "GPUANAT_DB": str(db), "PYTHONUNBUFFERED": "1"},
        )
    started_s = time.monotonic()
    steps_at_fault = None
    if name != "oom":
        while _max_step(db) < STEP_OF_FAULT:
            assert process.poll() is None, f"{name}: gpuanat ended before the fault ({process.returncode})"
            assert time.monotonic() - started_s < 240, f"{name}: step {STEP_OF_FAULT} never came"
            time.sleep(0.2)
        steps_at_fault = _max_step(db)
        if name == "stop":
            process.send_signal(signal.SIGTERM)
        else:
            rank = _rank_process(psutil.Process(process.pid), "1")
            assert rank is not None, "rank 1's process not found"
            rank.send_signal(signal.SIGKILL)
    fault_at_s = time.monotonic()
    gpuanat_exit_s = processes_gone_s = memory_back_s = None
    while time.monotonic() - fault_at_s < 240:
        now_s = time.monotonic() - fault_at_s
        if gpuanat_exit_s is None and process.poll() is not None:
            gpuanat_exit_s = now_s
        left = sum(len(pynvml.nvmlDeviceGetComputeRunningProcesses(handle)) for handle in handles)
        if gpuanat_exit_s is not None and processes_gone_s is None and left == 0:
            processes_gone_s = now_s
        used = [pynvml.nvmlDeviceGetMemoryInfo(handle).used for handle in handles]
        back = all(now - was <= RELEASED_WITHIN_BYTES for now, was in zip(used, before, strict=True))
        if processes_gone_s is not None and back:
            memory_back_s = now_s
            break
        time.sleep(0.1)
    lines = [line for line in stdout_path.read_text().splitlines() if line.startswith("{")]
    printed = json.loads(lines[-1]) if lines else {}
    return {
        "scenario": name,
        "steps_at_fault": steps_at_fault,
        "gpuanat_exit_code": process.poll(),
        "gpuanat_exit_s": gpuanat_exit_s,
        "gpu_processes_gone_s": processes_gone_s,
        "device_memory_back_s": memory_back_s,
        "printed_status": printed.get("status"),
        "printed_steps": printed.get("steps"),
        "error": printed.get("error"),
        "ranks": [
            {"rank": rank.get("rank"), "status": rank.get("status"), "error": rank.get("error")}
            for rank in printed.get("ranks") or []
        ],
        "stderr_tail": (workdir / f"{name}.stderr").read_text()[-600:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, default=None)
    args = parser.parse_args()
    pynvml.nvmlInit()
    handles = [pynvml.nvmlDeviceGetHandleByIndex(index) for index in range(args.gpus)]
    with tempfile.TemporaryDirectory() as workdir, args.out.open("a") as out:
        for name in args.scenario or SCENARIOS:
            try:
                line = run_scenario(name, args.model, args.gpus, handles, Path(workdir))
            except AssertionError as error:
                line = {"scenario": name, "failed": str(error)}
            print(json.dumps(line), flush=True)
            out.write(json.dumps(line) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
