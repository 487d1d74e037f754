"""One case of benchmarks/sharded_reference_check.sh, rank by rank: the reference's peaks (torch's allocated and
reserved, NVML's reading of its process on its GPU after the run) beside gpuanat's measured and predicted ones, and
gpuanat's bands beside NVML. Prints a line a rank and appends them to OUT/summary.jsonl.

The device is compared with the reference process's own NVML reading (`process_used_bytes`), as gpuanat measures a
rank: the reference's `device_used_bytes` is NVML's first memory query, whose `used` counts the driver's reserve
(0.654 GB on every H200, in every reference recorded), which NVML's v2 query (gpuanat's) leaves out.

    python3 benchmarks/sharded_reference_summary.py CASE OUT
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GB = 1e9


def percent(predicted: float | None, measured: float | None) -> str:
    if not predicted or not measured:
        return "   —  "
    return f"{100 * (predicted - measured) / measured:+5.1f}%"


def main() -> None:
    case, out = sys.argv[1], Path(sys.argv[2])
    references = {}
    reference_path = out / f"reference-{case}.jsonl"
    if reference_path.exists():
        references = {line["local_rank"]: line for line in map(json.loads, reference_path.read_text().splitlines())}
    run_path = out / f"run-{case}.json"
    lines = [line for line in run_path.read_text().splitlines() if line.startswith("{")] if run_path.exists() else []
    run = json.loads(lines[-1]) if lines else None
    if run is None:
        print(f"{case}: gpuanat wrote no result")
    predicted = (run or {}).get("predicted") or {}
    print(
        f"{case}: gpuanat {run['status'] if run else '—'}, {run['steps'] if run else 0} steps; predicted peak "
        f"allocated {predicted.get('peak_allocated_bytes', 0) / GB:.2f}, reserved "
        f"{predicted.get('peak_reserved_bytes', 0) / GB:.2f}, "
        f"device {predicted.get('peak_device_bytes', 0) / GB:.2f} GB"
    )
    ranks = {rank["gpu_index"]: rank for rank in (run or {}).get("ranks") or []}
    with (out / "summary.jsonl").open("a") as summary:
        for gpu in sorted(set(references) | set(ranks)):
            reference, rank = references.get(gpu, {}), ranks.get(gpu, {})
            bands = rank.get("bands") or {}
            band_sum = sum(value for name, value in bands.items() if name != "free_bytes" and value)
            used = rank.get("device_memory_used_bytes")
            row = {
                "case": case,
                "gpu": gpu,
                "reference_peak_allocated_bytes": reference.get("peak_allocated_bytes"),
                "reference_peak_reserved_bytes": reference.get("peak_reserved_bytes"),
                "reference_device_used_bytes": reference.get("device_used_bytes"),
                "reference_process_used_bytes": reference.get("process_used_bytes"),
                "reference_s_per_step": reference.get("s_per_step_median"),
                "gpuanat_peak_allocated_bytes": rank.get("peak_allocated_bytes"),
                "gpuanat_peak_reserved_bytes": rank.get("peak_reserved_bytes"),
                "gpuanat_device_used_bytes": used,
                "gpuanat_bands_sum_bytes": band_sum or None,
                "predicted_peak_allocated_bytes": predicted.get("peak_allocated_bytes"),
                "predicted_peak_reserved_bytes": predicted.get("peak_reserved_bytes"),
                "predicted_peak_device_bytes": predicted.get("peak_device_bytes"),
                "bands": bands,
                "status": rank.get("status"),
            }
            summary.write(json.dumps(row) + "\n")
            measured = row["reference_peak_allocated_bytes"]
            print(
                f"  GPU {gpu}: reference allocated {(measured or 0) / GB:6.2f} reserved "
                f"{(row['reference_peak_reserved_bytes'] or 0) / GB:6.2f} "
                f"NVML {(row['reference_process_used_bytes'] or 0) / GB:6.2f}"
                f" | gpuanat {(row['gpuanat_peak_allocated_bytes'] or 0) / GB:6.2f} "
                f"{(row['gpuanat_peak_reserved_bytes'] or 0) / GB:6.2f} {(used or 0) / GB:6.2f}"
                f" | predicted vs reference: allocated {percent(row['predicted_peak_allocated_bytes'], measured)}"
                f" reserved {percent(row['predicted_peak_reserved_bytes'], row['reference_peak_reserved_bytes'])}"
                f" device {percent(row['predicted_peak_device_bytes'], row['reference_process_used_bytes'])}"
                f" | bands − NVML {percent(band_sum, used)}"
            )


if __name__ == "__main__":
    main()
