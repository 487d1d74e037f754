"""Pruning, deleting and tagging more runs than SQLite binds in one statement (issue #53): SQLite refuses a statement
with more than SQLITE_MAX_VARIABLE_NUMBER values (32,766 in builds since 3.32, 999 in older ones; some distributions
raise it), so the history binds run ids in chunks, all in one transaction. Real history files made by HistoryStore,
filled fast with executemany, and the real CLI in a subprocess."""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

from conftest import run_cli

from gpuanat.core.store.history import HistoryStore

MANY_RUNS = 33_001
"""More runs than SQLite's default variable limit of new builds."""
NEW_BUILDS_VARIABLE_LIMIT = 32_766
"""SQLITE_MAX_VARIABLE_NUMBER's default since SQLite 3.32 (the Python here may be built with a higher one)."""


def _history_of(db: Path, runs: int) -> None:
    """A history made by HistoryStore with `runs` finished runs, each with one step, every tenth tagged "sweep"."""
    with HistoryStore(db):
        pass
    with closing(sqlite3.connect(db)) as raw, raw:
        raw.executemany(
            "INSERT INTO runs (id, kind, name, status, created_at, finished_at, config_json, result_json)"
            " VALUES (?, 'launched', ?, 'ok', ?, ?, '{}', '{\"samples_per_second\": 1.5}')",
            [(run_id, f"run {run_id}", 1_000_000.0 + run_id, 1_000_010.0 + run_id) for run_id in range(1, runs + 1)],
        )
        raw.executemany(
            "INSERT INTO steps VALUES (?, 1, 0.5, '{\"step\": 1}')", [(run_id,) for run_id in range(1, runs + 1)]
        )
        raw.executemany("INSERT INTO run_tags VALUES (?, 'sweep')", [(run_id,) for run_id in range(1, runs + 1, 10)])


def _count(db: Path, sql: str) -> int:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as raw:
        return int(raw.execute(sql).fetchone()[0])


def test_prune_of_more_runs_than_one_statement_binds(tmp_path: Path) -> None:
    db = tmp_path / "history.sqlite"
    _history_of(db, MANY_RUNS)
    pruned = run_cli(["history", "--prune", "--keep", "1", "--yes"], db, timeout_s=120)
    assert pruned.returncode == 0, pruned.stderr
    assert f"Deleted {MANY_RUNS - 1} runs." in pruned.stdout
    assert _count(db, "SELECT count(*) FROM runs") == 1
    assert _count(db, "SELECT max(id) FROM runs") == MANY_RUNS
    assert _count(db, "SELECT count(*) FROM steps") == 1
    assert _count(db, f"SELECT count(*) FROM run_tags WHERE run_id != {MANY_RUNS}") == 0


def test_store_past_the_variable_limit_of_new_sqlite_builds(tmp_path: Path) -> None:
    """The store's own connection held to the limit SQLite's builds since 3.32 have: tagging, checking and deleting
    33,001 runs each work, the deletion in one transaction."""
    db = tmp_path / "history.sqlite"
    _history_of(db, MANY_RUNS)
    ids = list(range(1, MANY_RUNS + 1))
    with HistoryStore(db) as store:
        store._db.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, NEW_BUILDS_VARIABLE_LIMIT)
        assert store.tag_runs(ids, "all") == MANY_RUNS
        assert store.tag_runs(ids, "sweep", tagged=False) == len(range(1, MANY_RUNS + 1, 10))
        assert store.in_progress(ids) == []
        deleted = store.delete_runs([*ids, MANY_RUNS + 5])
    assert deleted.run_ids == tuple(ids)
    assert _count(db, "SELECT count(*) FROM runs") == 0
    assert _count(db, "SELECT count(*) FROM steps") == 0
    assert _count(db, "SELECT count(*) FROM run_tags") == 0
