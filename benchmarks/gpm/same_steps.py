"""A run's steady medians against an independent GPM sampler cut over the very same steps (issue #51's check).

For each run of the history: its steady window is the end of its last warm-up step to the end of its last step
(`Step.monotonic_s` in the history's steps, on the clock the sampler's `t_s` uses); mapped to wall time through
`clock.json` (one wall/monotonic pair read at the start), it cuts the independent sampler's lines
(benchmarks/gpm/independent_gpm.py, 1 s intervals) whose whole interval lies inside. Energy per sample outside
gpuanat: the independent energy counter's rise over the window (first and last line inside) over the samples the
steps counted between those two times. Prints one JSON line per run and a summary.

    python benchmarks/gpm/same_steps.py --history H.sqlite --independent I.jsonl --clock clock.json [--interval 1]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sqlite3
import statistics
from pathlib import Path

NAMES = ("sm_active_percent", "sm_occupancy_percent", "tensor_active_percent", "dram_bandwidth_percent")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--history", required=True)
    parser.add_argument("--independent", required=True)
    parser.add_argument("--clock", required=True)
    parser.add_argument("--interval", type=float, default=1.0)
    args = parser.parse_args()
    clock = json.loads(Path(args.clock).read_text())
    offset_s = clock["wall_s"] - clock["monotonic_s"]
    lines = [json.loads(line) for line in Path(args.independent).read_text().splitlines() if line.strip()]
    db = sqlite3.connect(args.history)
    worst: dict[str, float] = {}
    for run_id, name, result_json in db.execute("SELECT id, name, result_json FROM runs ORDER BY id"):
        result = json.loads(result_json or "{}")
        steps = [json.loads(row) for (row,) in db.execute("SELECT record_json FROM steps WHERE run_id = ?", (run_id,))]
        ends = {step["step"]: step for step in steps if step.get("monotonic_s") is not None}
        warmup = result.get("warmup_steps") or 0
        if warmup not in ends or not ends:
            print(json.dumps({"run_id": run_id, "name": name, "skipped": "no steady window in the steps"}))
            continue
        start_s, end_s = ends[warmup]["monotonic_s"] + offset_s, max(s["monotonic_s"] for s in ends.values()) + offset_s
        inside = [line for line in lines if line["wall_s"] - args.interval >= start_s and line["wall_s"] <= end_s]
        row: dict = {"run_id": run_id, "name": name, "window_s": round(end_s - start_s, 2), "lines": len(inside)}
        for key in NAMES:
            theirs = statistics.median(line[key] for line in inside) if inside else None
            ours = result.get(key)
            row[key] = {"gpuanat": ours, "independent": theirs}
            if ours is not None and theirs is not None:
                worst[key] = max(worst.get(key, 0.0), abs(ours - theirs))
        if len(inside) >= 2:
            first, last = inside[0], inside[-1]
            points = sorted((s["monotonic_s"] + offset_s, s["samples"]) for s in ends.values())
            joules = (last["energy_mj"] - first["energy_mj"]) / 1000
            samples = _samples_at(points, last["wall_s"]) - _samples_at(points, first["wall_s"])
            theirs_j = joules / samples if samples > 0 else None
            ours_j = result.get("joules_per_sample")
            row["joules_per_sample"] = {"gpuanat": ours_j, "independent": theirs_j}
            if ours_j and theirs_j:
                row["joules_per_sample"]["error_percent"] = 100 * (ours_j - theirs_j) / theirs_j
                worst["joules_per_sample_percent"] = max(
                    worst.get("joules_per_sample_percent", 0.0), abs(row["joules_per_sample"]["error_percent"])
                )
        print(json.dumps(row))
    print(json.dumps({"worst_difference": worst}))
    return 0


def _samples_at(points: list[tuple[float, int]], wall_s: float) -> float:
    """The samples the steps ((wall time, samples so far), in order) had counted at `wall_s`, linear between the two
    steps around it."""
    for (t0, n0), (t1, n1) in itertools.pairwise(points):
        if t0 <= wall_s <= t1:
            return n0 + (n1 - n0) * (wall_s - t0) / (t1 - t0) if t1 > t0 else n1
    return points[-1][1]


if __name__ == "__main__":
    raise SystemExit(main())
