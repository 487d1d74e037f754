"""What exporting to Prometheus costs (issue #33), on a GPU: the same `gpuanat run` with and without `--metrics`,
alternated, the endpoint scraped every second as a Prometheus would. For each run: its steady samples/s, the CPU
seconds of gpuanat's own process (not its training child: psutil's `cpu_times` of the parent, read until it exits),
and for the exporting ones the last scrape's bands beside the result's.

    python3 benchmarks/metrics_cost.py OUT_DIR [--pairs N] [--steps N]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import psutil
from metrics_scrape import bands_by_rank, fetch, free_port


def one_run(out: Path, name: str, steps: int, export: bool) -> dict:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "gpuanat",
        "run",
        "--preset",
        "bert-large",
        "--seq-len",
        "512",
        "--batch-size",
        "4",
        "--samples",
        "100000",
        "--max-steps",
        str(steps),
        "--json",
        "--name",
        name,
    ]
    if export:
        command += ["--metrics", f"127.0.0.1:{port}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    parent = psutil.Process(process.pid)
    cpu_s, scrapes, last_bands, scrape_s = 0.0, 0, None, []
    while process.poll() is None:
        try:
            times = parent.cpu_times()
            cpu_s = times.user + times.system
        except psutil.Error:
            pass
        if export:
            started = time.perf_counter()
            try:
                text = fetch(f"http://127.0.0.1:{port}/metrics", timeout_s=2)
                scrape_s.append(time.perf_counter() - started)
                scrapes += 1
                last_bands = bands_by_rank(text).get("0") or last_bands
            except OSError:
                pass
        time.sleep(1.0)
    result = json.loads(process.stdout.read().strip().splitlines()[-1])
    row = {
        "name": name,
        "export": export,
        "steady_samples_per_second": result["steady_samples_per_second"],
        "parent_cpu_s": cpu_s,
        "scrapes": scrapes,
        "scrape_ms_median": 1000 * sorted(scrape_s)[len(scrape_s) // 2] if scrape_s else None,
        "last_scraped_bands": last_bands,
        "result_bands": result["bands"],
        "wall_breakdown_s": result["wall_breakdown_s"],
    }
    with (out / "runs.jsonl").open("a") as file:
        file.write(json.dumps(row) + "\n")
    print(
        json.dumps(
            {
                key: row[key]
                for key in ("name", "steady_samples_per_second", "parent_cpu_s", "scrapes", "scrape_ms_median")
            }
        ),
        flush=True,
    )
    return row


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("--pairs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    for pair in range(args.pairs):
        for export in (pair % 2 == 0, pair % 2 == 1):  # alternated: which goes first changes each pair
            one_run(args.out, f"{'metrics' if export else 'plain'} {pair}", args.steps, export)


if __name__ == "__main__":
    main()
