"""An NVML GPM sampler independent of gpuanat (issue #51's check): raw pynvml, its own code, one GPU; every
--interval seconds one line of JSON with the wall time, GPM's SM active, occupancy, any-tensor and HMMA tensor
activity, DRAM bandwidth (percent over the interval), the energy counter (mJ) and the power (W).

    python benchmarks/gpm/independent_gpm.py --out FILE.jsonl [--interval 1.0] [--gpu 0]   # until killed
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time

import pynvml

METRICS = {
    "sm_active_percent": pynvml.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy_percent": pynvml.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor_active_percent": pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "tensor_16bit_active_percent": pynvml.NVML_GPM_METRIC_HMMA_TENSOR_UTIL,
    "dram_bandwidth_percent": pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL,
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--gpu", type=int, default=0)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(args.gpu)
    first, second = pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()
    pynvml.nvmlGpmSampleGet(handle, first)
    with open(args.out, "w") as out:
        while True:
            time.sleep(args.interval)
            pynvml.nvmlGpmSampleGet(handle, second)
            request = pynvml.c_nvmlGpmMetricsGet_t()
            request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(METRICS)
            request.sample1, request.sample2 = first, second
            for slot, metric in enumerate(METRICS.values()):
                request.metrics[slot].metricId = metric
            pynvml.nvmlGpmMetricsGet(request)
            record = {"wall_s": time.time()}
            record.update({name: request.metrics[slot].value for slot, name in enumerate(METRICS)})
            record["energy_mj"] = pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            record["power_w"] = pynvml.nvmlDeviceGetPowerUsage(handle) / 1000
            out.write(json.dumps(record) + "\n")
            out.flush()
            first, second = second, first


if __name__ == "__main__":
    raise SystemExit(main())
