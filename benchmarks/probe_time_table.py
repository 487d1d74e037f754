"""The probe's cost per experiment, from its own clock: a table from `gpuanat sweep --json` output.

The probe times itself (AnatomyCallback.probe_time_by_part_s): its setup once per run, the steps it measures
exactly (the first three, then every 50th), the other steps, and the waits of its two CUDA synchronisations
(the GPU's queued work finishing, not the probe's work). Its cost is the time on the training loop's thread
spent in it, as a share of the step time without it; on a GPU-bound run that time overlaps queued GPU work,
so this is an upper bound on the slowdown. Paired throughput comparisons (benchmarks/probe_cost.py) could not
resolve 1% on the lent machines: blocks of the same configuration vary by 10-20%.

For each experiment: the cost over the run as it ran (3 of its steps measured exactly), and in a long run,
where one step in 50 is measured.

    python benchmarks/probe_time_table.py SWEEP.json [--out probe_time_table.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from gpuanat.worker.probe.core import FIRST_MEASURED_STEPS

EXACT_EVERY_STEPS = 50
"""AnatomyCallback's default: a long run measures one step in 50 exactly."""


def cost_row(run: dict[str, Any]) -> dict[str, Any]:
    parts = run["probe_time_by_part_s"]
    steps = run["steps"]
    step_s = (run["train_runtime_s"] - run["probe_time_s"]) / steps
    other_per_step_s = parts["other steps"] / (steps - FIRST_MEASURED_STEPS)
    measured_per_step_s = parts["measured steps"] / FIRST_MEASURED_STEPS
    long_run_per_step_s = ((EXACT_EVERY_STEPS - 1) * other_per_step_s + measured_per_step_s) / EXACT_EVERY_STEPS
    return {
        "name": run["name"],
        "steps": steps,
        "step_ms": 1000 * step_s,
        "probe_ms_by_part": {part: 1000 * seconds for part, seconds in parts.items()},
        "other_step_ms": 1000 * other_per_step_s,
        "measured_step_ms": 1000 * measured_per_step_s,
        "run_cost_percent": run["probe_cost_percent"],
        "long_run_cost_percent": 100 * long_run_per_step_s / step_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("sweep", type=Path, help="the JSON list `gpuanat sweep --json` printed")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = [cost_row(run) for run in json.loads(args.sweep.read_text()) if run.get("probe_time_by_part_s")]
    print(
        f"{'experiment':<32} {'step ms':>8} {'probe/step ms':>13} {'measured step ms':>16} "
        f"{'this run %':>10} {'long run %':>10}"
    )
    for row in rows:
        print(
            f"{row['name']:<32} {row['step_ms']:8.1f} {row['other_step_ms']:13.3f} {row['measured_step_ms']:16.2f} "
            f"{row['run_cost_percent']:10.3f} {row['long_run_cost_percent']:10.3f}"
        )
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
