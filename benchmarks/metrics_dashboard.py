"""The dashboard's `--metrics` endpoint during a real GPU run (issue #33): are the bands Prometheus scrapes the bands
the dashboard draws? One call of the device tool:

    python3 benchmarks/metrics_dashboard.py OUT.json [--steps N]

The dashboard (`GpuAnatApp`, headless, driven with Pilot) runs bert-large with a `RunMetrics` served on a loopback port,
as `gpuanat --metrics` does. While it trains, every ~0.5 s: the memory bar's bands (what is on screen), one HTTP scrape
of the endpoint (parsed with prometheus-client's parser), the bar's bands again. Where the bar did not change across
the scrape, the scraped bands are compared with it band by band; where it changed (a new sample arrived meanwhile) the
pair is counted as "moved" and left out. After the run: the last scrape against the result's bands, which the bar then
shows. Writes OUT.json; prints a summary line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

from metrics_scrape import bands_by_rank, fetch, free_port

from gpuanat.core.export.metrics import MetricsServer
from gpuanat.core.export.run_metrics import RunMetrics
from gpuanat.core.vocabulary.config import RunConfig


def scrape(url: str) -> dict[str, dict[str, float]]:
    return bands_by_rank(fetch(url))


def on_screen(bar: Any) -> dict[str, int]:
    """The memory bar's current bands, those measured."""
    return {band: value for band, value in (bar._current or {}).items() if value is not None}


def compare(shown: dict[str, int], scraped: dict[str, float]) -> dict[str, Any]:
    bands = sorted(set(shown) | set(scraped))
    differing = {
        band: (shown.get(band), scraped.get(band))
        for band in bands
        if shown.get(band) is None or scraped.get(band) is None or int(scraped[band]) != shown[band]
    }
    return {"bands": len(bands), "differing": differing}


async def drive(steps: int, cpu: bool) -> dict[str, Any]:
    from gpuanat.tui.app import GpuAnatApp
    from gpuanat.tui.run_backend import LocalRunBackend
    from gpuanat.tui.widgets.memory_bar import MemoryBar

    metrics = RunMetrics()
    server = MetricsServer(("127.0.0.1", free_port()), metrics.snapshots, job="metrics-dashboard-check")
    workload = (
        dict(preset="tiny", device="cpu", seq_len=32) if cpu else dict(preset="bert-large", device="cuda", seq_len=512)
    )
    config = RunConfig(**workload, batch_size=4, samples=100_000, max_steps=steps)
    db_path = Path("/tmp/metrics-dashboard.sqlite")
    app = GpuAnatApp(config, db_path=db_path, backend=LocalRunBackend(db_path, metrics=metrics))
    checks: list[dict[str, Any]] = []
    moved = 0
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            started_s = time.monotonic()
            while app.dashboard.capabilities is None:
                await pilot.pause(0.1)
            await pilot.press("r")
            bar = app.dashboard.query_one(MemoryBar)
            while app.dashboard.last_result is None or app.dashboard.run_in_progress is not None:
                if time.monotonic() - started_s > 420:
                    raise RuntimeError("the dashboard's run did not end")
                await pilot.pause(0.5)
                if app.dashboard.run_in_progress is None or app.dashboard.run_in_progress.last_step is None:
                    continue
                before = on_screen(bar)
                scraped = (await asyncio.to_thread(scrape, server.url)).get("0", {})
                after = on_screen(bar)
                if before != after or not before:
                    moved += 1
                    continue
                checks.append(
                    {
                        "t_s": round(time.monotonic() - started_s, 2),
                        "step": app.dashboard.run_in_progress.last_step.step
                        if app.dashboard.run_in_progress and app.dashboard.run_in_progress.last_step
                        else None,
                        **compare(after, scraped),
                    }
                )
            await pilot.pause(0.5)
            result = app.dashboard.last_result
            final_scraped = (await asyncio.to_thread(scrape, server.url)).get("0", {})
            final_shown = on_screen(bar)
    finally:
        server.close()
    result_bands = {band: value for band, value in result["bands"].items() if value is not None}
    equal = sum(1 for check in checks if not check["differing"])
    return {
        "status": result["status"],
        "steps": result["steps"],
        "scrapes_compared": len(checks),
        "scrapes_equal": equal,
        "scrapes_moved": moved,
        "scrape_checks": checks,
        "final_scrape_vs_result": compare(result_bands, final_scraped),
        "final_screen_vs_result": compare(result_bands, final_shown),
        "result_bands": result_bands,
        "final_scraped": final_scraped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--cpu", action="store_true", help="the tiny model on the CPU: the script's own smoke test")
    args = parser.parse_args()
    report = asyncio.run(drive(args.steps, args.cpu))
    args.out.write_text(json.dumps(report, indent=1))
    print(
        json.dumps(
            {
                key: report[key]
                for key in (
                    "status",
                    "steps",
                    "scrapes_compared",
                    "scrapes_equal",
                    "scrapes_moved",
                    "final_scrape_vs_result",
                    "final_screen_vs_result",
                )
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
