"""How `gpuanat history` and the dashboard's history screen scale to a big history (issue #53): N runs (default
10,000) made of one real CPU run's rows, timed as a user meets them.

The seed is a real `gpuanat run` of the tiny BERT on the CPU (its result, steps and samples); its rows are copied N
times with SQL matching `HistoryStore`'s (names, tags, status and searches varied so the filters and the folding
have work; schema 5's listed columns filled from each result). Then, each a real subprocess timed by wall clock and
CPU time (Python's start included): `history` in table, md, csv and json, `--name`, `--tagged`, `--compare A B`; and
the real dashboard headless (`App.run_test`): from the `h` key press to the history table filled, and the six keys of
a filter typed to the table filtered.

    PYTHONPATH=$PWD python3 benchmarks/history_scale.py --out benchmarks/results/cpu/history_scale/schema5.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.history_schema import ACTIVITY_COLUMNS, listed_from_result

TINY_CPU = ["--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "32", "--batch-size", "4"]
REPEATS = 3
"""Each command is timed this many times; the report keeps every time and the median."""
SEARCH_EVERY = 500
"""Every SEARCH_EVERY runs, the next SEARCH_TRIALS are a tune's trials (as a `tune` records them)."""
SEARCH_TRIALS = 12


def seed_run(folder: Path) -> Path:
    """A real run of the tiny BERT on the CPU, in a history of its own."""
    seed = folder / "seed.sqlite"
    subprocess.run(
        [sys.executable, "-m", "gpuanat", "run", *TINY_CPU, "--db", str(seed)],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    return seed


def make_history(seed: Path, target: Path, runs: int) -> None:
    """`runs` copies of the seed's one run, with its steps and samples, in the history `target`."""
    HistoryStore(target).close()  # the file and its schema, as gpuanat makes them
    with HistoryStore(seed, read_only=True) as store:
        (source,) = store.runs()
        steps, samples = store.steps(source.id), store.samples(source.id)
    import sqlite3

    db = sqlite3.connect(seed)
    row = db.execute(
        "SELECT kind, config_json, environment_json, result_json, finished_at - created_at, "
        + ", ".join(ACTIVITY_COLUMNS)
        + " FROM runs"
    ).fetchone()
    db.close()
    kind, config_json, environment_json, result_json, duration_s, *activity = row
    db = sqlite3.connect(target)
    start = time.time() - runs * 600.0  # one run every ten minutes, up to now
    with db:
        search_id = None
        for index in range(runs):
            run_id = index + 1
            if index % SEARCH_EVERY == SEARCH_EVERY - SEARCH_TRIALS:
                search_id = db.execute(
                    "INSERT INTO searches (kind, name, created_at) VALUES ('tune', ?, ?)",
                    (f"tune tiny {index}", start + index * 600.0),
                ).lastrowid
            elif index % SEARCH_EVERY == 0:
                search_id = None
            status = "failed" if index % 17 == 5 else "interrupted" if index % 31 == 7 else "ok"
            name = None if index % 7 == 3 else f"exp-{index % 50} lr{index % 3}"
            result = json.loads(result_json)
            result.update(run_id=run_id, status=status, name=name)
            created_at = start + index * 600.0
            db.execute(
                "INSERT INTO runs (id, kind, name, status, created_at, finished_at, config_json, environment_json,"
                " result_json, recorder_pid, recorder_started_at, last_recorded_at, search_id, "
                + ", ".join(ACTIVITY_COLUMNS)
                + ") VALUES ("
                + ", ".join("?" * (13 + len(ACTIVITY_COLUMNS)))
                + ")",
                (
                    run_id,
                    kind,
                    name,
                    status,
                    created_at,
                    created_at + (duration_s or 10.0),
                    config_json,
                    environment_json,
                    json.dumps(result),
                    1,
                    0.0,
                    created_at + (duration_s or 10.0),
                    search_id,
                    *activity,
                ),
            )
            tags = [tag for tag, every in (("sweep", 10), ("baseline", 100), ("keep", 3)) if index % every == 0]
            db.executemany("INSERT INTO run_tags (run_id, tag) VALUES (?, ?)", [(run_id, tag) for tag in tags])
            db.executemany(
                "INSERT INTO steps VALUES (?, ?, ?, ?)",
                [(run_id, step["step"], step["elapsed_s"], json.dumps(step)) for step in steps],
            )
            db.executemany(
                "INSERT INTO samples VALUES (?, ?, ?)",
                [(run_id, sample["t_s"], json.dumps(sample)) for sample in samples],
            )
        db.execute("UPDATE runs SET " + listed_from_result("result_json"))  # as HistoryStore writes them
    db.close()


def _children_cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def timed(command: list[str]) -> dict[str, object]:
    """Wall time and CPU time (user + system) of each of REPEATS runs: on a box shared with other work the wall time
    waits for the CPU, the CPU time does not."""
    times, cpu_times = [], []
    size = 0
    for _ in range(REPEATS):
        began, began_cpu_s = time.perf_counter(), _children_cpu_s()
        done = subprocess.run(command, capture_output=True, check=True)
        times.append(round(time.perf_counter() - began, 3))
        cpu_times.append(round(_children_cpu_s() - began_cpu_s, 3))
        size = len(done.stdout)
    median = len(times) // 2
    return {
        "median_s": sorted(times)[median],
        "times_s": times,
        "median_cpu_s": sorted(cpu_times)[median],
        "cpu_times_s": cpu_times,
        "stdout_bytes": size,
    }


async def dashboard_times(db: Path) -> dict[str, float]:
    """The real dashboard headless: `h` to the history table filled, and a filter's six keys typed to the table
    filtered (each key filters the table again)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_run_names import cpu_dashboard
    from textual.widgets import DataTable

    from gpuanat.tui.screens.history import HistoryScreen

    app = cpu_dashboard(db)
    async with app.run_test(size=(160, 40)) as pilot:
        began, began_cpu_s = time.perf_counter(), time.process_time()
        await pilot.press("h")
        while not (isinstance(app.screen, HistoryScreen) and app.screen.query_one(DataTable).row_count):
            await pilot.pause(0.001)
        opened, opened_cpu = time.perf_counter() - began, time.process_time() - began_cpu_s
        screen = app.screen
        await pilot.press("slash")
        began, began_cpu_s = time.perf_counter(), time.process_time()
        await pilot.press(*"exp-42")  # each key filters the whole history again
        await pilot.pause()
        filtered, filtered_cpu = time.perf_counter() - began, time.process_time() - began_cpu_s
        shown = screen.query_one(DataTable).row_count
        await pilot.press("escape", "escape")
    return {
        "history_screen_open_s": round(opened, 3),
        "history_screen_open_cpu_s": round(opened_cpu, 3),
        "filter_six_keys_s": round(filtered, 3),
        "filter_six_keys_cpu_s": round(filtered_cpu, 3),
        "filtered_rows": shown,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--out", type=Path, help="write the report (JSON) here too")
    parser.add_argument("--history", type=Path, help="reuse (or make, if absent) this history")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        db = args.history or Path(folder) / "big.sqlite"
        made_s = None
        if not db.exists():
            began = time.perf_counter()
            make_history(seed_run(Path(folder)), db, args.runs)
            made_s = round(time.perf_counter() - began, 1)
        base = [sys.executable, "-m", "gpuanat", "history", "--db", str(db)]
        commands = {
            "table": base,
            "md": [*base, "--format", "md"],
            "csv": [*base, "--format", "csv"],
            "json": [*base, "--format", "json"],
            "name": [*base, "--name", "exp-42"],
            "tagged": [*base, "--tagged", "baseline"],
            "compare": [*base, "--compare", "1", str(args.runs)],
            "python_start": [sys.executable, "-c", "import gpuanat.cli"],
        }
        report: dict[str, object] = {
            "runs": args.runs,
            "history_bytes": db.stat().st_size,
            "made_s": made_s,
            "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}",
            "commit": subprocess.run(
                ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
            ).stdout.strip(),
            "cli": {name: timed(command) for name, command in commands.items()},
            "dashboard": asyncio.run(dashboard_times(db)),
        }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
