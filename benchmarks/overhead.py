"""Does monitoring cost anything? gpuanat vs plain HF Trainer on the same configs, same GPU.

Two modes, each writing one JSON document with both measurements and the ratios — steady samples/s
(target ≥ 0.99) and peak allocated memory (target within 1%):
- `--sweep-json`: the rows of a `gpuanat sweep --json` made just before on the same machine, each
  against one plain-Trainer run (benchmarks/plain_trainer.py) of its config;
- `--interleave NAME --repeats N`: for the named experiments, N rounds of plain and `gpuanat run`
  alternating ABBA (drift of the GPU or host cancels out), compared by medians.

    python benchmarks/overhead.py --sweep-json sweep.json --out overhead.json
    python benchmarks/overhead.py --interleave vanilla --interleave bf16 --repeats 3 --out interleaved.json
    python benchmarks/overhead.py --interleave as-is --base '{"precision": "bf16", "batch_size": 32, "samples": 2048}' \
        --repeats 4 --warmup-runs 1 --out bs32.json     # the base config itself (issue #18's GPU-bound case)

Each run's HF samples/s, steady samples/s and wall time (process start to result) are kept.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from gpuanat.core.vocabulary.config import RunConfig, child_environment

HERE = Path(__file__).resolve().parent


def plain_run(config: dict, with_probe: bool = False) -> dict:
    """The plain Trainer under the same allocator settings as `gpuanat run` gives its child; `with_probe`: with
    gpuanat's probe as its callback too (no runner, no sampler: what the probe alone costs)."""
    env = child_environment(RunConfig.from_json(config), os.environ)
    started_s = time.monotonic()
    completed = subprocess.run(
        [
            sys.executable,
            str(HERE / "plain_trainer.py"),
            "--config",
            json.dumps(config),
            "--requested-monotonic-s",
            repr(started_s),
            *(["--with-probe"] if with_probe else []),
        ],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"plain Trainer failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return {**json.loads(lines[-1]), "wall_s": time.monotonic() - started_s}


def gpuanat_run(config: dict, db: Path) -> dict:
    started_s = time.monotonic()
    flags = [
        f"--{key.replace('_', '-')}={value}"
        for key, value in config.items()
        if value is not None and not isinstance(value, bool) and key not in ("model", "seed")
    ]
    flags += [
        f"--{'' if value else 'no-'}{key.replace('_', '-')}" for key, value in config.items() if isinstance(value, bool)
    ]
    completed = subprocess.run(
        [sys.executable, "-m", "gpuanat", "run", "--json", "--db", str(db), *flags],
        capture_output=True,
        text=True,
        check=False,
    )
    lines = completed.stdout.strip().splitlines()
    if completed.returncode != 0 or not lines:
        raise RuntimeError(f"gpuanat run failed ({completed.returncode}): {completed.stderr[-2000:]}")
    return {**json.loads(lines[-1]), "wall_s": time.monotonic() - started_s}


def interleaved(
    names: list[str], repeats: int, out: Path, base: dict, warmup_runs: int = 0, probe_arm: bool = False
) -> None:
    from gpuanat.core.store.sweep import EXPERIMENTS
    from gpuanat.core.vocabulary.config import RunConfig

    rows = []
    db = out.with_suffix(".sqlite")
    chosen = [(e.name, e.config(RunConfig.from_json(base)).to_json()) for e in EXPERIMENTS if e.name in names]
    if "as-is" in names:
        chosen.append(("as-is", RunConfig.from_json(base).to_json()))
    for name, config in chosen:
        # Runs not counted, one of each first: the machine's first runs read torch and the model code from disk and
        # build CUDA's kernel caches, which every later run (of either kind) finds ready.
        warmups = [{"plain": plain_run(config), "gpuanat": gpuanat_run(config, db)} for _ in range(warmup_runs)]
        plain, monitored, probed = [], [], []
        arms = ("plain", "gpuanat", "plain + probe") if probe_arm else ("plain", "gpuanat")
        runs_log = out.with_suffix(".runs.jsonl")  # each run as it ends: a run cut short keeps what it measured
        for round_index in range(repeats):
            for which in arms if round_index % 2 == 0 else reversed(arms):
                if which == "plain":
                    plain.append(run := plain_run(config))
                elif which == "gpuanat":
                    monitored.append(run := gpuanat_run(config, db))
                else:
                    probed.append(run := plain_run(config, with_probe=True))
                with runs_log.open("a") as file:
                    file.write(json.dumps({"name": name, "round": round_index, "arm": which, **run}) + "\n")
        plain_steady = [r["steady_samples_per_second"] for r in plain]
        monitored_steady = [r["steady_samples_per_second"] for r in monitored]
        row = {
            "name": name,
            "config": config,
            "repeats": repeats,
            "plain_samples_per_second": [r["samples_per_second"] for r in plain],
            "gpuanat_samples_per_second": [r["samples_per_second"] for r in monitored],
            "samples_ratio_of_medians": statistics.median(r["samples_per_second"] for r in monitored)
            / statistics.median(r["samples_per_second"] for r in plain),
            "plain_wall_s": [r["wall_s"] for r in plain],
            "gpuanat_wall_s": [r["wall_s"] for r in monitored],
            # start-up: from the benchmark starting the process to the first step's end (gpuanat: from its CLI
            # process's start, 10 ms after), and where that time went, part by part (gpuanat.core.measure.startup)
            "plain_time_to_first_step_s": [r.get("time_to_first_step_s") for r in plain],
            "gpuanat_time_to_first_step_s": [r.get("time_to_first_step_s") for r in monitored],
            "plain_wall_breakdown_s": [r.get("wall_breakdown_s") for r in plain],
            "gpuanat_wall_breakdown_s": [r.get("wall_breakdown_s") for r in monitored],
            "gpuanat_achieved_tflops": [r.get("achieved_tflops") for r in monitored],
            "gpuanat_mfu": [r.get("mfu") for r in monitored],
            "plain_steady_samples_per_second": plain_steady,
            "gpuanat_steady_samples_per_second": monitored_steady,
            "steady_ratio_of_medians": statistics.median(monitored_steady) / statistics.median(plain_steady),
            "warmup_runs_not_counted": warmups,
            "plain_peak_allocated_bytes": [r["peak_allocated_bytes"] for r in plain],
            "gpuanat_peak_allocated_bytes": [r["peak_allocated_bytes"] for r in monitored],
        }
        if probed:  # the plain Trainer with the probe: the probe's own share of any gap
            row.update(
                {
                    "plain_probe_samples_per_second": [r["samples_per_second"] for r in probed],
                    "plain_probe_steady_samples_per_second": [r["steady_samples_per_second"] for r in probed],
                    "plain_probe_wall_breakdown_s": [r.get("wall_breakdown_s") for r in probed],
                    "plain_probe_samples_ratio_of_medians": statistics.median(r["samples_per_second"] for r in probed)
                    / statistics.median(r["samples_per_second"] for r in plain),
                }
            )
        rows.append(row)
        out.write_text(json.dumps(rows, indent=2))
        print(
            f"{name:<32} HF samples/s ratio of medians {row['samples_ratio_of_medians']:.4f}  "
            f"steady ratio of medians {row['steady_ratio_of_medians']:.4f}  "
            f"plain {plain_steady}  gpuanat {monitored_steady}  wall medians: plain "
            f"{statistics.median(row['plain_wall_s']):.1f} s, gpuanat "
            f"{statistics.median(row['gpuanat_wall_s']):.1f} s"
            + (f"  plain + probe HF ratio {row['plain_probe_samples_ratio_of_medians']:.4f}" if probed else ""),
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sweep-json", type=Path)
    parser.add_argument("--interleave", action="append", default=[], metavar="NAME")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--warmup-runs",
        type=int,
        default=0,
        help="runs of each, not counted, before the alternated ones (cold disk and kernel caches)",
    )
    parser.add_argument(
        "--probe-arm",
        action="store_true",
        help="a third arm alternated with the two: the plain Trainer with gpuanat's probe",
    )
    parser.add_argument(
        "--base",
        type=json.loads,
        default={"device": "cuda"},
        help="RunConfig fields the experiments start from, as JSON (default: bert-large on cuda)",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.interleave:
        interleaved(args.interleave, args.repeats, args.out, args.base, args.warmup_runs, args.probe_arm)
        return
    if args.sweep_json is None:
        parser.error("give --sweep-json or --interleave")
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
        print(
            f"{row['name']:<32} steady ratio {row['steady_ratio']:.4f}  "
            f"peak allocated ratio {row['peak_allocated_ratio']:.4f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
