"""SQLite history of runs and their time series, kept the way a database people trust keeps it.

One row per run (config, environment, status, result) plus its step records and NVML samples. Rows are
written while the run streams, so a crash of the child — or of gpuanat — never loses what was recorded.
Location: --db PATH, else GPUANAT_DB, else $XDG_DATA_HOME/gpuanat/history.sqlite.

`HistoryStore` is the runs in it, written and read; the file under it — what makes a file ours, read-only opens
that never write, privacy, one transaction at a time — is `history_file.HistoryFile`, and what can go wrong, as one
typed line each, is `history_errors`.

What it guarantees beyond its file's guarantees:
- **A failed write can be retried.** A write that failed because the history was busy (locked longer than
  WRITE_BUSY_TIMEOUT_S), full (SQLITE_FULL, ENOSPC) or failing I/O raises `HistoryWriteError`: nothing of that
  write was stored, the connection is rolled back and usable, and the same write can be retried (the run session
  keeps its records and retries on its next flush; `write_with_backoff` retries a final write until a deadline).
- **An interrupted run is finalised once.** Each run stores its recorder's PID and start time. A writable open
  finalises every `running` run whose recorder is gone (no such PID, or the PID now belongs to a process started
  at another time, `interrupted.recorder_alive`): status `interrupted`, `finished_at` the time of its last recorded
  write, and a result rebuilt from its steps (`interrupted.result_from_steps`) under what it had stored. Reads show
  such a row the same way, unwritten.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

from gpuanat.core.measure.anatomy import bands_of_one_moment
from gpuanat.core.store.history_errors import EXIT_BAD_FILE, HistoryError, HistoryWriteError, one_line
from gpuanat.core.store.history_file import HistoryFile
from gpuanat.core.store.history_rows import Deleted as Deleted  # the rows it gives back, where they were
from gpuanat.core.store.history_rows import RunRow as RunRow
from gpuanat.core.store.history_rows import SearchRef as SearchRef
from gpuanat.core.store.history_rows import id_chunks, own_log_path
from gpuanat.core.store.history_schema import (
    ACTIVITY_COLUMNS,
    LISTED_BEFORE_30,
    LISTED_COLUMNS,
    LISTED_JSON_COLUMNS,
    RUN_COLUMNS,
)
from gpuanat.core.store.interrupted import interrupted_result, process_started_at, recorder_alive, result_from_steps
from gpuanat.core.vocabulary.result import RunResult

ACTIVE_STATUSES = ("running",)


class RunInProgress(HistoryError):
    """Runs that another process is recording now cannot be deleted: their ids in `run_ids`."""

    def __init__(self, run_ids: list[int]) -> None:
        self.run_ids = run_ids
        listed = ", ".join(map(str, run_ids))
        super().__init__(
            f"run {listed} {'is' if len(run_ids) == 1 else 'are'} still being recorded by another process; "
            "stop it (or let it end), then delete it",
            EXIT_BAD_FILE,
        )


RENAME_DEADLINE_S = 10.0
"""How long a rename (`history --rename`, the dashboard's `n`) retries a busy or full history through
`write_with_backoff` before it says the name was not saved: someone is waiting for it."""


_RESULT_ASSIGNMENTS = ", ".join(
    f"{column} = ?" for column in (*ACTIVITY_COLUMNS, *LISTED_COLUMNS, *LISTED_JSON_COLUMNS, "result_listed")
)
"""The columns that repeat values of the stored result, set with it (`_stored_result`)."""


def _stored_result(result: RunResult, stored: dict[str, Any]) -> tuple[Any, ...]:
    """`result` (whose JSON is `stored`) as its text, then the values of `_RESULT_ASSIGNMENTS`: the activity columns,
    the listed ones as the stored result has them, and `result_listed` (`history_schema.LISTED_BEFORE_30`): 1 where
    the text is valid JSON of a current result, NULL where a value is NaN or infinite (a listing reads it whole)."""
    try:
        text, listed = (
            json.dumps(stored, allow_nan=False),
            1 if bands_of_one_moment(stored) is stored else LISTED_BEFORE_30,
        )
    except ValueError:
        text, listed = json.dumps(stored), None
    return (
        text,
        *(getattr(result, column) for column in ACTIVITY_COLUMNS),
        *(stored.get(column) for column in LISTED_COLUMNS),
        *(json.dumps(stored[key]) if stored.get(key) is not None else None for key in LISTED_JSON_COLUMNS.values()),
        listed,
    )


class HistoryStore(HistoryFile):
    """The run history: runs created, recorded into and finished, and read back. Safe to open from several
    processes (WAL); one instance per thread. `read_only=True` for commands that only read (`history_file`'s
    guarantees)."""

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        super().__init__(path, read_only=read_only)
        if not read_only:
            try:
                self._finalise_quietly()
            except BaseException:
                self._db.close()
                raise

    def _finalise_quietly(self) -> None:
        """Finalisation on open must not stop a run from starting: a busy or full history is finalised by a later
        open."""
        with suppress(HistoryWriteError):
            self.finalise_interrupted()

    def create_run(
        self,
        config: Mapping[str, Any],
        *,
        kind: str = "launched",
        name: str | None = None,
        created_at: float | None = None,
        search_id: int | None = None,
        tags: Iterable[str] = (),
    ) -> int:
        """A new run, `running` until `update_result` gives it a final status; `created_at` (Unix time)
        defaults to now and is set when importing runs recorded elsewhere. The recorder is this process. `search_id`:
        the search (`create_search`) it is a trial of; `tags`: tags it starts with, in the same transaction."""
        config_json = json.dumps(dict(config))
        recorder_started_at = process_started_at(os.getpid())
        with self._write("the new run") as db:
            cursor = db.execute(
                "INSERT INTO runs (kind, name, status, created_at, config_json, recorder_pid, recorder_started_at,"
                " search_id) VALUES (?, ?, 'running', ?, ?, ?, ?, ?)",
                (
                    kind,
                    name,
                    time.time() if created_at is None else created_at,
                    config_json,
                    os.getpid(),
                    recorder_started_at,
                    search_id,
                ),
            )
            assert cursor.lastrowid is not None
            db.executemany(
                "INSERT OR IGNORE INTO run_tags (run_id, tag) VALUES (?, ?)", [(cursor.lastrowid, tag) for tag in tags]
            )
            return cursor.lastrowid

    def create_search(self, kind: str, name: str | None = None) -> int:
        """A new search (`kind` "tune" or "fit") whose trials `create_run(search_id=…)` records; its id."""
        with self._write("the new search") as db:
            cursor = db.execute(
                "INSERT INTO searches (kind, name, created_at) VALUES (?, ?, ?)", (kind, name, time.time())
            )
            assert cursor.lastrowid is not None
            return cursor.lastrowid

    def set_log_path(self, run_id: int, log_path: Path) -> None:
        with self._write("the run's log path") as db:
            db.execute("UPDATE runs SET log_path = ? WHERE id = ?", (str(log_path), run_id))

    def set_name(self, run_id: int, name: str | None) -> bool:
        """Name run `run_id` anew (None: no name), in its row and in the result it stored. False when there is no
        such run (nothing was written). A busy or full history raises HistoryWriteError, nothing written: retry it
        with `write_with_backoff`."""
        with self._write("the run's name") as db:
            found = db.execute("SELECT result_json FROM runs WHERE id = ?", (run_id,)).fetchone()
            if found is None:
                return False
            db.execute("UPDATE runs SET name = ? WHERE id = ?", (name, run_id))
            result = self._json(found["result_json"], run_id)
            if isinstance(result, dict) and "name" in result:  # `history --json` shows both: they must agree
                db.execute(
                    "UPDATE runs SET result_json = ? WHERE id = ?", (json.dumps({**result, "name": name}), run_id)
                )
            return True

    def set_config(self, run_id: int, config: Mapping[str, Any]) -> None:
        """Replace the run's config: a watched run learns its techniques only when the probe reports them."""
        config_json = json.dumps(dict(config))
        with self._write("the run's config") as db:
            db.execute("UPDATE runs SET config_json = ? WHERE id = ?", (config_json, run_id))

    def set_environment(self, run_id: int, environment: Mapping[str, Any]) -> None:
        environment_json = json.dumps(dict(environment))
        with self._write("the run's environment") as db:
            db.execute("UPDATE runs SET environment_json = ? WHERE id = ?", (environment_json, run_id))

    def add_steps(self, run_id: int, records: Iterable[Mapping[str, Any]]) -> None:
        rows = [(run_id, record["step"], record["elapsed_s"], json.dumps(dict(record))) for record in records]
        if rows:
            with self._write(f"{len(rows)} step records") as db:
                db.executemany("INSERT INTO steps VALUES (?, ?, ?, ?)", rows)
                db.execute("UPDATE runs SET last_recorded_at = ? WHERE id = ?", (time.time(), run_id))

    def add_samples(self, run_id: int, samples: Iterable[Mapping[str, Any]]) -> None:
        rows = [(run_id, sample["t_s"], json.dumps(dict(sample))) for sample in samples]
        if rows:
            with self._write(f"{len(rows)} samples") as db:
                db.executemany("INSERT INTO samples VALUES (?, ?, ?)", rows)
                db.execute("UPDATE runs SET last_recorded_at = ? WHERE id = ?", (time.time(), run_id))

    def update_result(self, run_id: int, result: RunResult, *, status: str | None = None) -> None:
        """Store the run's result so far; `status` other than running also marks it finished."""
        stored = result.to_json()
        with self._write("the run's result") as db:
            db.execute(
                f"UPDATE runs SET result_json = ?, {_RESULT_ASSIGNMENTS} WHERE id = ?",
                (*_stored_result(result, stored), run_id),
            )
            if status is not None:
                finished_at = None if status in ACTIVE_STATUSES else time.time()
                db.execute("UPDATE runs SET status = ?, finished_at = ? WHERE id = ?", (status, finished_at, run_id))

    def finalise_interrupted(self, *, now: Callable[[], float] = time.time) -> list[int]:
        """Finalise, once, every `running` run whose recorder is gone (`recorder_alive`): status `interrupted`,
        `finished_at` the time of its last recorded write (else `now()`), and a result rebuilt from its steps under
        what it had stored (`result_from_steps`, `interrupted_result`). Returns their ids. Runs on every writable
        open; raises HistoryWriteError when the history is busy or full (nothing changed then)."""
        query = f"SELECT {RUN_COLUMNS} FROM runs WHERE status = 'running'"
        if not any(self._gone(row) for row in self._fetch(query)):
            return []
        finalised = []
        with self._write("the final state of interrupted runs") as db:
            for row in db.execute(query).fetchall():  # read again in the transaction: another process may be first
                if not self._gone(row):
                    continue
                run_id = row["id"]
                result = self._interrupted_result(row)
                finished_at = row["last_recorded_at"] or self._estimated_last_record(run_id, row["created_at"]) or now()
                stored = result.to_json()
                db.execute(
                    f"UPDATE runs SET status = 'interrupted', finished_at = ?, result_json = ?, {_RESULT_ASSIGNMENTS}"
                    " WHERE id = ? AND status = 'running'",
                    (finished_at, *_stored_result(result, stored), run_id),
                )
                finalised.append(run_id)
        return finalised

    def _estimated_last_record(self, run_id: int, created_at: float) -> float | None:
        """For a run of schema version 1 (no last_recorded_at): the creation time plus how long it recorded, by its
        last step's training time or the span of its samples (a monotonic clock), whichever is longer."""
        ((elapsed_s, first_t_s, last_t_s),) = self._db.execute(
            "SELECT (SELECT max(elapsed_s) FROM steps WHERE run_id = ?),"
            " (SELECT min(t_s) FROM samples WHERE run_id = ?), (SELECT max(t_s) FROM samples WHERE run_id = ?)",
            (run_id, run_id, run_id),
        ).fetchall()
        spans = [
            span for span in (elapsed_s, last_t_s - first_t_s if first_t_s is not None else None) if span is not None
        ]
        return created_at + max(spans) if spans else None

    @staticmethod
    def _gone(row: sqlite3.Row) -> bool:
        return row["status"] in ACTIVE_STATUSES and not recorder_alive(
            row["recorder_pid"], row["recorder_started_at"], created_at=row["created_at"]
        )

    def _interrupted_result(self, row: sqlite3.Row) -> RunResult:
        run_id = row["id"]
        rebuilt = result_from_steps(
            self._json(row["config_json"], run_id), self.steps(run_id), run_id=run_id, recorder_pid=row["recorder_pid"]
        )
        return interrupted_result(self._json(row["result_json"], run_id), rebuilt)

    def _row(
        self,
        row: sqlite3.Row,
        tags: Mapping[int, tuple[str, ...]] | None = None,
        searches: Mapping[int, SearchRef] | None = None,
    ) -> RunRow:
        run_id, status, stored = row["id"], row["status"], self._json(row["result_json"], row["id"])
        # a row written before the bands were one moment's reads as now
        result = RunResult.from_json(bands_of_one_moment(stored) if isinstance(stored, dict) else {})
        if self._gone(row):  # shown as a writable open will finalise it, without writing
            status, result = "interrupted", self._interrupted_result(row)
        return RunRow(
            id=run_id,
            kind=row["kind"],
            name=row["name"],
            status=status,
            created_at=row["created_at"],
            finished_at=row["finished_at"],
            config=self._json(row["config_json"], run_id),
            environment=self._json(row["environment_json"], run_id),
            result=result,
            log_path=row["log_path"],
            tags=(tags or {}).get(run_id, ()),
            search=(searches or {}).get(row["search_id"]) if row["search_id"] is not None else None,
        )

    def _json(self, text: str | None, run_id: int) -> Any:
        """A JSON column of run `run_id` (NULL reads as {})."""
        try:
            return json.loads(text) if text is not None else {}
        except ValueError as error:
            raise HistoryError(
                f"run {run_id} in history {self.path} is damaged ({one_line(error)}); restore the "
                "file from a backup or pass another path with --db",
                EXIT_BAD_FILE,
            ) from error

    def runs(
        self, limit: int | None = None, *, name_contains: str | None = None, tagged: str | None = None
    ) -> list[RunRow]:
        """Runs, oldest first: those whose name contains `name_contains` (in any case) when given, those tagged
        `tagged` (exactly) when given, the last `limit` of them when given."""
        rows = self._selected(self._run_columns, limit, name_contains, tagged)
        tags, searches = self._tags_and_searches()
        return [self._row(row, tags, searches) for row in reversed(rows)]

    def _selected(
        self, columns: str, limit: int | None, name_contains: str | None, tagged: str | None
    ) -> list[sqlite3.Row]:
        """`columns` of the runs `runs` lists, newest first."""
        query = f"SELECT {columns} FROM runs"
        parameters: tuple[Any, ...] = ()
        if tagged is not None:
            if not self.keeps_tags:
                return []
            query += " WHERE id IN (SELECT run_id FROM run_tags WHERE tag = ?)"
            parameters = (tagged,)
        query += " ORDER BY id DESC"
        if limit is not None and name_contains is None:
            query += " LIMIT ?"
            parameters = (*parameters, limit)
        rows = self._fetch(query, parameters)
        if name_contains is not None:  # in Python: SQLite's lower() and LIKE fold ASCII letters only
            needle = name_contains.casefold()
            rows = [row for row in rows if row["name"] is not None and needle in row["name"].casefold()][:limit]
        return rows

    def run(self, run_id: int) -> RunRow | None:
        rows = self._fetch(f"SELECT {self._run_columns} FROM runs WHERE id = ?", (run_id,))
        return self._row(rows[0], *self._tags_and_searches(run_id)) if rows else None

    def _tags_and_searches(self, run_id: int | None = None) -> tuple[dict[int, tuple[str, ...]], dict[int, SearchRef]]:
        """Every run's tags (run `run_id`'s only, when given) and every search, by id (none before schema 4)."""
        if not self.keeps_tags:
            return {}, {}
        tags: dict[int, list[str]] = {}
        query = "SELECT run_id, tag FROM run_tags"
        parameters: tuple[int, ...] = ()
        if run_id is not None:
            query, parameters = query + " WHERE run_id = ?", (run_id,)
        for tagged_id, tag in self._fetch(query + " ORDER BY tag", parameters):
            tags.setdefault(tagged_id, []).append(tag)
        searches = {
            row["id"]: SearchRef(row["id"], row["kind"], row["name"], row["created_at"])
            for row in self._fetch("SELECT id, kind, name, created_at FROM searches")
        }
        return {run_id: tuple(found) for run_id, found in tags.items()}, searches

    def search_trials(self, search_id: int) -> list[int]:
        """The ids of search `search_id`'s trials, oldest first (none: no such search)."""
        if not self.keeps_tags:
            return []
        rows = self._fetch("SELECT id FROM runs WHERE search_id = ? ORDER BY id", (search_id,))
        return [run_id for (run_id,) in rows]

    def tag_runs(self, run_ids: Iterable[int], tag: str, *, tagged: bool = True) -> int:
        """Give the runs `run_ids` the tag `tag` (`tagged` False: take it away); how many runs changed. Ids of runs
        that are not there are passed over. A busy or full history raises HistoryWriteError, nothing written."""
        changed = 0
        with self._write("the runs' tags") as db:
            for ids, marks in id_chunks(list(dict.fromkeys(run_ids))):
                if tagged:
                    cursor = db.execute(
                        f"INSERT OR IGNORE INTO run_tags (run_id, tag) SELECT id, ? FROM runs WHERE id IN ({marks})",
                        (tag, *ids),
                    )
                else:
                    cursor = db.execute(f"DELETE FROM run_tags WHERE tag = ? AND run_id IN ({marks})", (tag, *ids))
                changed += cursor.rowcount
        return changed

    def in_progress(self, run_ids: Iterable[int]) -> list[int]:
        """Those of `run_ids` that another process is recording now (`running`, their recorder alive)."""
        busy = []
        for ids, marks in id_chunks(list(run_ids)):
            query = f"SELECT {self._run_columns} FROM runs WHERE status = 'running' AND id IN ({marks})"
            busy += [row["id"] for row in self._fetch(query, ids) if not self._gone(row)]
        return busy

    def delete_runs(self, run_ids: Iterable[int]) -> Deleted:
        """Delete the runs `run_ids` with their steps, samples and tags, in one transaction (an interrupted delete
        deletes nothing; any number of runs, `id_chunks` a statement), and a search left without trials; then the log
        files gpuanat wrote for them under its own log folder (`own_log_path`). A run another process records now is
        refused (RunInProgress, nothing deleted); ids not there are passed over. A busy or full history raises
        HistoryWriteError, nothing deleted."""
        ids = list(dict.fromkeys(run_ids))
        with self._write(f"the deletion of {len(ids)} runs") as db:
            rows = [
                row
                for chunk, marks in id_chunks(ids)
                for row in db.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE id IN ({marks})", chunk).fetchall()
            ]
            rows.sort(key=lambda row: row["id"])
            busy = [row["id"] for row in rows if row["status"] in ACTIVE_STATUSES and not self._gone(row)]
            if busy:
                raise RunInProgress(busy)
            found = [row["id"] for row in rows]
            logs = [own_log_path(self.path, row["id"], row["log_path"]) for row in rows]
            for chunk, marks in id_chunks(found):
                for table, column in (
                    ("steps", "run_id"),
                    ("samples", "run_id"),
                    ("run_tags", "run_id"),
                    ("runs", "id"),
                ):
                    db.execute(f"DELETE FROM {table} WHERE {column} IN ({marks})", chunk)
            db.execute("DELETE FROM searches WHERE NOT EXISTS (SELECT 1 FROM runs WHERE runs.search_id = searches.id)")
        removed = []
        for log in logs:
            if log is not None:
                with suppress(FileNotFoundError):
                    log.unlink()
                    removed.append(str(log))
        return Deleted(tuple(found), tuple(removed))

    def steps(self, run_id: int) -> list[dict[str, Any]]:
        rows = self._fetch("SELECT record_json FROM steps WHERE run_id = ? ORDER BY step", (run_id,))
        return [self._json(record, run_id) for (record,) in rows]

    def samples(self, run_id: int) -> list[dict[str, Any]]:
        rows = self._fetch("SELECT sample_json FROM samples WHERE run_id = ? ORDER BY t_s", (run_id,))
        return [self._json(sample, run_id) for (sample,) in rows]

    def recorded_rows(self, table: str, run_id: int, low: float, high: float) -> list[tuple[int, str]]:
        """(rowid, JSON) of the run's `samples` (by t_s) or `steps` (by step) with low <= key < high, in order: what
        the recorder's thinning reads (`sample_thinning`)."""
        key, column = {"samples": ("t_s", "sample_json"), "steps": ("step", "record_json")}[table]
        sql = f"SELECT rowid, {column} FROM {table} WHERE run_id = ? AND {key} >= ? AND {key} < ? ORDER BY {key}"
        return [(rowid, text) for rowid, text in self._fetch(sql, (run_id, low, high))]

    def delete_recorded_rows(self, table: str, run_id: int, rowids: Iterable[int]) -> None:
        """Delete rows of the run's `samples` or `steps` by rowid (the thinning's), in one transaction."""
        assert table in ("samples", "steps")
        with self._write(f"the thinning of {table}") as db:
            db.executemany(f"DELETE FROM {table} WHERE rowid = ? AND run_id = ?", [(row, run_id) for row in rowids])


def check_usable_history(path: Path, *, writes: bool, named: bool) -> None:
    """Raise `HistoryError` (exit code 2) when `path` cannot be used as the history, before a command starts anything
    (a dashboard, a training run) that would meet the problem only later: a file or directory that is not a gpuanat
    history (`HistoryFile`'s checks), and for a command that `writes`, one it cannot write. A missing file is fine (a
    read reads it as empty, a write creates it) when its folder exists, or when the path was not `named` by the user
    (the default one's folders are created). A history that is only busy, or failing for now, is left to the
    command, which waits for it or reports it."""
    if not os.path.lexists(path):
        folder = path.parent
        if named and not folder.is_dir():
            raise HistoryError(
                f"history {path}: the folder {folder} does not exist; create it (mkdir -p {folder}) or pass "
                "another path with --db",
                EXIT_BAD_FILE,
            )
        if writes and folder.is_dir() and not os.access(folder, os.W_OK | os.X_OK):
            raise HistoryError(
                f"history {path} cannot be created: the folder {folder} is not writable; pass another path with --db",
                EXIT_BAD_FILE,
            )
        return
    try:
        HistoryFile(path, read_only=not writes).close()
    except HistoryError as error:
        if error.exit_code == EXIT_BAD_FILE:
            raise
