"""What torch's allocator reserved beyond the peak allocated in a `gpuanat run --memory-snapshot` recording: its
segments, each grouped by the Python line whose request made the allocator reserve it.

The peak reserved is reached by segments; which requests created them says what the reserve above the peak is made
of (blocks of the sizes something once asked for, which later requests could not reuse or split). Replays the
device's trace (segment_alloc adds a segment, segment_free removes it; alloc and free_requested count the allocated)
to the moment the reserve was highest, and lists the segments alive then by the place that created them (the first
block allocated at a segment's start), with how much of each group was allocated at that moment. One JSON object on
stdout:

    python3 benchmarks/snapshot_reserve.py run.pickle [--top 20] > reserve.json

Segments reserved before the trace's first kept event are not in the trace: the JSON says how many bytes the trace
misses (the final snapshot's segments against the trace's).
"""

from __future__ import annotations

import argparse
import bisect
import json
import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

from peak_tensors import _where  # this folder: the innermost frames outside torch, named

LARGEST_SEGMENTS_LISTED = 24  # each with the innermost frames of the request it was reserved for


def reserve_peak(trace: list[dict[str, Any]]) -> dict[str, Any]:
    """Replay one device's trace to its highest reserve: the reserve, what was allocated then and at the trace's
    allocated peak, and the segments alive then, grouped by the place that created them."""
    segments: dict[int, dict[str, Any]] = {}
    blocks: dict[int, dict[str, Any]] = {}
    reserved = allocated = peak_reserved = peak_allocated = 0
    at_peak: tuple[int, int, list[dict[str, Any]], list[dict[str, Any]]] = (0, 0, [], [])
    for index, event in enumerate(trace):
        action = event["action"]
        if action in ("segment_alloc", "segment_map"):
            segments[event["addr"]] = dict(event, created_event=index)
            reserved += event["size"]
        elif action in ("segment_free", "segment_unmap") and event["addr"] in segments:
            reserved -= segments.pop(event["addr"])["size"]
        elif action == "alloc":
            blocks[event["addr"]] = event
            if event["addr"] in segments and "made_by" not in segments[event["addr"]]:
                # The request a new segment was reserved for is the first block at its start: its frames are whole,
                # where a segment_alloc event's may be cut short
                segments[event["addr"]]["made_by"] = event.get("frames", [])
            allocated += event["size"]
            peak_allocated = max(peak_allocated, allocated)
        elif action == "free_requested" and event["addr"] in blocks:
            allocated -= blocks.pop(event["addr"])["size"]
        if reserved > peak_reserved or (reserved == peak_reserved and allocated > at_peak[1]):  # its fullest
            peak_reserved = reserved
            at_peak = (index, allocated, list(segments.values()), list(blocks.values()))
    peak_event, allocated_then, alive, live_blocks = at_peak
    groups: dict[str, dict[str, int]] = defaultdict(
        lambda: {"segments": 0, "bytes": 0, "largest_bytes": 0, "allocated_bytes": 0}
    )
    starts = sorted(
        (segment["addr"], segment["addr"] + segment["size"], _where(_made_by(segment))) for segment in alive
    )
    for start, end, where in starts:
        groups[where]["segments"] += 1
        groups[where]["bytes"] += end - start
        groups[where]["largest_bytes"] = max(groups[where]["largest_bytes"], end - start)
    allocated_in = [0] * len(starts)
    for block in live_blocks:  # which segment each live block lies in: the last one starting at or before it
        index = bisect.bisect_right(starts, (block["addr"], float("inf"))) - 1
        if index >= 0 and block["addr"] < starts[index][1]:
            groups[starts[index][2]]["allocated_bytes"] += block["size"]
            allocated_in[index] += block["size"]
    by_start = {segment["addr"]: segment for segment in alive}
    largest = sorted(range(len(starts)), key=lambda position: starts[position][0] - starts[position][1])
    return {
        "peak_reserved_bytes": peak_reserved,
        "event": peak_event,
        "trace_events": len(trace),
        "allocated_then_bytes": allocated_then,
        "trace_peak_allocated_bytes": peak_allocated,
        "by_place": dict(sorted(groups.items(), key=lambda item: -item[1]["bytes"])),
        "largest_segments": [
            {
                "bytes": starts[position][1] - starts[position][0],
                "allocated_bytes": allocated_in[position],
                "created_event": by_start[starts[position][0]]["created_event"],
                "made_by": _where(_made_by(by_start[starts[position][0]]), 8, skipped=()),
            }
            for position in largest[:LARGEST_SEGMENTS_LISTED]
        ],
    }


def _made_by(segment: dict[str, Any]) -> list[dict[str, Any]]:
    """The frames of the request a segment was reserved for: its first block's, whole, else the segment event's."""
    return segment.get("made_by") or segment.get("frames", [])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("snapshot", type=Path)
    parser.add_argument("--top", type=int, default=20, help="places listed (20)")
    parser.add_argument("--device", type=int, default=0)
    args = parser.parse_args()
    snapshot = pickle.loads(args.snapshot.read_bytes())
    result = reserve_peak(snapshot["device_traces"][args.device])
    result["by_place"] = dict(list(result["by_place"].items())[: args.top])
    final = sum(
        segment["total_size"]
        for segment in snapshot.get("segments", [])
        if segment.get("device", args.device) == args.device
    )
    result["final_segments_bytes"] = final
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
