"""Record the caching allocator's history of real `gpuanat run`s, for replaying it (`gpuanat.core.memory.allocator`).

For each configuration and batch size: a 2-step `gpuanat run --memory-snapshot` of bert-large at seq 512 (the
largest-batch trials' workload, `max_batch_check.py`), whose snapshot is cut down to what a replay needs: every
allocation, free, segment and out-of-memory event (action, address, size), without stacks, and the device memory
the allocator could still have had when it was written (free + reserved). One gzipped JSON per run in --out-dir.

    python benchmarks/allocation_trace.py --out-dir DIR [--batches 8,12,16] [--parallel K] [--only JSON ...]

`--parallel K` records K configurations at once (each one's batches in turn); their device memory readings then
include each other, so the device's free memory is read from a run alone (the first configuration's first batch,
recorded before the others start).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import pickle
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from max_batch_check import CONFIGS as MAX_BATCH_CONFIGS
from max_batch_check import flags

CONFIGS: tuple[dict[str, Any], ...] = (
    *MAX_BATCH_CONFIGS,
    {"precision": "fp16", "grad_checkpointing": True},
    {"precision": "bf16", "grad_checkpointing": True, "optim": "sgd"},
    {"precision": "bf16", "grad_checkpointing": True, "grad_accum": 4},
    {"precision": "fp32", "grad_checkpointing": True, "optim": "sgd"},
    {"precision": "fp32", "grad_checkpointing": True, "optim": "adafactor"},
    {"precision": "fp32", "grad_checkpointing": True, "optim": "adamw_bnb_8bit"},
    {"precision": "fp32", "grad_checkpointing": True, "optim": "adamw_torch"},
    {"precision": "bf16", "grad_checkpointing": True, "optim": "adafactor"},
    {"precision": "bf16", "grad_checkpointing": True, "optim": "adamw_bnb_8bit"},
    {"precision": "fp16", "grad_checkpointing": True, "optim": "adafactor"},
)
"""Every technique set of the largest-batch trials on record (benchmarks/results/h100/anatomy/edge/ and before)."""
ACTIONS = (
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
)


def compact(snapshot: dict[str, Any]) -> dict[str, Any]:
    """What a replay needs of torch's snapshot: the events of device 0, in order, as [action, address, size,
    stream] (an out-of-memory event's address is the device's free memory then), and the segments alive when it was
    written."""
    events = [
        [entry["action"], entry.get("addr", entry.get("device_free")), entry["size"], entry["stream"]]
        for entry in snapshot["device_traces"][0]
        if entry["action"] in ACTIONS
    ]
    segments = [
        {
            "address": segment["address"],
            "total_size": segment["total_size"],
            "allocated_size": segment["allocated_size"],
            "segment_type": segment["segment_type"],
        }
        for segment in snapshot["segments"]
        if segment["device"] == 0
    ]
    return {"events": events, "segments": segments, "device": snapshot.get("gpuanat", {})}


def record(overrides: dict[str, Any], batch_size: int, out_dir: Path) -> dict[str, Any]:
    started_s = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        snapshot_path = Path(folder) / "snapshot.pickle"
        completed = subprocess.run(
            [
                sys.executable,
                "-m",
                "gpuanat",
                "run",
                *flags(overrides, batch_size),
                "--memory-snapshot",
                str(snapshot_path),
                "--json",
            ],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "GPUANAT_DB": str(Path(folder) / "runs.sqlite")},
        )
        lines = completed.stdout.strip().splitlines()
        result = json.loads(lines[-1]) if lines else {}
        if not snapshot_path.is_file():
            print(f"{json.dumps(overrides)} batch {batch_size}: no snapshot: {completed.stderr[-2000:]}", flush=True)
            return {"overrides": overrides, "batch_size": batch_size, "status": "no snapshot"}
        with snapshot_path.open("rb") as file:
            trace = compact(pickle.load(file))
    trace.update(
        {
            "overrides": overrides,
            "batch_size": batch_size,
            "status": result.get("status"),
            "config": result.get("config"),
            "peak_allocated_bytes": result.get("peak_allocated_bytes"),
            "peak_reserved_bytes": result.get("peak_reserved_bytes"),
            "error": result.get("error"),
        }
    )
    name = "_".join(f"{key}-{value}" for key, value in sorted(overrides.items())) + f"_b{batch_size}.json.gz"
    with gzip.open(out_dir / name, "wt") as file:
        json.dump(trace, file)
    seconds = time.perf_counter() - started_s
    print(
        f"{json.dumps(overrides)} batch {batch_size}: {trace['status']}, {len(trace['events'])} events "
        f"({seconds:.0f} s)",
        flush=True,
    )
    return {
        "overrides": overrides,
        "batch_size": batch_size,
        "status": trace["status"],
        "file": name,
        "events": len(trace["events"]),
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument(
        "--batches",
        type=lambda text: [int(part) for part in text.split(",")],
        default=[8, 12, 16],
        metavar="N,N,...",
        help="batch sizes to record each configuration at (8,12,16)",
    )
    parser.add_argument("--parallel", type=int, default=1, metavar="K", help="configurations recorded at once (1)")
    parser.add_argument(
        "--only",
        type=json.loads,
        action="append",
        metavar="JSON",
        help="record only these configurations (RunConfig overrides)",
    )
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    configs = args.only or CONFIGS
    alone = record(configs[0], args.batches[0], args.out_dir)

    def record_batches(overrides: dict[str, Any]) -> list[dict[str, Any]]:
        batches = args.batches[1:] if overrides is configs[0] else args.batches
        return [record(overrides, batch, args.out_dir) for batch in batches]

    with ThreadPoolExecutor(max_workers=args.parallel) as pool:
        index = [alone, *(entry for entries in pool.map(record_batches, configs) for entry in entries)]
    (args.out_dir / "index.json").write_text(json.dumps(index, indent=1))


if __name__ == "__main__":
    main()
