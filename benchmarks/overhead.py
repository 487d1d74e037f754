"""Does monitoring cost anything? gpuanat run vs plain HF Trainer on the sweep's configs, same GPU.

For each experiment of the docs' table, alternately runs the plain Trainer baseline
(benchmarks/plain_trainer.py) and `gpuanat run` — `--repeats` times each, ABAB — and writes one JSON
document with both measurements and the ratios: steady samples/s (target ≥ 0.99) and peak allocated
memory (target within 1%).

    python benchmarks/overhead.py --out benchmarks/results/overhead_h100.json [--only vanilla ...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from gpuanat.core.config import RunConfig
from gpuanat.core.sweep import EXPERIMENTS

HERE = Path(__file__).resolve().parent


def run_json(command: list[str]) -> dict:
    completed = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"{command} failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--only", action="append", default=None)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--samples", type=int, default=512)
    args = parser.parse_args()
    base = RunConfig(device="cuda", samples=args.samples)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        db = str(Path(scratch) / "overhead.sqlite")
        for experiment in EXPERIMENTS:
            if args.only and experiment.name not in args.only:
                continue
            config = experiment.config(base)
            plain, monitored = [], []
            for _ in range(args.repeats):
                plain.append(run_json([sys.executable, str(HERE / "plain_trainer.py"),
                                       "--config", json.dumps(config.to_json())]))
                flags = [f"--{key.replace('_', '-')}={value}" for key, value in config.to_json().items()
                         if value is not None and not isinstance(value, bool) and key not in ("model", "seed")]
                flags += [f"--{'' if value else 'no-'}{key.replace('_', '-')}"
                          for key, value in config.to_json().items() if isinstance(value, bool)]
                monitored.append(run_json([sys.executable, "-m", "gpuanat", "run", "--json", "--db", db, *flags]))
            plain_steady = statistics.median(r["steady_samples_per_second"] for r in plain)
            monitored_steady = statistics.median(r["steady_samples_per_second"] for r in monitored)
            plain_peak = max(r["peak_allocated_bytes"] for r in plain)
            monitored_peak = max(r["peak_allocated_bytes"] for r in monitored)
            row = {
                "name": experiment.name,
                "config": config.to_json(),
                "plain_steady_samples_per_second": [r["steady_samples_per_second"] for r in plain],
                "gpuanat_steady_samples_per_second": [r["steady_samples_per_second"] for r in monitored],
                "steady_ratio": monitored_steady / plain_steady,
                "plain_peak_allocated_bytes": plain_peak,
                "gpuanat_peak_allocated_bytes": monitored_peak,
                "peak_allocated_ratio": monitored_peak / plain_peak,
            }
            rows.append(row)
            print(f"{experiment.name:<32} steady ratio {row['steady_ratio']:.4f}  "
                  f"peak ratio {row['peak_allocated_ratio']:.4f}", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rows": rows, "repeats": args.repeats, "samples": args.samples}, indent=2))


if __name__ == "__main__":
    main()
