"""SQLite history of runs and their time series.

One row per run (config, environment, status, result) plus its step records and NVML samples.
Rows are written while the run streams, so a crash of the child — or of gpuanat — never loses what
was recorded: a run whose recorder died is reported as `interrupted` when the history is read.
Location: --db PATH, else GPUANAT_DB, else $XDG_DATA_HOME/gpuanat/history.sqlite.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DB_ENV = "GPUANAT_DB"
SCHEMA_VERSION = 1
ACTIVE_STATUSES = ("running",)

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    name TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    config_json TEXT NOT NULL,
    environment_json TEXT,
    result_json TEXT,
    log_path TEXT,
    recorder_pid INTEGER
);
CREATE TABLE IF NOT EXISTS steps (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    elapsed_s REAL NOT NULL,
    record_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS steps_by_run ON steps(run_id, step);
CREATE TABLE IF NOT EXISTS samples (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t_s REAL NOT NULL,
    sample_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_by_run ON samples(run_id, t_s);
"""


def default_db_path() -> Path:
    """GPUANAT_DB, else the XDG data directory."""
    if os.environ.get(DB_ENV):
        return Path(os.environ[DB_ENV]).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "gpuanat" / "history.sqlite"


@dataclass(frozen=True)
class RunRow:
    id: int
    kind: str
    """"launched" (gpuanat started it) or "watched"."""
    name: str | None
    """The sweep experiment name, when it came from a sweep."""
    status: str
    created_at: float
    """Unix time."""
    finished_at: float | None
    config: dict[str, Any]
    environment: dict[str, Any]
    result: dict[str, Any]
    log_path: str | None


def pid_alive(pid: int | None) -> bool:
    """Whether a process with this PID exists (one we may not signal counts)."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class HistoryStore:
    """The run history. Safe to open from several processes (WAL); one instance per thread."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(self.path, timeout=10.0)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._db.executescript(SCHEMA)
        self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._db:
            yield self._db

    def create_run(self, config: Mapping[str, Any], *, kind: str = "launched", name: str | None = None,
                   created_at: float | None = None) -> int:
        """A new run, `running` until `update_result` gives it a final status; `created_at` (Unix time)
        defaults to now and is set when importing runs recorded elsewhere."""
        with self._transaction() as db:
            cursor = db.execute(
                "INSERT INTO runs (kind, name, status, created_at, config_json, recorder_pid)"
                " VALUES (?, ?, 'running', ?, ?, ?)",
                (kind, name, time.time() if created_at is None else created_at, json.dumps(dict(config)),
                 os.getpid()),
            )
            assert cursor.lastrowid is not None
            return cursor.lastrowid

    def set_log_path(self, run_id: int, log_path: Path) -> None:
        with self._transaction() as db:
            db.execute("UPDATE runs SET log_path = ? WHERE id = ?", (str(log_path), run_id))

    def set_config(self, run_id: int, config: Mapping[str, Any]) -> None:
        """Replace the run's config: a watched run learns its techniques only when the probe reports them."""
        with self._transaction() as db:
            db.execute("UPDATE runs SET config_json = ? WHERE id = ?", (json.dumps(dict(config)), run_id))

    def set_environment(self, run_id: int, environment: Mapping[str, Any]) -> None:
        with self._transaction() as db:
            db.execute("UPDATE runs SET environment_json = ? WHERE id = ?", (json.dumps(dict(environment)), run_id))

    def add_steps(self, run_id: int, records: Iterable[Mapping[str, Any]]) -> None:
        rows = [(run_id, record["step"], record["elapsed_s"], json.dumps(dict(record))) for record in records]
        if rows:
            with self._transaction() as db:
                db.executemany("INSERT INTO steps VALUES (?, ?, ?, ?)", rows)

    def add_samples(self, run_id: int, samples: Iterable[Mapping[str, Any]]) -> None:
        rows = [(run_id, sample["t_s"], json.dumps(dict(sample))) for sample in samples]
        if rows:
            with self._transaction() as db:
                db.executemany("INSERT INTO samples VALUES (?, ?, ?)", rows)

    def update_result(self, run_id: int, result: Mapping[str, Any], *, status: str | None = None) -> None:
        """Store the run's result so far; `status` other than running also marks it finished."""
        with self._transaction() as db:
            db.execute("UPDATE runs SET result_json = ? WHERE id = ?", (json.dumps(dict(result)), run_id))
            if status is not None:
                finished_at = None if status in ACTIVE_STATUSES else time.time()
                db.execute("UPDATE runs SET status = ?, finished_at = ? WHERE id = ?", (status, finished_at, run_id))

    def _row(self, row: tuple[Any, ...]) -> RunRow:
        (run_id, kind, name, status, created_at, finished_at, config_json, environment_json, result_json,
         log_path, recorder_pid) = row
        if status in ACTIVE_STATUSES and not pid_alive(recorder_pid):
            status = "interrupted"
        return RunRow(
            id=run_id, kind=kind, name=name, status=status, created_at=created_at, finished_at=finished_at,
            config=json.loads(config_json), environment=json.loads(environment_json or "{}"),
            result=json.loads(result_json or "{}"), log_path=log_path,
        )

    _COLUMNS = ("id, kind, name, status, created_at, finished_at, config_json, environment_json, result_json,"
                " log_path, recorder_pid")

    def runs(self, limit: int | None = None) -> list[RunRow]:
        """Runs, oldest first (the last `limit` when given)."""
        query = f"SELECT {self._COLUMNS} FROM runs ORDER BY id DESC"
        parameters: tuple[Any, ...] = ()
        if limit is not None:
            query += " LIMIT ?"
            parameters = (limit,)
        return [self._row(row) for row in reversed(self._db.execute(query, parameters).fetchall())]

    def run(self, run_id: int) -> RunRow | None:
        row = self._db.execute(f"SELECT {self._COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
        return self._row(row) if row else None

    def steps(self, run_id: int) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT record_json FROM steps WHERE run_id = ? ORDER BY step", (run_id,))
        return [json.loads(record) for (record,) in rows]

    def samples(self, run_id: int) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT sample_json FROM samples WHERE run_id = ? ORDER BY t_s", (run_id,))
        return [json.loads(sample) for (sample,) in rows]
