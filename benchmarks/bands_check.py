"""Do the bands add up to NVML's device memory used at every step record? Read from a history database.

For every step record of every recorded run, the NVML sample nearest in time (the child stamps each step
with time.monotonic(), which Linux shares between processes, and the sampler stamps its samples with it):

- the bands as gpuanat shows them — other processes (device used - this process), CUDA context (this
  process - torch reserved), weights, gradients alive at the end of forward, optimizer state, activations
  (the probe's last exact measurement), temporaries & cache (reserved - those) — must all be >= 0;
- their sum equals device used by construction, because context and cache are differences. The part that
  can fail is whether every byte of the process is torch's allocator or a *fixed* context: so the check
  takes the context once (median over the run) and reports |other + context + reserved - device used|
  / device used at every step record. Over 1% means something else allocates device memory (a library
  outside torch's allocator, context growth), or the readings are too far apart in time.

    python benchmarks/bands_check.py HISTORY.sqlite --out bands_check.json
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
from pathlib import Path
from typing import Any

from gpuanat.core.history import HistoryStore
from gpuanat.core.sampler import Sample

TOLERANCE_PERCENT = 1.0


def check_run(store: HistoryStore, run_id: int, pid: int) -> dict[str, Any] | None:
    samples = [Sample.from_json(sample) for sample in store.samples(run_id)]
    samples = [sample for sample in samples if sample.gpus and sample.process_used_bytes([pid]) is not None]
    steps = [step for step in store.steps(run_id) if step.get("monotonic_s") and step.get("reserved_bytes")]
    if not samples or not steps:
        return None
    times = [sample.t_s for sample in samples]
    bands = None
    records = []
    for step in steps:
        bands = step.get("bands") or bands
        index = bisect.bisect_left(times, step["monotonic_s"])
        nearest = min((i for i in (index - 1, index) if 0 <= i < len(samples)),
                      key=lambda i: abs(times[i] - step["monotonic_s"]))
        sample = samples[nearest]
        device_used = sample.gpus[0].used_bytes
        process = sample.process_used_bytes([pid])
        reserved = step["reserved_bytes"]
        record = {"step": step["step"], "gap_s": sample.t_s - step["monotonic_s"], "device_used_bytes": device_used,
                  "process_used_bytes": process, "reserved_bytes": reserved,
                  "other_processes_bytes": device_used - process, "cuda_context_bytes": process - reserved}
        if bands is not None and bands.get("activations_bytes") is not None:
            tensors = (bands["weights_bytes"] + bands["gradients_at_forward_end_bytes"]
                       + bands["optimizer_state_bytes"] + bands["activations_bytes"])
            record["temporaries_and_cache_bytes"] = reserved - tensors
        records.append(record)
    context = statistics.median(record["cuda_context_bytes"] for record in records)
    for record in records:
        fixed_sum = record["other_processes_bytes"] + context + record["reserved_bytes"]
        record["fixed_context_error_percent"] = 100.0 * (fixed_sum - record["device_used_bytes"]) / record[
            "device_used_bytes"]
        record["negative_bands"] = [name for name in ("other_processes_bytes", "cuda_context_bytes",
                                                      "temporaries_and_cache_bytes") if record.get(name, 0) < 0]
    errors = [abs(record["fixed_context_error_percent"]) for record in records]
    return {
        "run_id": run_id, "step_records": len(records), "cuda_context_median_bytes": context,
        "cuda_context_range_bytes": [min(r["cuda_context_bytes"] for r in records),
                                     max(r["cuda_context_bytes"] for r in records)],
        "max_abs_error_percent": max(errors), "within_tolerance": sum(error <= TOLERANCE_PERCENT for error in errors),
        "max_abs_gap_s": max(abs(record["gap_s"]) for record in records),
        "records_with_negative_bands": sum(bool(record["negative_bands"]) for record in records),
        "records": records,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("db", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report = []
    with HistoryStore(args.db) as store:
        for run in reversed(store.runs()):
            pid = run.environment.get("pid")
            checked = check_run(store, run.id, pid) if pid else None
            if checked is None:
                continue
            checked["name"] = run.name
            report.append(checked)
            print(f"run {run.id} {run.name!r}: {checked['within_tolerance']}/{checked['step_records']} step records "
                  f"within {TOLERANCE_PERCENT}%, max error {checked['max_abs_error_percent']:.2f}%, context "
                  f"{checked['cuda_context_range_bytes'][0] / 2**20:.0f}-"
                  f"{checked['cuda_context_range_bytes'][1] / 2**20:.0f} MiB, "
                  f"max gap {checked['max_abs_gap_s']:.2f} s, "
                  f"{checked['records_with_negative_bands']} with a negative band")
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
