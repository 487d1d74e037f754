"""Does monitoring cost anything? `gpuanat sweep` rows vs plain HF Trainer on the same configs, same GPU.

Reads the JSON of a `gpuanat sweep --json` run made just before on the same machine, runs the plain
Trainer baseline (benchmarks/plain_trainer.py) on each row's config, and writes one JSON document with
both measurements and the ratios: steady samples/s (target ≥ 0.99) and peak allocated (within 1%).

    python benchmarks/overhead.py --sweep-json sweep.json --out overhead.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def plain_run(config: dict) -> dict:
    completed = subprocess.run([sys.executable, str(HERE / "plain_trainer.py"), "--config", json.dumps(config)],
                               capture_output=True, text=True, check=False)
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"plain Trainer failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep-json", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    rows = []
    for sweep_row in json.loads(args.sweep_json.read_text()):
        if sweep_row["status"] != "ok":
            continue
        plain = plain_run(sweep_row["config"])
        row = {
            "name": sweep_row["name"],
            "config": sweep_row["config"],
            "plain_steady_samples_per_second": plain["steady_samples_per_second"],
            "gpuanat_steady_samples_per_second": sweep_row["steady_samples_per_second"],
            "steady_ratio": sweep_row["steady_samples_per_second"] / plain["steady_samples_per_second"],
            "plain_samples_per_second": plain["samples_per_second"],
            "gpuanat_samples_per_second": sweep_row["samples_per_second"],
            "plain_peak_allocated_bytes": plain["peak_allocated_bytes"],
            "gpuanat_peak_allocated_bytes": sweep_row["peak_allocated_bytes"],
            "peak_allocated_ratio": sweep_row["peak_allocated_bytes"] / plain["peak_allocated_bytes"],
        }
        rows.append(row)
        args.out.write_text(json.dumps(rows, indent=2))
        print(f"{row['name']:<32} steady ratio {row['steady_ratio']:.4f}  "
              f"peak allocated ratio {row['peak_allocated_ratio']:.4f}", flush=True)


if __name__ == "__main__":
    main()
