"""What a probe's Prometheus export costs its training loop (issue #33), paired in one process as
benchmarks/loop_probe_cost.py pairs the probe itself: blocks of the plain PyTorch loop (benchmarks/loops/plain_loop.py,
with `gpuanat.probe.track`) without `GPUANAT_METRICS` (A) and with it (B) alternate ABBA. In B blocks the probe feeds
its rank's series and a separate scraper process reads the endpoint every `--scrape-s` seconds (1 s: fifteen times as
often as Prometheus' default). Each block reports the steady clock's seconds per step and the CPU seconds of the whole
training process (`time.process_time`: the loop, the probe's threads, the metrics server's thread).

    python benchmarks/metrics_probe_cost.py --out metrics_probe_cost.json [--rounds 3] [--scrape-s 1]
        [the options of benchmarks/loops/common.py: --config DIR --seq-len N --batch-size N --steps N --warmup N]
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
from typing import Any

sys.path.insert(0, str(Path(__file__).parent / "loops"))
from common import build_model, options
from metrics_scrape import free_port  # benchmarks/, this script's own folder
from plain_loop import train

SCRAPER = """
import sys, time, urllib.request
url, every_s = sys.argv[1], float(sys.argv[2])
count = 0
while True:
    try:
        urllib.request.urlopen(url, timeout=5).read()
        count += 1
        print(count, flush=True)
    except OSError:
        pass
    time.sleep(every_s)
"""


def block(args: argparse.Namespace, model: Any, export: bool, port: int, scrape_s: float) -> dict[str, Any]:
    scraper = None
    if export:
        os.environ["GPUANAT_METRICS"] = f"127.0.0.1:{port}"
        scraper = subprocess.Popen(
            [sys.executable, "-c", SCRAPER, f"http://127.0.0.1:{port}/metrics", str(scrape_s)],
            stdout=subprocess.PIPE,
            text=True,
        )
    else:
        os.environ.pop("GPUANAT_METRICS", None)
    cpu_before_s, wall_before_s = time.process_time(), time.perf_counter()
    reading = train(args, model)
    cpu_s, wall_s = time.process_time() - cpu_before_s, time.perf_counter() - wall_before_s
    scrapes = None
    if scraper is not None:
        scraper.kill()
        scrapes = len((scraper.communicate()[0] or "").split())
    return {
        "export": export,
        **reading,
        "process_cpu_s": cpu_s,
        "wall_s": wall_s,
        "cpu_s_per_wall_s": cpu_s / wall_s,
        "scrapes": scrapes,
    }


def summary_of(blocks: list[dict[str, Any]]) -> dict[str, Any]:
    def median(export: bool, key: str) -> float | None:
        values = [row[key] for row in blocks if row["export"] == export and row.get(key) is not None]
        return statistics.median(values) if values else None

    plain, exported = median(False, "s_per_step"), median(True, "s_per_step")
    return {
        "blocks": len(blocks),
        "s_per_step_median": {"plain": plain, "export": exported},
        "step_time_change_percent": 100 * (exported / plain - 1) if plain and exported else None,
        "cpu_s_per_wall_s_median": {
            "plain": median(False, "cpu_s_per_wall_s"),
            "export": median(True, "cpu_s_per_wall_s"),
        },
        "process_cpu_s_median": {"plain": median(False, "process_cpu_s"), "export": median(True, "process_cpu_s")},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rounds", type=int, default=3, help="ABBA rounds (4 blocks each)")
    parser.add_argument("--scrape-s", type=float, default=1.0)
    parser.add_argument("--budget-s", type=float, default=240, help="stop starting rounds after this long")
    known, rest = parser.parse_known_args()
    args = options(__doc__, rest)
    args.probe = True
    started_s = time.monotonic()
    model = build_model(args)
    port = free_port()
    blocks: list[dict[str, Any]] = []
    report: dict[str, Any] = {
        "config": str(args.config),
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "steps_per_block": args.steps,
        "warmup_steps": args.warmup,
        "scrape_s": known.scrape_s,
    }
    for round_index in range(known.rounds):
        if round_index and time.monotonic() - started_s > known.budget_s:
            break
        for export in (False, True, True, False):
            blocks.append(block(args, model, export, port, known.scrape_s))
            print(json.dumps(blocks[-1]), flush=True)
            known.out.write_text(json.dumps({**report, "summary": summary_of(blocks), "blocks": blocks}, indent=1))
    print(json.dumps(summary_of(blocks)), flush=True)


if __name__ == "__main__":
    main()
