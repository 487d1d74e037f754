"""The 72-hour replay: days of `gpuanat watch`, accelerated, through the real sampler, app and recorder (issue #53).

    nice python3 benchmarks/long_run_replay.py                 # 72 h of 4 Hz samples: 1,036,800
    python3 benchmarks/long_run_replay.py --hours 2 --out /tmp/x   # a short try

The H100 trace recorded in tests/data (NVML and host readings of a bert-large run) is replayed in a loop, its
timestamps those of 4 Hz sampling (0.25 s apart, `SAMPLE_INTERVAL_S`), as fast as the machine takes them: the real
`Sampler` thread reads it, the real `WatchApp` (headless `App.run_test`, painting at its paint tick as it would on a
terminal) watches this very process with it, and the real `HistoryRecorder` records the session into a real history
file from the first sample (`save_on_start`, as `gpuanat watch --save`). The app's clock is the replay's: its charts
repaint and its records are dated on the simulated time.

Every simulated hour (on the sampler thread, between two samples) it notes: the process's RSS, the CPU seconds it
used per sample over that hour (process time: every thread, the app's painting included), the history's size on
disk (file and WAL) and its rows. It writes them as JSON and an SVG plot (drawn here: no plotting package needed)
under `benchmarks/results/cpu/long_run_replay/`, with the whole run's final screen (`z`: the whole run) as an SVG.

The bars (issue #53): memory growth < 10 MB, CPU per sample flat within 10%, the database < 100 MB for 72 hours.
Memory growth is measured from the end of the second hour: until then the watch's bounded buffers fill (the session
keeps its latest 20,000 samples, the charts their rings); what grows after that grows with the run.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import sqlite3
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any, ClassVar

import psutil

from gpuanat.core.measure.samples import HostProcess, NvmlStatus, Sample
from gpuanat.core.watch.target import resolve_target
from gpuanat.tui.watch_app import WatchApp

ROOT = Path(__file__).resolve().parent.parent
TRACE = ROOT / "tests" / "data" / "nvml_trace_h100.jsonl"
OUT = ROOT / "benchmarks" / "results" / "cpu" / "long_run_replay"
SAMPLE_INTERVAL_S = 0.25
SAMPLES_PER_HOUR = int(3600 / SAMPLE_INTERVAL_S)
NVML = NvmlStatus(
    available=True,
    reason=None,
    driver_version="580.159.04",
    cuda_driver_version=13000,
    gpu_names=("NVIDIA H100 80GB HBM3",),
)


def database_bytes(path: Path) -> int:
    return sum(os.path.getsize(f"{path}{suffix}") for suffix in ("", "-wal") if os.path.exists(f"{path}{suffix}"))


def rows(path: Path) -> dict[str, int]:
    """The history's rows, through a connection of its own (read-only)."""
    if not path.exists():
        return {"samples": 0, "steps": 0}
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30) as db:
        return {table: db.execute(f"SELECT count(*) FROM {table}").fetchone()[0] for table in ("samples", "steps")}


class AcceleratedSource:
    """The recorded trace in a loop, one sample every `SAMPLE_INTERVAL_S` of simulated time, its host readings as
    this process's; notes the figures at each simulated hour; ends after `total` samples."""

    keeps_recorded_time: ClassVar[bool] = True

    def __init__(self, total: int, db_path: Path) -> None:
        recorded = [Sample.from_json(json.loads(line)) for line in TRACE.read_text().splitlines() if line.strip()]
        pid = os.getpid()
        self._samples = [
            dataclasses.replace(
                sample,
                host=dataclasses.replace(
                    sample.host,
                    processes=(
                        HostProcess(
                            pid=pid,
                            parent_pid=os.getppid(),
                            name="python3",
                            cpu_percent=sample.host.cpu_percent or 0.0,
                            rss_bytes=sample.host.rss_bytes or 0,
                        ),
                    ),
                ),
            )
            for sample in recorded
        ]
        self._t0_s = recorded[0].t_s
        self.total = total
        self.index = 0
        self.t_s = self._t0_s
        self.hours: list[dict[str, Any]] = []
        self.done = threading.Event()
        self._db_path = db_path
        self._process = psutil.Process()
        self._started = (time.monotonic(), time.process_time())
        self._last = self._started

    def read(self, pids: Iterable[int]) -> Sample:
        if self.index >= self.total:
            self.done.set()
            raise StopIteration
        if self.index % SAMPLES_PER_HOUR == 0:
            self._note_hour()
        sample = self._samples[self.index % len(self._samples)]
        self.t_s = self._t0_s + self.index * SAMPLE_INTERVAL_S
        self.index += 1
        if self.index == self.total:
            self._note_hour()
        return dataclasses.replace(sample, t_s=self.t_s)

    def _note_hour(self) -> None:
        now = (time.monotonic(), time.process_time())
        samples = self.index - (self.hours[-1]["samples"] if self.hours else 0)
        self.hours.append(
            {
                "hour": round(self.index / SAMPLES_PER_HOUR, 3),
                "samples": self.index,
                "rss_bytes": self._process.memory_info().rss,
                "cpu_s_per_sample": (now[1] - self._last[1]) / samples if samples else None,
                "real_s": round(now[0] - self._started[0], 2),
                "database_bytes": database_bytes(self._db_path),
                "rows": rows(self._db_path),
            }
        )
        self._last = now
        if self.hours[-1]["samples"]:
            hour = self.hours[-1]
            print(
                f"hour {hour['hour']:5.1f}: RSS {hour['rss_bytes'] / 2**20:7.1f} MiB, "
                f"{1e6 * (hour['cpu_s_per_sample'] or 0):6.1f} µs CPU/sample, "
                f"history {hour['database_bytes'] / 1e6:6.1f} MB, {hour['rows']['samples']} sample rows, "
                f"{hour['real_s']:.0f} s",
                flush=True,
            )

    def close(self) -> None:
        pass


async def replay(hours: float, out: Path, speedup: float) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="gpuanat-long-run-"))
    db_path = workdir / "history.sqlite"
    source = AcceleratedSource(round(hours * SAMPLES_PER_HOUR), db_path)
    app = WatchApp(
        resolve_target(os.getpid()),
        db_path=db_path,
        sampler_factory=lambda: (source, NVML),
        clock=lambda: source.t_s,
        interval_s=SAMPLE_INTERVAL_S / speedup,
        save_name="72-hour replay",
        save_on_start=True,
    )
    started = time.monotonic()
    async with app.run_test(size=(120, 40)) as pilot:
        while not source.done.is_set():
            await asyncio.sleep(0.5)
        await asyncio.sleep(1.0)  # the last paint ticks
        await pilot.press("z")
        await pilot.pause()
        app.save_screenshot(filename="whole_run_screen.svg", path=str(out))
        await pilot.press("q")
    wall_s = time.monotonic() - started
    final = {"database_bytes": database_bytes(db_path), "rows": rows(db_path)}
    return {"hours": hours, "samples": source.total, "wall_s": round(wall_s, 1), "by_hour": source.hours, **final}


def verdict(result: dict[str, Any]) -> dict[str, Any]:
    """The figures against issue #53's bars."""
    by_hour = [hour for hour in result["by_hour"] if hour["samples"]]
    from_hour = next((hour for hour in by_hour if hour["hour"] >= 2), by_hour[0])
    growth_mb = (by_hour[-1]["rss_bytes"] - from_hour["rss_bytes"]) / 1e6
    per_sample = [hour["cpu_s_per_sample"] for hour in by_hour[1:] if hour["cpu_s_per_sample"]]
    window = max(1, len(per_sample) // 6)
    early, late = per_sample[:window], per_sample[-window:]
    cpu_change = (sum(late) / len(late)) / (sum(early) / len(early)) - 1 if early and late else None
    return {
        "memory_growth_mb_after_hour_2": round(growth_mb, 2),
        "memory_growth_mb_from_hour_1": round((by_hour[-1]["rss_bytes"] - by_hour[0]["rss_bytes"]) / 1e6, 2),
        "cpu_per_sample_change_last_vs_first_sixth": None if cpu_change is None else round(cpu_change, 4),
        "database_mb": round(result["database_bytes"] / 1e6, 2),
        "bars": {"memory_growth_mb": 10, "cpu_per_sample_change": 0.10, "database_mb": 100},
        "passes": {
            "memory": growth_mb < 10,
            "cpu": cpu_change is not None and abs(cpu_change) <= 0.10,
            "database": result["database_bytes"] / 1e6 < 100,
        },
    }


def plot(result: dict[str, Any], path: Path) -> None:
    """Four small panels by simulated hour: RSS, CPU per sample, the history's size and its sample rows."""
    by_hour = [hour for hour in result["by_hour"] if hour["samples"]]
    panels = [
        ("RSS (MiB)", [hour["rss_bytes"] / 2**20 for hour in by_hour]),
        ("CPU per sample (µs)", [1e6 * (hour["cpu_s_per_sample"] or 0) for hour in by_hour]),
        ("history on disk (MB)", [hour["database_bytes"] / 1e6 for hour in by_hour]),
        ("sample rows stored", [hour["rows"]["samples"] for hour in by_hour]),
    ]
    hours = [hour["hour"] for hour in by_hour]
    width, height, margin = 360, 200, 50
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{2 * width}" height="{2 * height + 30}" font-size="11">']
    parts.append(
        f'<text x="10" y="16">gpuanat watch, {result["hours"]:g} h of 4 Hz samples replayed '
        f"({result['samples']:,} samples, {result['wall_s']:.0f} s)</text>"
    )
    for index, (title, values) in enumerate(panels):
        left, top = (index % 2) * width + margin, (index // 2) * height + 30 + 20
        plot_w, plot_h = width - margin - 20, height - 60
        top_value = max(values) * 1.1 or 1.0
        span_h = (hours[-1] - hours[0]) or 1.0
        points = " ".join(
            f"{left + (hour - hours[0]) / span_h * plot_w:.1f},{top + plot_h - value / top_value * plot_h:.1f}"
            for hour, value in zip(hours, values, strict=True)
        )
        parts += [
            f'<text x="{left}" y="{top - 6}">{title}</text>',
            f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" y2="{top + plot_h}" stroke="#888"/>',
            f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + plot_h}" stroke="#888"/>',
            f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{top_value:.3g}</text>',
            f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>',
            f'<text x="{left}" y="{top + plot_h + 14}">{hours[0]:g} h</text>',
            f'<text x="{left + plot_w}" y="{top + plot_h + 14}" text-anchor="end">{hours[-1]:g} h</text>',
            f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{points}"/>',
        ]
    parts.append("</svg>")
    path.write_text("\n".join(parts) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=72.0)
    parser.add_argument("--speedup", type=float, default=4000.0, help="read pace, times real time (the most)")
    parser.add_argument("--out", type=Path, default=OUT)
    arguments = parser.parse_args()
    arguments.out.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(replay(arguments.hours, arguments.out, arguments.speedup))
    result["verdict"] = verdict(result)
    result["machine"] = {"cpus": os.cpu_count(), "load_average": os.getloadavg()}
    (arguments.out / "long_run_replay.json").write_text(json.dumps(result, indent=1) + "\n")
    plot(result, arguments.out / "long_run_replay.svg")
    print(json.dumps(result["verdict"], indent=1))


if __name__ == "__main__":
    main()
