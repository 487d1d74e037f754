"""On a GPU: the real dashboard and `gpuanat watch` left open on a real training for the length of a device call —
their own memory, CPU and terminal output over time — and what reading XID events costs a sample.

    python3 benchmarks/soak_check.py --out soak.json --soak-s 420 [--zoom-key z] -- --preset bert-large ...

1. XID cost: NVML's own calls timed on this GPU — `XidReader.read` (an event set wait with timeout 0, the way every
   sample reads it) against one whole `NvmlSource.read` with it, each over --xid-reads calls.
2. Soak: `gpuanat` (the flags after --) in a 120×40 pseudo-terminal; `r` launches the run; `gpuanat watch PID` of the
   training worker in a second pseudo-terminal. Every --every-s: each monitor's own RSS (MiB), CPU (% of one core
   over the interval, the monitor's process alone) and bytes written to its terminal per second, and the worker's
   step from the history. The zoom key (when given) is pressed half way and again a minute later. At the end `q`,
   `y`: the run's status, steps and result keys as the history holds them.
Reported: each series, and the RSS and CPU drift from the first measured minute to the last.
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tui_cost import Terminal, pty_env


def rss_mib(process: psutil.Process) -> float | None:
    """The monitor's own resident memory (not its training child's)."""
    try:
        return round(process.memory_info().rss / 2**20, 1)
    except psutil.Error:
        return None


def cpu_seconds(process: psutil.Process) -> float:
    """The monitor's own CPU time (user + system; not its training child's)."""
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    return times.user + times.system


def xid_cost(reads: int) -> dict[str, Any]:
    import pynvml

    from gpuanat.core.measure.nvml_events import XidReader
    from gpuanat.core.measure.nvml_source import NvmlSource

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        return {"error": f"no NVML here: {error}"}
    handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(pynvml.nvmlDeviceGetCount())]
    reader = XidReader(pynvml, handles)
    started = time.perf_counter()
    for _ in range(reads):
        reader.read()
    xid_read_us = (time.perf_counter() - started) / reads * 1e6
    reader.close()
    source = NvmlSource()
    source.read([os.getpid()])
    started = time.perf_counter()
    for _ in range(reads // 10):
        source.read([os.getpid()])
    sample_us = (time.perf_counter() - started) / (reads // 10) * 1e6
    return {
        "xid_unavailable_reason": reader.unavailable_reason,
        "xid_read_us": round(xid_read_us, 2),
        "nvml_source_read_us": round(sample_us, 1),
        "xid_share_of_a_sample_percent": round(100 * xid_read_us / sample_us, 2),
        "reads": reads,
    }


def worker_pid(dashboard: psutil.Process) -> int | None:
    """The training worker among the dashboard's `gpuanat.worker` children: the one holding the most GPU memory
    (NVML's compute processes), else the one that used the most CPU. The dashboard also keeps an idle spare worker
    warm (`--warm-fd`) for the next run, and the run itself starts in the previous spare: both carry `--warm-fd`."""
    workers: dict[int, float] = {}
    for child in dashboard.children(recursive=True):
        try:
            if "gpuanat.worker" in " ".join(child.cmdline()):
                times = child.cpu_times()
                workers[child.pid] = times.user + times.system
        except psutil.Error:
            continue
    if not workers:
        return None
    gpu_bytes: dict[int, int] = {}
    try:
        import pynvml

        pynvml.nvmlInit()
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid in workers:
                    gpu_bytes[process.pid] = gpu_bytes.get(process.pid, 0) + (process.usedGpuMemory or 0)
    except Exception:  # no NVML here: the CPU decides
        gpu_bytes = {}
    if gpu_bytes:
        return max(gpu_bytes, key=lambda pid: gpu_bytes[pid])
    return max(workers, key=lambda pid: workers[pid])


def latest_step(db: Path) -> tuple[int | None, int | None]:
    """(run id, its highest recorded step) of the newest run in the history."""
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as connection:
            row = connection.execute("SELECT id FROM runs ORDER BY id DESC LIMIT 1").fetchone()
            if row is None:
                return None, None
            step = connection.execute("SELECT MAX(step) FROM steps WHERE run_id = ?", (row[0],)).fetchone()[0]
            return row[0], step
    except sqlite3.Error:
        return None, None


def soak(args: argparse.Namespace) -> dict[str, Any]:
    scratch = Path(tempfile.mkdtemp(prefix="gpuanat-soak-"))
    env = pty_env(scratch)
    db = Path(env["GPUANAT_DB"])
    dashboard = Terminal([sys.executable, "-m", "gpuanat", *args.gpuanat_flags], 120, 40, env)
    result: dict[str, Any] = {"flags": args.gpuanat_flags, "soak_s": args.soak_s}
    if dashboard.wait_for(b"Techniques", dashboard.started_s, timeout_s=60) is None:
        tail = b"".join(data for _, data in dashboard.chunks)[-600:].decode("utf-8", "replace")
        result["error"] = f"the dashboard never drew (exit {dashboard.process.poll()}): {tail}"
        return result
    time.sleep(3)
    dashboard.press("r")
    if dashboard.wait_for(b"step ", time.perf_counter(), timeout_s=240) is None:
        result["error"] = "the run never reported a step"
        return result
    tui = psutil.Process(dashboard.process.pid)
    pid = worker_pid(tui)
    watch = Terminal([sys.executable, "-m", "gpuanat", "watch", str(pid)], 120, 40, env) if pid else None
    watched = psutil.Process(watch.process.pid) if watch else None
    monitors = {"dashboard": (dashboard, tui), **({"watch": (watch, watched)} if watch and watched else {})}
    series: dict[str, list[dict[str, Any]]] = {name: [] for name in monitors}
    last = {name: (cpu_seconds(process), time.perf_counter()) for name, (_, process) in monitors.items()}
    began = time.perf_counter()
    zoom_presses = [began + args.soak_s / 2, began + args.soak_s / 2 + 60] if args.zoom_key else []
    while time.perf_counter() - began < args.soak_s:
        time.sleep(args.every_s)
        now = time.perf_counter()
        while zoom_presses and now >= zoom_presses[0]:
            zoom_presses.pop(0)
            for terminal, _ in monitors.values():
                terminal.press(args.zoom_key)
        _run_id, step = latest_step(db)
        for name, (terminal, process) in monitors.items():
            cpu_s = cpu_seconds(process)
            cpu_before, at_before = last[name]
            last[name] = (cpu_s, now)
            series[name].append(
                {
                    "t_s": round(now - began, 1),
                    "rss_mib": rss_mib(process),
                    "cpu_percent": round(100 * (cpu_s - cpu_before) / (now - at_before), 2),
                    "terminal_bytes_per_s": round(terminal.bytes_between(at_before, now) / (now - at_before)),
                    "alive": terminal.process.poll() is None,
                    "step": step,
                }
            )
    result["series"] = series
    for name, points in series.items():
        first, final = points[: max(1, 60 // int(args.every_s))], points[-max(1, 60 // int(args.every_s)) :]

        def mean(values: list[float]) -> float:
            return sum(values) / len(values)

        result[f"{name}_rss_first_minute_mib"] = round(mean([p["rss_mib"] for p in first]), 1)
        result[f"{name}_rss_last_minute_mib"] = round(mean([p["rss_mib"] for p in final]), 1)
        result[f"{name}_cpu_first_minute_percent"] = round(mean([p["cpu_percent"] for p in first]), 2)
        result[f"{name}_cpu_last_minute_percent"] = round(mean([p["cpu_percent"] for p in final]), 2)
    if watch:
        watch.press("q")
    dashboard.press("q")
    time.sleep(1)
    dashboard.press("y")
    try:
        dashboard.process.wait(timeout=90)
        result["dashboard_exit"] = dashboard.process.returncode
    except subprocess.TimeoutExpired:
        dashboard.process.kill()
        result["dashboard_exit"] = "killed after 90 s"
    if watch:
        try:
            watch.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            watch.process.kill()
    with sqlite3.connect(db) as connection:
        rows = connection.execute(
            "SELECT id, kind, status, result_json, (SELECT COUNT(*) FROM steps WHERE run_id = runs.id),"
            " (SELECT COUNT(*) FROM samples WHERE run_id = runs.id) FROM runs ORDER BY id"
        ).fetchall()
    result["history"] = [
        {
            "id": row[0],
            "kind": row[1],
            "status": row[2],
            "result_keys": len(json.loads(row[3])) if row[3] else 0,
            "steps_rows": row[4],
            "samples_rows": row[5],
        }
        for row in rows
    ]
    result["history_bytes"] = db.stat().st_size
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--soak-s", type=float, default=420)
    parser.add_argument("--every-s", type=float, default=15)
    parser.add_argument("--xid-reads", type=int, default=2000)
    parser.add_argument("--zoom-key", help="the charts' whole-run key, pressed half way and a minute later")
    parser.add_argument("gpuanat_flags", nargs="*")
    args = parser.parse_args()
    result = {"xid": xid_cost(args.xid_reads), "soak": soak(args)}
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    summary = {key: value for key, value in result["soak"].items() if key != "series"}
    print(json.dumps({"xid": result["xid"], **summary}, indent=2))


if __name__ == "__main__":
    main()
