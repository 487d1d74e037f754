"""What each NVML reading of `NvmlSource` costs on a GPU (issue #51's sampling budget): the CPU time of each call,
median of --reads, and of a whole `NvmlSource.read` with and without GPM's once-a-second read.

    python benchmarks/gpm/read_cost.py [--reads 400] > cost.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import pynvml

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpuanat.core.measure.gpm import GpmReader
from gpuanat.core.measure.nvml_source import NvmlSource


def timed(call, reads: int) -> float:
    """Median CPU seconds a call."""
    costs = []
    for _ in range(reads):
        started = time.process_time()
        call()
        costs.append(time.process_time() - started)
    return statistics.median(costs)


def wall_timed(call, reads: int) -> float:
    costs = []
    for _ in range(reads):
        started = time.perf_counter()
        call()
        costs.append(time.perf_counter() - started)
    return statistics.median(costs)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reads", type=int, default=400)
    args = parser.parse_args()
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    calls = {
        "memory info v2": lambda: pynvml.nvmlDeviceGetMemoryInfo(handle, version=pynvml.nvmlMemory_v2),
        "utilization": lambda: pynvml.nvmlDeviceGetUtilizationRates(handle),
        "power": lambda: pynvml.nvmlDeviceGetPowerUsage(handle),
        "temperature": lambda: pynvml.nvmlDeviceGetTemperature(handle, pynvml.NVML_TEMPERATURE_GPU),
        "process list": lambda: pynvml.nvmlDeviceGetComputeRunningProcesses(handle),
        "energy counter": lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle),
        "SM clock": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
        "memory clock": lambda: pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_MEM),
        "clocks event reasons": lambda: pynvml.nvmlDeviceGetCurrentClocksEventReasons(handle),
    }
    reader = GpmReader(pynvml, handle)
    calls["GPM sample and metrics"] = reader.read
    report = {
        "cpu_s_per_call": {name: timed(call, args.reads) for name, call in calls.items()},
        "wall_s_per_call": {name: wall_timed(call, args.reads) for name, call in calls.items()},
    }
    source = NvmlSource()
    reads = []
    for _ in range(args.reads):
        started_cpu, started_wall = time.process_time(), time.perf_counter()
        source.read([])
        reads.append((time.process_time() - started_cpu, time.perf_counter() - started_wall))
        time.sleep(0.01)
    report["NvmlSource.read"] = {
        "cpu_s_median": statistics.median(cpu for cpu, _ in reads),
        "wall_s_median": statistics.median(wall for _, wall in reads),
        "wall_s_p90": sorted(wall for _, wall in reads)[int(0.9 * len(reads))],
    }
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
