"""Big histories (issue #53): `gpuanat history` in every format lists every run, with the values the whole read
gives, when it reads only what a listing shows; `--prune` shows what goes and asks; the dashboard's history holds the
newest rows and gets more with `m`, its filter searching every run. Real subprocesses on a real history of a few
hundred runs written through `HistoryStore` (speed is benchmarks/history_scale.py's job, not these tests')."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
import subprocess
import time
from contextlib import closing
from pathlib import Path

import pytest
from conftest import run_cli, start_cli
from rich.console import Console
from rich.table import Table
from rich.text import Text
from test_history_tidy import _in_terminal
from test_run_names import cpu_dashboard

from gpuanat.cli.plain_table import PLAIN_FROM_ROWS
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.history_listing import listed_runs
from gpuanat.core.store.report import HISTORY_COLUMNS, TAGS_COLUMN, display_value, listing_rows, render_csv
from gpuanat.core.store.searches import fold_searches
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.tui.screens.history import PAGE_ROWS, HistoryScreen

RUNS = 260
"""More than PLAIN_FROM_ROWS and PAGE_ROWS: the long table, the JSON an entry a line, the screen's "more"."""
DAY_S = 86_400.0


def make_history(db: Path) -> dict[int, float]:
    """RUNS runs (one a day up to now), through the real store: names, tags,
    statuses and results varied, a tune of 6 trials, and one run written with the bands of before issue #30. Returns
    each run's creation time."""
    now = time.time()
    created: dict[int, float] = {}
    with HistoryStore(db) as store:
        search_id = None
        for index in range(RUNS):
            if index == 120:
                search_id = store.create_search("tune", "tune tiny")
            elif index == 126:
                search_id = None
            created_at = now - (RUNS - index) * DAY_S
            tags = [tag for tag, every in (("sweep", 10), ("baseline", 25)) if index % every == 0]
            run_id = store.create_run(
                {"preset": "tiny", "device": "cpu", "batch_size": 4 + index % 4, "bf16": index % 2 == 0},
                name=None if index % 9 == 4 else f"exp-{index % 40} [lr{index % 3}]",
                created_at=created_at,
                search_id=search_id,
                tags=tags,
            )
            status = "failed" if index % 13 == 5 else "oom" if index % 29 == 3 else "ok"
            values = {
                "run_id": run_id,
                "status": status,
                "params": 1000 + index,
                "samples_per_second": 100.0 + index,
                "steady_samples_per_second": 110.0 + (index * 7) % 50,
                "final_loss": 2.5 - index / 1000,
                "peak_allocated_bytes": (64 + index) << 20,
                "gpu_name": "NVIDIA H100 80GB HBM3",
                "tensor_active_percent": float(index % 100),
                "joules_per_sample": 0.5 + index / 100,
                "diagnosis": [{"bottleneck": "input pipeline"}] if index % 5 == 0 else [],
                "bands": {"weights_bytes": 1 << 20, "gradients_bytes": 2 << 20},
            }
            if index == 7:  # a result written before the bands were one moment's
                values["gradients_at_forward_end_bytes"] = 3 << 20
            store.update_result(run_id, RunResult.from_json(values), status=status)
            created[run_id] = created_at
    return created


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[Path, dict[int, float]]:
    db = tmp_path_factory.mktemp("big") / "history.sqlite"
    return db, make_history(db)


def _whole_listing(db: Path) -> list[dict]:
    """The listing's rows from every run read whole (`HistoryStore.runs`): what the fast read must equal."""
    with HistoryStore(db, read_only=True) as store:
        runs = store.runs()
        totals = {run.search.id: len(store.search_trials(run.search.id)) for run in runs if run.search is not None}
    return listing_rows(fold_searches(runs, totals))


def test_every_format_lists_every_run_with_the_values_of_the_whole_read(history):
    db, created = history
    expected = _whole_listing(db)
    assert len(expected) == RUNS - 5  # the tune's six trials are one line
    listed = run_cli(["history", "--format", "csv"], db)
    assert listed.returncode == 0, listed.stderr
    assert listed.stdout == render_csv((*HISTORY_COLUMNS, TAGS_COLUMN), expected)
    rows = list(csv.DictReader(io.StringIO(listed.stdout)))
    assert [row["id"] for row in rows] == [*map(str, range(1, 121)), "s1", *map(str, range(127, RUNS + 1))]
    assert rows[0]["name"] == "exp-0 [lr0]" and rows[0]["tags"] == "baseline, sweep" and rows[0]["loss"] == "2.5"
    assert rows[5]["status"] == "failed" and rows[5]["bottleneck"] == "input pipeline"

    # the long table: every row, written as Rich writes it
    table = run_cli(["history"], db)
    assert table.returncode == 0, table.stderr
    assert len(expected) > PLAIN_FROM_ROWS
    rich_table = Table(show_edge=False, header_style="bold")
    columns = (*HISTORY_COLUMNS, TAGS_COLUMN)
    for column in columns:
        rich_table.add_column(column.title, justify="right" if column.numeric else "left", no_wrap=True)
    for row in expected:
        rich_table.add_row(*(Text(display_value(column.key, row.get(column.key))) for column in columns))
    written = io.StringIO()
    Console(file=written, width=10_000).print(rich_table)
    note = (
        "s1: a search (tune, fit) shown as its best trial; --trials lists every trial, --delete s1 deletes all of them"
    )
    assert table.stdout == written.getvalue() + note + "\n"
    assert "[lr1]" in table.stdout  # brackets read as given, not as markup

    # JSON, an entry a line: each run's whole result, as the store reads it
    entries = json.loads(run_cli(["history", "--json", "--trials"], db).stdout)
    with HistoryStore(db, read_only=True) as store:
        whole = {run.id: run for run in store.runs()}
    assert [entry["id"] for entry in entries] == list(range(1, RUNS + 1))
    for entry in entries:
        run = whole[entry["id"]]
        assert entry["result"] == run.result.to_json() and entry["config"] == run.config
        assert entry["tags"] == list(run.tags) and entry["status"] == run.status and entry["name"] == run.name
    assert entries[7]["result"]["gradients_after_backward_bytes"] == 2 << 20  # the old bands, read as now
    assert entries[0]["result"]["bands"] == {"weights_bytes": 1 << 20, "gradients_bytes": 2 << 20}
    folded = json.loads(run_cli(["history", "--json"], db).stdout)
    (search,) = [entry for entry in folded if entry["search"] is not None]
    assert search["search"]["trials"] == 6 and search["search"]["trial_ids"] == list(range(121, 127))

    # the filters: every run they pick
    named = run_cli(["history", "--format", "csv", "--trials", "--name", "EXP-3 [LR"], db)
    picked = [row["id"] for row in csv.DictReader(io.StringIO(named.stdout))]
    assert picked == [str(index + 1) for index in range(RUNS) if index % 40 == 3 and index % 9 != 4]
    tagged = run_cli(["history", "--format", "md", "--trials", "--tagged", "baseline"], db)
    ids = [line.split("|")[1].strip() for line in tagged.stdout.splitlines()[2:]]  # after the header's two lines
    assert ids == [str(index + 1) for index in range(0, RUNS, 25)]
    assert created  # (used by the prune test)


def test_the_listing_read_equals_the_whole_read_where_a_run_is_still_recorded_or_damaged(tmp_path):
    db = tmp_path / "history.sqlite"
    with HistoryStore(db) as store:
        kept = store.create_run({"preset": "tiny"}, name="kept")
        store.update_result(kept, RunResult(run_id=kept, status="ok", samples_per_second=5.0), status="ok")
        left = store.create_run({"preset": "tiny"}, name="its recorder died")
        store.add_steps(left, [{"step": 1, "elapsed_s": 0.5, "loss": 3.0}])
    with closing(sqlite3.connect(db)) as raw, raw:  # its recorder: a process that is gone
        raw.execute("UPDATE runs SET recorder_pid = 999999999 WHERE id = ?", (left,))
    with HistoryStore(db, read_only=True) as store:
        fast, whole = listed_runs(store), store.runs()
    assert [run.status for run in fast] == ["ok", "interrupted"] == [run.status for run in whole]
    assert listing_rows(fast) == listing_rows(whole)
    with closing(sqlite3.connect(db)) as raw, raw:
        raw.execute("UPDATE runs SET result_json = '{broken' WHERE id = ?", (kept,))
    # a listing shows the values schema 5 keeps in columns; the whole result, printed by --json, says it is damaged
    listed = run_cli(["history", "--format", "csv"], db)
    assert listed.returncode == 0 and "kept" in listed.stdout
    damaged = run_cli(["history", "--json"], db)
    assert damaged.returncode == 2 and f"run {kept} in history" in damaged.stderr and "damaged" in damaged.stderr


def test_prune_shows_what_goes_asks_and_deletes_exactly_those(history, tmp_path):
    source, created = history
    db = tmp_path / "history.sqlite"
    db.write_bytes(source.read_bytes())
    older = [run_id for run_id, at in created.items() if at < time.time() - 60 * DAY_S]
    failed_older = [run_id for run_id in older if (run_id - 1) % 13 == 5]
    args = ["history", "--prune", "--older-than", "60d", "--status", "failed"]

    refused = start_cli(args, db, stdin=subprocess.DEVNULL)
    out, err = refused.communicate(timeout=120)
    assert refused.returncode == 2 and out == ""
    assert err.count("\n") == 1 and f"add --yes to delete {len(failed_older)} runs ({failed_older[0]}, " in err

    code, shown = _in_terminal(args, db, b"n\n")  # a terminal: it shows them and asks
    assert code == 0
    lines = shown.splitlines()
    assert lines[0] == f"Deleting {len(failed_older)} runs with their steps, samples, tags and logs:"
    assert lines[1].startswith(f"  run {failed_older[0]} · ") and lines[1].endswith(" · failed")
    assert f"  … and {len(failed_older) - 7} more (run {failed_older[7]} to run {failed_older[-1]})" in lines
    assert shown.endswith("Nothing deleted.\n")
    assert len(json.loads(run_cli(["history", "--json", "--trials"], db).stdout)) == RUNS

    pruned = run_cli([*args, "--yes"], db)
    assert pruned.returncode == 0, pruned.stderr
    assert pruned.stdout.endswith(f"Deleted {len(failed_older)} runs.\n")
    left = [entry["id"] for entry in json.loads(run_cli(["history", "--json", "--trials"], db).stdout)]
    assert left == [run_id for run_id in range(1, RUNS + 1) if run_id not in failed_older]

    # --keep: the newest N of those the tag picks; the rest of the tagged go, the untagged stay
    sweep = [run_id for run_id in left if (run_id - 1) % 10 == 0]
    kept = run_cli(["history", "--prune", "--tagged", "sweep", "--keep", "5", "--yes"], db)
    assert kept.returncode == 0, kept.stderr
    after = [entry["id"] for entry in json.loads(run_cli(["history", "--json", "--trials"], db).stdout)]
    assert after == [run_id for run_id in left if run_id not in sweep[:-5]]
    with closing(sqlite3.connect(db)) as raw:
        assert raw.execute("SELECT count(*) FROM run_tags WHERE run_id NOT IN (SELECT id FROM runs)").fetchone() == (0,)
    nothing = run_cli(["history", "--prune", "--keep", "100000"], db)
    assert nothing.returncode == 0 and nothing.stdout == "Nothing to prune: no run meets all of the criteria given.\n"


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["--prune"], "--prune: say what to prune: --older-than AGE"),
        (["--prune", "--older-than", "30 days"], "--older-than: give an age as a number and a unit"),
        (["--prune", "--older-than", "0d"], "--older-than: give an age"),
        (["--prune", "--keep", "-3"], "--keep: must be an integer ≥ 0"),
        (["--prune", "--keep", "many"], "argument --keep: invalid int value: 'many'"),
        (["--prune", "--status", "running"], "--status: one of ok, oom, failed"),
        (["--prune", "--keep", "3", "--json"], "--prune: --json shapes a listing"),
        (["--prune", "--keep", "3", "--delete", "1"], "--prune: give --delete in a command of its own"),
        (["--older-than", "3d"], "--older-than chooses what --prune deletes; give it with --prune"),
    ],
)
def test_bad_prune_values_are_refused_in_one_line(history, args, said):
    db, _ = history
    before = db.stat().st_mtime_ns
    refused = run_cli(["history", *args], db)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and said in refused.stderr, refused.stderr
    assert db.stat().st_mtime_ns == before


@pytest.mark.asyncio
async def test_the_dashboard_history_holds_the_newest_rows_m_gets_more_and_the_filter_searches_all(history):
    db, _ = history
    app = cpu_dashboard(db)
    async with app.run_test(size=(160, 40)) as pilot:
        await pilot.press("h")
        screen = app.screen
        assert isinstance(screen, HistoryScreen)
        lines = RUNS - 5
        assert screen.shown_keys[-1] == str(RUNS) and len(screen.shown_keys) == PAGE_ROWS
        assert len(screen.run_rows) == lines
        assert f"m: {PAGE_ROWS} more" in str(screen.query_one("#history-hint").render())
        assert screen.check_action("more", ()) is True
        await pilot.press("m")
        assert len(screen.shown_keys) == min(lines, 2 * PAGE_ROWS)
        assert screen.shown_keys[-1] == str(RUNS) and screen.cursor_run_id == RUNS  # the cursor stayed
        await pilot.press("slash", *"exp-1 [lr1]")  # the oldest runs are found too
        await pilot.pause()
        assert screen.shown_keys[0] == "2"
        await pilot.press("escape", "escape")
