"""The warm worker (issue #32) measured on a GPU: `r` to the first step, warm against cold, and what a prepared worker
costs. One call of the device tool:

    python3 benchmarks/warm_worker.py OUT_DIR [--steps N]

1. Runs through `execute_run` (what the dashboard's `r`, sweep, tune and fit call), bert-large at the docs' settings,
   cold and warm in turn (two pairs): each run's start-up parts (`wall_breakdown_s`), seconds from the request to the
   first step's start (the parts up to "trainer init", the model's build left out as the issue asks, and with it) and
   end, train loss, peak allocated, bands and steady samples/s: a warm run must train the same.
2. While a worker is prepared and waiting: NVML's compute processes on every GPU (is the prepared worker one?) and the
   memory used, before it starts and once it is ready.
3. The allocator's options handed over: warm runs with expandable segments on and off, each writing a memory snapshot;
   the snapshot's segments say whether they are expandable.
4. The dashboard itself, driven with Pilot as a person would: wait until the status line says the training process
   is warm, press r, wait for the result; the same with warm starts off.

Writes OUT_DIR/results.json (everything) and OUT_DIR/summary.txt (the table for docs/warm_worker.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pickle
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from gpuanat.core.measure.startup import WALL_PARTS
from gpuanat.core.run.session import execute_run, run_environment
from gpuanat.core.run.warm import WarmWorkers
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import MEMORY_SNAPSHOT_VARIABLE, RunConfig

BEFORE_FIRST_STEP = [part for part, _ in WALL_PARTS[: WALL_PARTS.index(("trainer init", "trainer ready")) + 1]]
READY_TIMEOUT_S = 120.0


WORKLOAD = {"preset": "bert-large", "device": "cuda", "seq_len": 512, "batch_size": 4, "samples": 4096}
CPU_WORKLOAD = {"preset": "tiny", "device": "cpu", "seq_len": 32, "batch_size": 4, "samples": 256}
"""`--cpu`: the script's own check, anywhere (no allocator or NVML parts)."""


def config_for(steps: int, **changes: Any) -> RunConfig:
    return RunConfig.from_json({**WORKLOAD, "max_steps": steps, **changes})


def to_first_step_start_s(result: dict[str, Any], with_model: bool) -> float:
    parts = result["wall_breakdown_s"]
    return sum(parts.get(part, 0.0) for part in BEFORE_FIRST_STEP if with_model or part != "model")


def summary_of(result: dict[str, Any]) -> dict[str, Any]:
    return {
        "status": result["status"],
        "start": result.get("start"),
        "wall_breakdown_s": result["wall_breakdown_s"],
        "to_first_step_start_s": to_first_step_start_s(result, with_model=False),
        "to_first_step_start_with_model_s": to_first_step_start_s(result, with_model=True),
        "time_to_first_step_s": result.get("time_to_first_step_s"),
        "train_loss": result.get("train_loss"),
        "peak_allocated_bytes": result.get("peak_allocated_bytes"),
        "bands": result.get("bands"),
        "steady_samples_per_second": result.get("steady_samples_per_second"),
        "device_memory_used_bytes": result.get("device_memory_used_bytes"),
    }


def wait_ready(workers: WarmWorkers) -> float:
    started_s = time.monotonic()
    while workers.status() != "ready":
        if time.monotonic() - started_s > READY_TIMEOUT_S or workers.status() is None:
            raise RuntimeError(f"the prepared worker did not become ready (status {workers.status()})")
        time.sleep(0.05)
    return time.monotonic() - started_s


def gpu_state() -> dict[str, Any]:
    import pynvml

    pynvml.nvmlInit()
    try:
        state = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            state.append(
                {
                    "index": index,
                    "used_bytes": pynvml.nvmlDeviceGetMemoryInfo(handle).used,
                    "compute_pids": [p.pid for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle)],
                }
            )
        return {"gpus": state}
    finally:
        pynvml.nvmlShutdown()


def expandable_of(snapshot_path: Path) -> list[bool]:
    with snapshot_path.open("rb") as file:
        snapshot = pickle.load(file)
    return sorted({bool(segment.get("is_expandable")) for segment in snapshot["segments"]})


def execute_runs(out: Path, steps: int, store: HistoryStore, log_dir: Path) -> dict[str, Any]:
    report: dict[str, Any] = {"runs": [], "prepared": []}
    workers = WarmWorkers(enabled=True)
    config = config_for(steps)
    _, environment = run_environment(config, os.environ)
    try:
        for pair in range(2):
            cold = execute_run(config, store=store, log_dir=log_dir, name=f"cold {pair}")
            report["runs"].append({"kind": "cold", **summary_of(cold.to_json())})
            print("cold", json.dumps(report["runs"][-1]["wall_breakdown_s"]), flush=True)
            before = gpu_state() if config.device == "cuda" else None
            workers.prepare(environment)
            ready_s = wait_ready(workers)
            prepared_pid = workers.prepared_pid
            report["prepared"].append(
                {
                    "ready_after_s": ready_s,
                    "pid": prepared_pid,
                    "before": before,
                    "while_prepared": gpu_state() if config.device == "cuda" else None,
                }
            )
            print("prepared", json.dumps(report["prepared"][-1]), flush=True)
            warm = execute_run(config, store=store, log_dir=log_dir, name=f"warm {pair}", warm_workers=workers)
            report["runs"].append({"kind": "warm", **summary_of(warm.to_json())})
            print("warm", json.dumps(report["runs"][-1]["wall_breakdown_s"]), flush=True)
            workers.close()
            workers = WarmWorkers(enabled=True)
        report["allocator"] = []
        for expandable in (True, False) if config.device == "cuda" else ():
            snapshot = out / f"snapshot-expandable-{expandable}.pickle"
            short = config_for(3, expandable_segments=expandable)
            run_env = {**os.environ, MEMORY_SNAPSHOT_VARIABLE: str(snapshot)}
            workers.prepare(run_environment(short, run_env)[1])
            wait_ready(workers)
            result = execute_run(
                short,
                store=store,
                log_dir=log_dir,
                env=run_env,
                warm_workers=workers,
                name=f"warm expandable {expandable}",
            )
            report["allocator"].append(
                {
                    "expandable_segments": expandable,
                    "start": result.start,
                    "segments_expandable": expandable_of(snapshot),
                }
            )
            snapshot.unlink()
            print("allocator", json.dumps(report["allocator"][-1]), flush=True)
    finally:
        workers.close()
    return report


async def dashboard_run(db: Path, steps: int, warm: bool) -> dict[str, Any]:
    from gpuanat.tui.app import GpuAnatApp
    from gpuanat.tui.run_backend import LocalRunBackend

    workers = WarmWorkers(enabled=warm)
    app = GpuAnatApp(config_for(steps), db_path=db, backend=LocalRunBackend(db, warm_workers=workers))
    async with app.run_test(size=(120, 40)) as pilot:
        waited_s = time.monotonic()
        while warm and workers.status() != "ready":
            if time.monotonic() - waited_s > READY_TIMEOUT_S:
                raise RuntimeError("the dashboard's worker did not become ready")
            await pilot.pause(0.1)
        await pilot.pause(0.5)
        status_before = app.dashboard.run_state_text
        pressed_s = time.monotonic()
        await pilot.press("r")
        first_step_s = None
        while app.dashboard.last_result is None or app.dashboard.run_in_progress is not None:
            if (
                first_step_s is None
                and app.dashboard.run_in_progress is not None
                and app.dashboard.run_in_progress.last_step is not None
            ):
                first_step_s = time.monotonic() - pressed_s
            if time.monotonic() - pressed_s > 300:
                raise RuntimeError("the dashboard's run did not end")
            await pilot.pause(0.05)
        result = app.dashboard.last_result.to_json()
    return {
        "warm": warm,
        "status_before_r": status_before,
        "r_to_first_step_seen_s": first_step_s,
        **summary_of(result),
    }


def table(report: dict[str, Any]) -> str:
    lines = [
        "| run | r → first step's start (model aside) | with the model | r → first step's end | imports | "
        "CUDA init | train loss | steady samples/s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    rows = [(f"execute_run {run['kind']}", run) for run in report["runs"]]
    rows += [(f"dashboard {'warm' if run['warm'] else 'cold'}", run) for run in report.get("dashboard", [])]
    for name, run in rows:
        parts = run["wall_breakdown_s"]
        loss = run["train_loss"]
        rate = run["steady_samples_per_second"]
        lines.append(
            f"| {name} | {run['to_first_step_start_s']:.2f} s | "
            f"{run['to_first_step_start_with_model_s']:.2f} s | {run['time_to_first_step_s']:.2f} s | "
            f"{parts.get('imports', 0):.2f} s | "
            f"{parts.get('CUDA init', 0):.2f} s | {loss if loss is None else f'{loss:.4f}'} | "
            f"{rate if rate is None else f'{rate:.2f}'} |"
        )
    for kind in ("cold", "warm"):
        values = [run["to_first_step_start_s"] for run in report["runs"] if run["kind"] == kind]
        if values:
            lines.append(
                f"\nexecute_run {kind}: r → first step's start median {statistics.median(values):.2f} s "
                f"({', '.join(f'{v:.2f}' for v in values)})"
            )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cpu", action="store_true", help="the tiny preset on the CPU: the script's own check")
    args = parser.parse_args()
    if args.cpu:
        WORKLOAD.clear()
        WORKLOAD.update(CPU_WORKLOAD)
    args.out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="gpuanat-warm-"))
    report: dict[str, Any] = {"argv": sys.argv}
    try:
        with HistoryStore(folder / "history.sqlite") as store:
            report.update(execute_runs(args.out, args.steps, store, folder / "logs"))
        report["dashboard"] = []
        for warm in (True, False):
            report["dashboard"].append(asyncio.run(dashboard_run(folder / "history.sqlite", args.steps, warm)))
            print("dashboard", json.dumps(report["dashboard"][-1]["wall_breakdown_s"]), flush=True)
    finally:
        (args.out / "results.json").write_text(json.dumps(report, indent=1))
    summary = table(report)
    (args.out / "summary.txt").write_text(summary + "\n")
    print(summary)


if __name__ == "__main__":
    main()
