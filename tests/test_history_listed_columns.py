"""Schema 5 (issue #53): runs keep the result's values a listing shows as columns of their own, so `gpuanat history`
and the dashboard's history screen read no stored result. Upgrades of real earlier histories fill them from the
results stored (a damaged one's stay NULL); listings read them, and print the same as from the stored results."""

from __future__ import annotations

import json
import math
import shutil
import sqlite3
from contextlib import closing
from pathlib import Path

from conftest import REPO, run_cli

from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.history_listing import LISTED_RESULT_KEYS, listed_runs
from gpuanat.core.store.history_schema import LISTED_COLUMNS, LISTED_JSON_COLUMNS, SCHEMA_VERSION
from gpuanat.core.store.report import listing_rows
from gpuanat.core.vocabulary.result import RunResult

RECORDED_V3 = REPO / "tests" / "data" / "v3_cpu_history.sqlite"
"""Schema version 3, two tiny CPU runs recorded by gpuanat at 077230e."""
LISTINGS = (["--format", "csv"], ["--format", "md"], ["--json"], [])


def _columns(db: Path) -> dict[int, dict[str, object]]:
    names = (*LISTED_COLUMNS, *LISTED_JSON_COLUMNS, "result_listed")
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as raw:
        rows = raw.execute(f"SELECT id, {', '.join(names)} FROM runs ORDER BY id").fetchall()
    return {row[0]: dict(zip(names, row[1:], strict=True)) for row in rows}


def test_an_upgrade_fills_the_listed_columns_from_the_stored_results_and_listings_print_the_same(tmp_path):
    db = tmp_path / "history.sqlite"
    shutil.copy(RECORDED_V3, db)
    with closing(sqlite3.connect(db)) as raw, raw:  # a third run of the same file, with a damaged result
        raw.execute(
            "INSERT INTO runs (kind, name, status, created_at, finished_at, config_json, result_json)"
            " SELECT kind, 'damaged', status, created_at + 60, finished_at + 60, config_json, '{\"samples_per'"
            " FROM runs WHERE id = 1"
        )
        stored = {run_id: json.loads(text) for run_id, text in raw.execute("SELECT id, result_json FROM runs LIMIT 2")}
    before = {tuple(flags): run_cli(["history", *flags, "--name", "v3"], db) for flags in LISTINGS}
    assert all(listed.returncode == 0 for listed in before.values()), before
    HistoryStore(db).close()  # a writable open upgrades it
    with closing(sqlite3.connect(db)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    columns = _columns(db)
    for run_id, result in stored.items():
        assert {column: columns[run_id][column] for column in LISTED_COLUMNS} == {
            column: result.get(column) for column in LISTED_COLUMNS
        }
        assert columns[run_id]["result_listed"] == 1
        for column, key in LISTED_JSON_COLUMNS.items():
            assert (json.loads(columns[run_id][column]) if columns[run_id][column] else None) == result.get(key)
    assert stored[1]["samples_per_second"] is not None and stored[2]["diagnosis"] == []  # values, not NULLs
    assert set(columns[3].values()) == {None}  # the damaged result: read whole, and it says so
    for flags, listed in before.items():
        after = run_cli(["history", *flags, "--name", "v3"], db)
        assert (after.returncode, after.stdout) == (0, listed.stdout), after.stderr
    damaged = run_cli(["history"], db)
    assert damaged.returncode == 2 and "run 3 in history" in damaged.stderr and "damaged" in damaged.stderr


def test_a_listing_reads_the_columns_written_with_each_result(tmp_path):
    db = tmp_path / "history.sqlite"
    with HistoryStore(db) as store:
        profiled = store.create_run({"preset": "tiny", "batch_size": 4}, name="profiled")
        store.update_result(
            profiled,
            RunResult(
                run_id=profiled,
                status="ok",
                samples_per_second=12.5,
                peak_allocated_bytes=123_456_789,
                final_loss=2.25,
                diagnosis=[{"bottleneck": "input pipeline"}],
                operations_anatomy={"groups": {"contractions": {"share": 0.8}}},
            ),
            status="ok",
        )
        odd = store.create_run({"preset": "tiny", "batch_size": 8}, name="not a number")
        store.update_result(odd, RunResult(run_id=odd, status="ok", samples_per_second=math.nan), status="ok")
        running = store.create_run({"preset": "tiny", "batch_size": 2}, name="running")
    columns = _columns(db)
    assert columns[profiled]["samples_per_second"] == 12.5
    assert columns[profiled]["peak_allocated_bytes"] == 123_456_789  # an integer stays one
    assert json.loads(str(columns[profiled]["diagnosis_json"])) == [{"bottleneck": "input pipeline"}]
    assert columns[profiled]["result_listed"] == 1
    assert columns[odd]["result_listed"] is None  # its text is not valid JSON: a listing reads it whole
    assert set(columns[running].values()) == {None}
    with closing(sqlite3.connect(db)) as raw, raw:  # the stored text no longer read by a listing
        raw.execute("UPDATE runs SET result_json = '{}' WHERE id = ?", (profiled,))
    with HistoryStore(db, read_only=True) as store:
        listed = listed_runs(store)
    assert [run.id for run in listed] == [profiled, odd, running]
    assert listed[0].result.samples_per_second == 12.5 and listed[0].result.final_loss == 2.25
    assert set(listed[0].result.json_keys) <= set(LISTED_RESULT_KEYS)
    assert math.isnan(listed[1].result.samples_per_second)
    rows = listing_rows(listed)
    assert rows[0]["bottleneck"] == "input pipeline" and rows[0]["peak_allocated"] == 123_456_789
    assert rows[0]["techniques"] == "bs4" and rows[1]["techniques"] == "bs8"
