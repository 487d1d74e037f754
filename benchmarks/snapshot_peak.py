"""What was alive at the peak of a `gpuanat run --memory-snapshot` recording, by where it was allocated.

Replays each snapshot's allocator trace (alloc adds a block, free_completed removes it) to the moment the allocated
bytes were highest, and sums the blocks alive then by the Python frames that allocated them (the innermost frame of
the training code, and the innermost frame of all). Given two or more snapshots (the ranks of one run:
`FILE.pickle`, `FILE.rank1.pickle`, ...), it also prints, for each place, what every rank held there, so that what
one rank holds and another does not stands out. One JSON object on stdout; `--top K` places a rank.

    python3 benchmarks/snapshot_peak.py run.pickle run.rank1.pickle [--top 25] > peak.json

Blocks allocated before the trace's first kept event (`max_entries`) are not in the trace (benchmarks/peak_tensors.py
replays it; this groups by place and puts ranks side by side). The committed results of issue #34 were written when
this also printed the bytes left alive at the end.
"""

from __future__ import annotations

import argparse
import json
import pickle
from collections import defaultdict
from pathlib import Path
from typing import Any

from peak_tensors import peak_blocks  # this folder: the replay of one snapshot to its peak

TRAINING_CODE = (
    "gpuanat/",
    "accelerate/",
    "transformers/",
    "peft/",
    "deepspeed/",
    "torch/optim/",
    "torch/nn/parallel/",
    "torch/distributed/",
)
"""Frames that say which part of training allocated a block (the innermost of these is the block's place)."""


def _frame_text(frame: dict[str, Any]) -> str:
    filename = str(frame.get("filename", "?"))
    for marker in ("site-packages/", "dist-packages/"):
        if marker in filename:
            filename = filename.rsplit(marker, 1)[1]
            break
    else:
        if "/gpuanat/" in filename:
            filename = "gpuanat/" + filename.rsplit("/gpuanat/", 1)[1]
    return f"{filename}:{frame.get('line', '?')} {frame.get('name', '?')}"


def place_of(frames: list[dict[str, Any]]) -> str:
    """The innermost training-code frame of an allocation, and its innermost frame when that is another."""
    texts = [_frame_text(frame) for frame in frames]
    if not texts:
        return "(no stack)"
    training = next((text for text in texts if any(part in text for part in TRAINING_CODE)), None)
    if training is None or training == texts[0]:
        return texts[0]
    return f"{training} <- {texts[0]}"


def peak_of(snapshot: dict[str, Any], device: int | None = None) -> dict[str, Any]:
    """The peak of one device's trace (by default the device with the most events: a rank's own GPU): its allocated
    bytes, its index in the trace, the allocation that reached it, and the live blocks then, summed by place."""
    traces = snapshot["device_traces"]
    if device is None:
        device = max(range(len(traces)), key=lambda index: len(traces[index]))
    peak, peak_index, peak_live = peak_blocks(snapshot, device)
    peak_event = traces[device][peak_index] if traces[device] else {}
    by_place: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for block in peak_live:
        entry = by_place[place_of(block.get("frames", []))]
        entry[0] += block["size"]
        entry[1] += 1
    return {
        "device": device,
        "trace_events": len(traces[device]),
        "peak_index": peak_index,
        "peak_allocation": {
            "bytes": peak_event.get("size"),
            "place": place_of(peak_event.get("frames", [])),
            "stack": [_frame_text(frame) for frame in peak_event.get("frames", [])[:12]],
        },
        "peak_traced_allocated_bytes": peak,
        "by_place": {place: {"bytes": size, "blocks": count} for place, (size, count) in by_place.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("snapshots", type=Path, nargs="+")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    peaks = {}
    for path in args.snapshots:
        with open(path, "rb") as file:
            peaks[path.name] = peak_of(pickle.load(file))
    places = set().union(*(peak["by_place"] for peak in peaks.values()))
    rows = []
    for place in places:
        held = [peak["by_place"].get(place, {"bytes": 0})["bytes"] for peak in peaks.values()]
        rows.append({"place": place, "bytes_by_snapshot": held, "spread_bytes": max(held) - min(held)})
    rows.sort(key=lambda row: (-row["spread_bytes"], -max(row["bytes_by_snapshot"])))
    for peak in peaks.values():
        ranked = sorted(peak["by_place"].items(), key=lambda item: -item[1]["bytes"])[: args.top]
        peak["by_place"] = dict(ranked)
    print(
        json.dumps(
            {"snapshots": peaks, "differences": [row for row in rows if row["spread_bytes"]][: args.top]}, indent=1
        )
    )


if __name__ == "__main__":
    main()
