"""What is allocated at the peak of a `gpuanat run --memory-snapshot`: the allocator's history replayed to the moment
allocated memory was highest, its live blocks grouped by the Python line that allocated them.

For finding what a memory model misses: the groups are listed largest first, each with its count, total MiB and
the innermost frames outside torch's own modules (where a model, PEFT or Liger asked for the memory).

    python benchmarks/peak_tensors.py SNAPSHOT.pickle [--top 25] [--after-alloc-mib 0]
"""

from __future__ import annotations

import argparse
import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

MIB = 2**20
LIBRARY_PARTS = ("/torch/", "<frozen", "/contextlib.py", "/functools.py")
"""Frames skipped when naming where a block came from: torch's and Python's own plumbing."""


def _where(frames: list[dict[str, Any]], depth: int = 3, skipped: tuple[str, ...] = LIBRARY_PARTS) -> str:
    """The innermost `depth` frames outside `skipped` (torch's and Python's plumbing), innermost first."""
    chosen = [frame for frame in frames if not any(part in frame.get("filename", "") for part in skipped)]
    return " < ".join(f"{Path(frame['filename']).name}:{frame['line']} {frame['name']}" for frame in chosen[:depth])


def peak_blocks(snapshot: dict[str, Any], device: int = 0) -> tuple[int, int, list[dict[str, Any]]]:
    """Replay the device's trace: (peak allocated bytes, index of the event that reached it, its live blocks)."""
    live: dict[int, dict[str, Any]] = {}
    allocated = peak = peak_index = 0
    peak_live: list[dict[str, Any]] = []
    for index, event in enumerate(snapshot["device_traces"][device]):
        action = event["action"]
        if action == "alloc":
            live[event["addr"]] = event
            allocated += event["size"]
            if allocated > peak:
                peak, peak_index = allocated, index
                peak_live = list(live.values())
        elif action == "free_requested" and event["addr"] in live:
            allocated -= live.pop(event["addr"])["size"]
    return peak, peak_index, peak_live


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--top", type=int, default=25, help="groups listed (25)")
    args = parser.parse_args()
    snapshot = pickle.loads(args.snapshot.read_bytes())
    peak, index, blocks = peak_blocks(snapshot)
    trace_length = len(snapshot["device_traces"][0])
    print(
        f"peak {peak / MIB:,.1f} MiB in the trace (event {index} of {trace_length}; blocks allocated before the "
        f"history began are not in it); {len(blocks)} blocks live"
    )
    groups: dict[str, list[int]] = defaultdict(list)
    for block in blocks:
        groups[_where(block.get("frames", []))].append(block["size"])
    for where, sizes in sorted(groups.items(), key=lambda item: -sum(item[1]))[: args.top]:
        print(f"{sum(sizes) / MIB:10.1f} MiB  {len(sizes):5d} x  {where or '(no Python frame)'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
