"""What the live sampler's host side costs per read: psutil on a real process tree, without NVML.

`gpuanat watch PID` reads, every 0.25 s, NVML (absent here) and, through `HostProcessMeter`, the CPU and RSS of the
watched process and each of its descendants (`per_process=True`: pid, parent, name of each too); the tree itself is
walked again once a second (`DEFAULT_DESCENDANTS_REFRESH_S`), which reads /proc/*/stat of every process on the
machine. This starts a tree like a training's (a parent and `--children` DataLoader-like workers), then times on
this thread, CPU and wall:

- a read of the known tree (what three reads in four cost),
- a walk of the tree (`_walk_tree`, the fourth read's extra),
- reads at the watch's pace, 4 a second for `--seconds`, the walks included (the mean a read costs in use),
- `WatchSession.handle` of those samples (the record the dashboard paints, built on the sampler thread).

    python benchmarks/sampler_host_cost.py --out benchmarks/results/cpu/sampler_host_cost.json
    python benchmarks/sampler_host_cost.py --nvml --out benchmarks/results/h100/sampler_cost.json   # a GPU machine

`--nvml` (a machine with an NVIDIA driver) times each NVML reading the watch makes of GPU 0 apart — memory, utilization,
power, the process list, temperature, per-process utilization — and a whole `NvmlSource.read`, and paces the reads
through `NvmlSource` (what `gpuanat watch` reads) instead of the host alone.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

CHILD = "import time\nwhile True:\n    time.sleep(0.01)\n"
PARENT = """import subprocess, sys, time
workers = [subprocess.Popen([sys.executable, "-c", {child!r}]) for _ in range({children})]
x = b"x" * (64 * 1024 * 1024)
while True:
    sum(range(20000)); time.sleep(0.005)
"""


def timed(call: Callable[[], Any], repeat: int) -> dict[str, float]:
    """CPU (this thread) and wall milliseconds per call: median and the spread of `repeat` calls."""
    cpu_ms, wall_ms = [], []
    for _ in range(repeat):
        cpu_start, wall_start = time.thread_time(), time.perf_counter()
        call()
        cpu_ms.append(1000 * (time.thread_time() - cpu_start))
        wall_ms.append(1000 * (time.perf_counter() - wall_start))
    return {
        "cpu_ms_median": round(statistics.median(cpu_ms), 3),
        "cpu_ms_min": round(min(cpu_ms), 3),
        "cpu_ms_max": round(max(cpu_ms), 3),
        "wall_ms_median": round(statistics.median(wall_ms), 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--children", type=int, default=4, help="workers under the watched process")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long to read at the watch's pace")
    parser.add_argument("--interval", type=float, default=0.25)
    parser.add_argument("--nvml", action="store_true", help="time NVML's readings too (needs an NVIDIA driver)")
    args = parser.parse_args()

    from gpuanat.core.measure.nvml_source import NvmlSource, nvml_memory_info, nvml_processes, probe_nvml
    from gpuanat.core.measure.process_tree import DEFAULT_DESCENDANTS_REFRESH_S, HostOnlySource
    from gpuanat.core.measure.samples import NvmlStatus
    from gpuanat.core.watch.session import WatchSession
    from gpuanat.core.watch.target import resolve_target

    nvml = (
        probe_nvml()
        if args.nvml
        else NvmlStatus(
            available=False, reason="not asked (--nvml)", driver_version=None, cuda_driver_version=None, gpu_names=()
        )
    )
    if args.nvml and not nvml.available:
        raise SystemExit(f"--nvml: {nvml.reason}")

    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT.format(child=CHILD, children=args.children)], start_new_session=True
    )
    try:
        deadline = time.monotonic() + 10
        while len(psutil.Process(parent.pid).children(recursive=True)) < args.children:
            if time.monotonic() > deadline:
                raise SystemExit("the workers did not start")
            time.sleep(0.05)
        source = HostOnlySource(per_process=True)
        meter = source._host
        pids = [parent.pid]
        source.read(pids)  # the tree walked, every process met once (psutil's CPU% needs two readings)
        known_tree = timed(lambda: meter.measure(pids), 200)  # within the refresh interval: no walk
        walk = timed(lambda: meter._walk_tree(frozenset(pids)), 50)
        nvml_readings = None
        if args.nvml:
            gpu_source = NvmlSource(per_process=True)
            api = gpu_source._nvml
            index, handle, _name = gpu_source._devices[0]
            gpu_source.read(pids)
            nvml_readings = {
                "memory": timed(lambda: nvml_memory_info(api, handle), 200),
                "utilization": timed(lambda: api.nvmlDeviceGetUtilizationRates(handle), 200),
                "power": timed(lambda: api.nvmlDeviceGetPowerUsage(handle), 200),
                "processes": timed(lambda: nvml_processes(api, handle), 200),
                "temperature": timed(lambda: gpu_source._read_temperature_c(handle), 200),
                "process utilization": timed(lambda: gpu_source._read_process_utilization(index, handle), 200),
                "a whole read (every GPU and the host tree)": timed(lambda: gpu_source.read(pids), 100),
            }
            gpu_source.close()

        session = WatchSession(resolve_target(parent.pid), nvml)  # as the watch makes it: publications polled
        reads_cpu_ms, handle_cpu_ms = [], []
        paced = NvmlSource(per_process=True) if args.nvml else HostOnlySource(per_process=True)
        next_s = time.monotonic()
        end_s = next_s + args.seconds
        while next_s < end_s:
            cpu_start = time.thread_time()
            sample = paced.read(pids)
            read_end = time.thread_time()
            session.handle(sample)
            reads_cpu_ms.append(1000 * (read_end - cpu_start))
            handle_cpu_ms.append(1000 * (time.thread_time() - read_end))
            next_s += args.interval
            time.sleep(max(0.0, next_s - time.monotonic()))
        session.close()
        paced.close()
        tree = len(sample.host.processes)
    finally:
        for process in psutil.Process(parent.pid).children(recursive=True):
            process.kill()
        parent.kill()
        parent.wait()

    paced_result = {
        "reads": len(reads_cpu_ms),
        "read_cpu_ms_mean": round(statistics.fmean(reads_cpu_ms), 3),
        "read_cpu_ms_median": round(statistics.median(reads_cpu_ms), 3),
        "read_cpu_ms_max": round(max(reads_cpu_ms), 3),
        "handle_cpu_ms_mean": round(statistics.fmean(handle_cpu_ms), 3),
        "percent_of_one_core": round(100 * (sum(reads_cpu_ms) + sum(handle_cpu_ms)) / 1000 / args.seconds, 3),
    }
    result = {
        "processes_in_tree": tree,
        "processes_on_machine": len(psutil.pids()),
        "descendants_refresh_s": DEFAULT_DESCENDANTS_REFRESH_S,
        "interval_s": args.interval,
        "read_of_known_tree": known_tree,
        "tree_walk": walk,
        "at_the_watch_pace": paced_result,
        "nvml_readings_of_gpu_0": nvml_readings,
        "paced_source": type(paced).__name__,
        "machine": platform.node(),
        "python": platform.python_version(),
        "psutil": psutil.__version__,
        "cpu_count": os.cpu_count(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
