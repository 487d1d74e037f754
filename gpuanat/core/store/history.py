"""SQLite history of runs and their time series, kept the way a database people trust keeps it.

One row per run (config, environment, status, result) plus its step records and NVML samples. Rows are
written while the run streams, so a crash of the child — or of gpuanat — never loses what was recorded.
Location: --db PATH, else GPUANAT_DB, else $XDG_DATA_HOME/gpuanat/history.sqlite.

What it guarantees:
- **One typed line per failure.** Every SQLite or OS error becomes a `HistoryError` whose message says what to
  do and whose `exit_code` is 2 when the user must fix the path or file (missing directory, not a gpuanat
  history, damaged, read-only for a writing command) and 1 for a fault. A write that failed because the history
  was busy (locked longer than WRITE_BUSY_TIMEOUT_S), full (SQLITE_FULL, ENOSPC) or failing I/O raises
  `HistoryWriteError`: nothing of that write was stored, the connection is rolled back and usable, and the same
  write can be retried (the run session keeps its records and retries on its next flush; `write_with_backoff`
  retries a final write until a deadline).
- **Read-only opens never write.** `HistoryStore(path, read_only=True)` creates no file or directory (a missing
  history reads as empty), changes no journal mode, user_version or schema, and leaves the database, its -wal and
  its -shm byte-identical. It reads a read-only file, a read-only directory and a history on a full disk:
  SQLite's `mode=ro`, with `readonly_shm=1` when a writer's -wal and -shm exist (SQLite reads the WAL without
  touching the -shm) and `immutable=1` when there is no -wal to read (each read is then checked against the
  file's mtime, size and inode and repeated through the WAL if a writer started meanwhile).
- **Only our files.** A history gpuanat creates carries `PRAGMA application_id` APPLICATION_ID ('GANT') and
  `user_version` SCHEMA_VERSION. An existing file is used only if it carries our application_id, or is a
  version-1 history of an earlier gpuanat (application_id 0, user_version 1, exactly the tables runs, steps and
  samples with their columns), which a writable open upgrades to version 2 in one transaction. Anything else —
  another application's SQLite file, a truncated or damaged file, random bytes, a directory, a symbolic link, an
  empty file — is refused with exit code 2 and left untouched. An empty file is never ours: gpuanat builds a new
  history beside its path and links it in whole, so no crash leaves an empty or half-made file at the path.
- **Private.** Directories it creates are 0700 and the files 0600 (the -wal and -shm too), whatever the umask;
  the modes of existing files and directories are left alone.
- **An interrupted run is finalised once.** Each run stores its recorder's PID and start time. A writable open
  finalises every `running` run whose recorder is gone (no such PID, or the PID now belongs to a process started
  at another time): status `interrupted`, `finished_at` the time of its last recorded write, and a result rebuilt
  from its steps (`result_from_steps`) under what it had stored. Reads show such a row the same way, unwritten.
"""

from __future__ import annotations

import errno
import json
import os
import sqlite3
import stat
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

import psutil

DB_ENV = "GPUANAT_DB"
SCHEMA_VERSION = 2
"""PRAGMA user_version. 1: the first schema (its files carry no application_id); 2: runs also keep their
recorder's start time and the time of their last recorded write, to finalise runs whose recorder is gone."""
APPLICATION_ID = int.from_bytes(b"GANT", "big")
"""PRAGMA application_id of every history gpuanat creates (0x47414E54, ASCII 'GANT')."""
ACTIVE_STATUSES = ("running",)
WRITE_BUSY_TIMEOUT_S = 2.0
"""How long a write waits for another process's lock before it raises HistoryWriteError: short, so a run never
stalls on its history; the caller keeps the records and the next flush retries."""
READ_BUSY_TIMEOUT_S = 5.0
"""How long a read waits for a lock: only a history in rollback-journal mode blocks readers, while a writer commits."""
BACKOFF_FIRST_DELAY_S = 0.1
BACKOFF_MAX_DELAY_S = 2.0
"""write_with_backoff waits 0.1 s after the first failure, doubling up to 2 s between attempts."""
RECORDER_START_TOLERANCE_S = 1.0
"""Two readings of one process's start time agree within this (psutil derives it from the boot time and clock
ticks, both read from /proc); a PID reused by another process belongs to one that started later than that."""
IMMUTABLE_READ_ATTEMPTS = 3
"""How often a read through immutable=1 is tried when writers keep changing the file meanwhile."""
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
EXIT_BAD_FILE = 2
"""HistoryError.exit_code when the user must fix the path or the file."""
EXIT_FAULT = 1
"""HistoryError.exit_code of a fault: busy, full, I/O."""

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
    recorder_pid INTEGER,
    recorder_started_at REAL,
    last_recorded_at REAL
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
"""Schema version 2. `recorder_started_at`: the recorder's process start time (Unix time, psutil);
`last_recorded_at`: Unix time of the last write of steps or samples, the end of a run whose recorder died."""

MIGRATION_FROM_1 = (
    "ALTER TABLE runs ADD COLUMN recorder_started_at REAL",
    "ALTER TABLE runs ADD COLUMN last_recorded_at REAL",
)
V1_TABLES = {
    "runs": ("id", "kind", "name", "status", "created_at", "finished_at", "config_json", "environment_json",
             "result_json", "log_path", "recorder_pid"),
    "steps": ("run_id", "step", "elapsed_s", "record_json"),
    "samples": ("run_id", "t_s", "sample_json"),
}
"""The tables of a version-1 history, which carries no application_id: a file must have exactly these."""
V1_INDEXES = {"steps_by_run", "samples_by_run"}
_PATH_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.ELOOP, errno.EISDIR, errno.ENAMETOOLONG,
                errno.EROFS}
"""OS errors the user fixes by choosing another path (exit code 2)."""
SQLITE_MAGIC = b"SQLite format 3\x00"
SQLITE_HEADER_BYTES = 100


def default_db_path() -> Path:
    """GPUANAT_DB, else the XDG data directory."""
    if os.environ.get(DB_ENV):
        return Path(os.environ[DB_ENV]).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "gpuanat" / "history.sqlite"


class HistoryError(Exception):
    """The history cannot be used: one line that says what to do. `exit_code` is EXIT_BAD_FILE (2) when the user
    must fix the path or the file, EXIT_FAULT (1) for a fault."""

    def __init__(self, message: str, exit_code: int = EXIT_FAULT) -> None:
        super().__init__(" ".join(message.split()))
        self.exit_code = exit_code


class HistoryWriteError(HistoryError):
    """A write that failed because the history was busy (locked), full or failing I/O. Nothing of it was stored
    and the store stays usable: the same write can be retried, by the next flush or `write_with_backoff`."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message, EXIT_FAULT)
        self.reason = reason
        """"busy", "full", "io" or "read-only" (the file or its file system stopped accepting writes)."""


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


def process_started_at(pid: int) -> float | None:
    """The Unix time the process started (psutil), None when there is no such process or it is a zombie."""
    try:
        process = psutil.Process(pid)
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process.create_time()
    except psutil.NoSuchProcess:
        return None


def recorder_alive(pid: int | None, started_at: float | None, *, created_at: float) -> bool:
    """Whether the process that recorded a run still runs: its PID exists and belongs to a process started at
    `started_at`. Rows of schema version 1 have no start time: there the process must have started before the run
    was created (`created_at`), so a PID reused since reads as gone too."""
    if not pid:
        return False
    try:
        started = process_started_at(pid)
    except psutil.AccessDenied:
        return True
    if started is None:
        return False
    if started_at is None:
        return started <= created_at + RECORDER_START_TOLERANCE_S
    return abs(started - started_at) <= RECORDER_START_TOLERANCE_S


def result_from_steps(config: Mapping[str, Any], steps: Sequence[Mapping[str, Any]], *, run_id: int | None = None,
                      recorder_pid: int | None = None) -> dict[str, Any]:
    """The result of a run whose recorder stopped before it finished, rebuilt from its step records (in order)."""
    last = steps[-1] if steps else {}
    elapsed_s, samples = last.get("elapsed_s"), last.get("samples")
    losses = [step["loss"] for step in steps if step.get("loss") is not None]
    allocated = [value for step in steps
                 if (value := step.get("peak_allocated_bytes") or step.get("allocated_bytes")) is not None]
    reserved = [step["reserved_bytes"] for step in steps if step.get("reserved_bytes") is not None]
    with_bands = [step["bands"] for step in steps if step.get("bands")]
    recorder = f"the recorder (PID {recorder_pid})" if recorder_pid else "the recorder"
    counted = f"{len(steps)} recorded step" + ("" if len(steps) == 1 else "s")
    return {
        "run_id": run_id,
        "status": "interrupted",
        "config": dict(config),
        "steps": last.get("step", 0),
        "samples": samples or 0,
        "train_runtime_s": elapsed_s,
        "samples_per_second": samples / elapsed_s if samples is not None and elapsed_s else None,
        "train_loss": losses[-1] if losses else None,
        "peak_allocated_bytes": max(allocated) if allocated else None,
        "peak_reserved_bytes": max(reserved) if reserved else None,
        "bands": with_bands[-1] if with_bands else None,
        "error": {"kind": "interrupted",
                  "message": f"{recorder} stopped before the run finished; this result was rebuilt from its {counted}"},
    }


def interrupted_result(stored: Mapping[str, Any], rebuilt: Mapping[str, Any]) -> dict[str, Any]:
    """What a partial result already stored says wins over the rebuilt one (its None values do not), except the
    status."""
    return {**rebuilt, **{key: value for key, value in stored.items() if value is not None}, "status": "interrupted"}


T = TypeVar("T")


def write_with_backoff(write: Callable[[], T], *, deadline_s: float, first_delay_s: float = BACKOFF_FIRST_DELAY_S,
                       max_delay_s: float = BACKOFF_MAX_DELAY_S, clock: Callable[[], float] = time.monotonic,
                       sleep: Callable[[float], None] = time.sleep) -> T:
    """`write()`, retried while it raises HistoryWriteError, waiting `first_delay_s` then doubling up to
    `max_delay_s`, for `deadline_s` seconds from now; after that the last HistoryWriteError is raised. Any other
    error is raised at once. An attempt itself may wait WRITE_BUSY_TIMEOUT_S for a lock, so the last one can end up
    to that much after the deadline. For the final write of a run: `write_with_backoff(lambda:
    store.update_result(run_id, result, status=status), deadline_s=30)`."""
    give_up_at = clock() + deadline_s
    delay_s = first_delay_s
    while True:
        try:
            return write()
        except HistoryWriteError:
            left_s = give_up_at - clock()
            if left_s <= 0:
                raise
            sleep(min(delay_s, left_s))
            delay_s = min(delay_s * 2, max_delay_s)


@dataclass(frozen=True)
class _Header:
    """What the first 100 bytes of an SQLite file say (https://sqlite.org/fileformat.html#the_database_header)."""

    wal: bool
    user_version: int
    application_id: int


def _sqlite_code(error: sqlite3.Error) -> int | None:
    code = getattr(error, "sqlite_errorcode", None)
    return None if code is None else code & 0xFF


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split()) or type(error).__name__


def _fault_reason(error: BaseException) -> str | None:
    """busy / full / io / read-only for an error a retried write may get past, else None."""
    if isinstance(error, sqlite3.Error):
        return {sqlite3.SQLITE_BUSY: "busy", sqlite3.SQLITE_LOCKED: "busy", sqlite3.SQLITE_FULL: "full",
                sqlite3.SQLITE_IOERR: "io", sqlite3.SQLITE_READONLY: "read-only"}.get(_sqlite_code(error) or -1)
    if isinstance(error, OSError):
        return {errno.ENOSPC: "full", errno.EDQUOT: "full", errno.EIO: "io"}.get(
            error.errno or -1)
    return None


def _companion(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def _make_private_dirs(directory: Path) -> None:
    """Create `directory` and its missing parents 0700 (XDG's rule for data directories), whatever the umask."""
    missing = []
    while not os.path.lexists(directory) and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for created in reversed(missing):
        try:
            os.mkdir(created, PRIVATE_DIR_MODE)
        except FileExistsError:
            continue  # another process made it meanwhile: not ours to chmod
        os.chmod(created, PRIVATE_DIR_MODE)


def _uri(path: Path, parameters: str) -> str:
    return f"file:{quote(str(path.absolute()))}?{parameters}"


class HistoryStore:
    """The run history. Safe to open from several processes (WAL); one instance per thread.

    `read_only=True` for commands that only read: see the module docstring for what that guarantees.
    """

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._immutable_state: tuple[int, ...] | None = None
        """The file's state when read through immutable=1 (reads check it did not change); None otherwise."""
        self._run_columns = _RUN_COLUMNS
        if read_only:
            self._db = self._open_read_only()
        else:
            self._db = self._open_writable()
            try:
                self._migrate()
                self._finalise_quietly()
            except BaseException:
                self._db.close()
                raise

    # --- opening --------------------------------------------------------------------------------------------

    def _lstat(self) -> os.stat_result | None:
        """The path's own status (None: nothing there); refuses links, directories and anything not a file."""
        try:
            status = os.lstat(self.path)
        except FileNotFoundError:
            return None
        except OSError as error:
            raise self._error(error, "open") from error
        if stat.S_ISLNK(status.st_mode):
            raise HistoryError(f"history {self.path} is a symbolic link; gpuanat only uses a history at its real "
                               "path — pass that path with --db", EXIT_BAD_FILE)
        if stat.S_ISDIR(status.st_mode):
            raise HistoryError(f"history {self.path} is a directory; pass a file path with --db, e.g. "
                               f"{self.path / 'history.sqlite'}", EXIT_BAD_FILE)
        if not stat.S_ISREG(status.st_mode):
            raise HistoryError(f"history {self.path} is not a regular file; pass a file path with --db", EXIT_BAD_FILE)
        return status

    def _not_ours(self, what: str) -> HistoryError:
        return HistoryError(f"{self.path} is not a gpuanat history ({what}); gpuanat leaves it untouched — pass "
                            "another path with --db", EXIT_BAD_FILE)

    def _read_header(self, size: int) -> _Header:
        if size == 0:
            raise self._not_ours("an empty file: gpuanat never leaves one, so another program made it")
        try:
            descriptor = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            try:
                header = os.read(descriptor, SQLITE_HEADER_BYTES)
            finally:
                os.close(descriptor)
        except OSError as error:
            raise self._error(error, "open") from error
        if len(header) < SQLITE_HEADER_BYTES or not header.startswith(SQLITE_MAGIC):
            raise self._not_ours("not an SQLite database")
        page_size = int.from_bytes(header[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        # A file cut inside a page is caught here; one cut at a page boundary, by SQLite (SQLITE_CORRUPT) on read.
        if page_size < 512 or page_size & (page_size - 1) or size % page_size:
            raise HistoryError(f"{self.path} is truncated or damaged ({size} bytes, pages of {page_size}); gpuanat "
                               "leaves it untouched — restore it from a backup or pass another path with --db",
                               EXIT_BAD_FILE)
        header_ = _Header(wal=header[18] == 2 or header[19] == 2, user_version=int.from_bytes(header[60:64], "big"),
                          application_id=int.from_bytes(header[68:72], "big"))
        if header_.application_id not in (0, APPLICATION_ID):
            raise self._not_ours(f"another application's SQLite database, application_id {header_.application_id:#x}")
        if header_.application_id == 0 and header_.user_version not in (0, 1):
            raise self._not_ours(f"another application's SQLite database, user_version {header_.user_version}")
        return header_

    def _open_read_only(self) -> sqlite3.Connection:
        status = self._lstat()
        if status is None:
            return self._empty_history()
        header = self._read_header(status.st_size)
        db = self._connect_read_only(header)
        try:
            self._check_identity(db, writable=False)
            self._run_columns = self._columns_present(db)
        except BaseException:
            db.close()
            raise
        return db

    def _empty_history(self) -> sqlite3.Connection:
        """A missing history reads as one without runs, in memory: nothing is created."""
        db = sqlite3.connect(":memory:", isolation_level=None)
        db.row_factory = sqlite3.Row
        db.executescript(SCHEMA)
        return db

    def _file_state(self) -> tuple[int, ...]:
        """What changes when a writer touches the history: the file's mtime, size and inode, and its -wal's size."""
        try:
            status = os.stat(self.path)
            wal = _companion(self.path, "-wal")
            wal_size = os.stat(wal).st_size if os.path.exists(wal) else -1
        except OSError as error:
            raise self._error(error, "read") from error
        return (status.st_mtime_ns, status.st_size, status.st_ino, wal_size)

    def _connect_read_only(self, header: _Header) -> sqlite3.Connection:
        """A connection that cannot write, and that creates no -wal or -shm (see the module docstring)."""
        self._immutable_state = None
        wal, shm = _companion(self.path, "-wal"), _companion(self.path, "-shm")
        if not header.wal:
            parameters = "mode=ro"  # rollback journal: readers only take locks on the file itself
        elif os.path.exists(wal) and os.path.exists(shm):
            parameters = "mode=ro&readonly_shm=1"  # SQLite reads the WAL through the -shm without writing it
        elif os.path.exists(wal) and os.path.getsize(wal) > 0:
            parameters = "mode=ro"  # a WAL without its -shm: SQLite must rebuild the -shm to read it
        else:
            parameters = "mode=ro&immutable=1"  # no WAL to read: the file is the whole history
            self._immutable_state = self._file_state()
        try:
            db = sqlite3.connect(_uri(self.path, parameters), uri=True, timeout=READ_BUSY_TIMEOUT_S,
                                 isolation_level=None)
        except sqlite3.Error as error:
            raise self._error(error, "open") from error
        db.row_factory = sqlite3.Row
        return db

    def _columns_present(self, db: sqlite3.Connection) -> str:
        """The runs columns to select: NULL for the version-2 columns a version-1 file lacks."""
        present = {name for (name,) in self._execute(db, "SELECT name FROM pragma_table_info('runs')")}
        return ", ".join(column if column in present else f"NULL AS {column}" for column in _RUN_COLUMNS.split(", "))

    def _open_writable(self) -> sqlite3.Connection:
        status = self._lstat()
        if status is None:
            self._create()
            status = self._lstat()
            if status is None:
                raise HistoryError(f"history {self.path} vanished while it was being created; try again")
        header = self._read_header(status.st_size)
        if header.application_id != APPLICATION_ID:  # perhaps an earlier gpuanat's: check it without writing
            inspected = self._connect_read_only(header)
            try:
                self._check_identity(inspected, writable=True)
            finally:
                inspected.close()
                self._immutable_state = None
        for checked in (self.path, self.path.parent):
            if not os.access(checked, os.W_OK):
                raise HistoryError(f"history {self.path} is read-only ({checked} is not writable); make it writable "
                                   "or pass another path with --db (`gpuanat history` reads it as it is)",
                                   EXIT_BAD_FILE)
        try:
            db = sqlite3.connect(_uri(self.path, "mode=rw"), uri=True, timeout=WRITE_BUSY_TIMEOUT_S,
                                 isolation_level=None)
        except sqlite3.Error as error:
            raise self._error(error, "open") from error
        db.row_factory = sqlite3.Row
        try:
            self._check_identity(db, writable=True)
            self._execute(db, "PRAGMA foreign_keys=ON")
        except BaseException:
            db.close()
            raise
        self._private_companions()
        return db

    def _create(self) -> None:
        """A new, empty history: built beside the path (0600, whatever the umask) and linked in whole, so the path
        never names a half-made file. If another process linked one first, that one is used."""
        try:
            _make_private_dirs(self.path.parent)
            descriptor, staging_name = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".new",
                                                        dir=self.path.parent)
        except OSError as error:
            raise self._error(error, "create", writing=True) from error
        staging = Path(staging_name)
        try:
            os.fchmod(descriptor, PRIVATE_FILE_MODE)
            os.close(descriptor)
            db = sqlite3.connect(staging, isolation_level=None)
            try:
                # Rollback journal first: the schema and the header land in the file itself, then WAL is switched on
                # with an empty log, so closing leaves a complete file and no -wal.
                db.execute("BEGIN IMMEDIATE")
                db.execute(f"PRAGMA application_id={APPLICATION_ID}")
                for statement in SCHEMA.split(";"):
                    if statement.strip():
                        db.execute(statement)
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                db.execute("COMMIT")
                db.execute("PRAGMA journal_mode=WAL")
            finally:
                db.close()
            try:
                os.link(staging, self.path)
            except FileExistsError:
                pass  # another gpuanat created it meanwhile: use that one
            except OSError as error:
                if error.errno not in (errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EMLINK):
                    raise
                if not os.path.lexists(self.path):  # a file system without hard links
                    os.rename(staging, self.path)
        except (sqlite3.Error, OSError) as error:
            raise self._error(error, "create", writing=True) from error
        finally:
            with suppress(FileNotFoundError):
                os.unlink(staging)
            with suppress(FileNotFoundError):
                os.unlink(_companion(staging, "-journal"))

    def _check_identity(self, db: sqlite3.Connection, *, writable: bool) -> None:
        """Refuse a file that is not a gpuanat history (see the module docstring), or that a newer gpuanat made
        when writing."""
        application_id = self._execute(db, "PRAGMA application_id")[0][0]
        version = self._execute(db, "PRAGMA user_version")[0][0]
        if application_id == APPLICATION_ID:
            if writable and version > SCHEMA_VERSION:
                raise HistoryError(f"history {self.path} was written by a newer gpuanat (schema {version}, this one "
                                   f"knows {SCHEMA_VERSION}); update gpuanat or pass another path with --db",
                                   EXIT_BAD_FILE)
            return
        objects = self._execute(db, "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'")
        tables = {name: tuple(column for (column,) in self._execute(
                      db, "SELECT name FROM pragma_table_info(?)", (name,)))
                  for kind, name in objects if kind == "table"}
        others = {name for kind, name in objects if kind != "table" and not (kind == "index" and name in V1_INDEXES)}
        if application_id == 0 and version == 1 and tables == V1_TABLES and not others:
            return
        found = ", ".join(sorted(tables)) or "none"
        raise self._not_ours(f"application_id {application_id:#x}, user_version {version}, tables: {found}")

    def _migrate(self) -> None:
        """Upgrade a version-1 history to version 2 in one transaction (another process may have done it first)."""
        version = self._execute(self._db, "PRAGMA user_version")[0][0]
        if version >= SCHEMA_VERSION and self._execute(self._db, "PRAGMA application_id")[0][0] == APPLICATION_ID:
            return
        with self._write("the upgrade of its schema to version 2") as db:
            if db.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                for statement in MIGRATION_FROM_1:
                    db.execute(statement)
                db.execute(f"PRAGMA application_id={APPLICATION_ID}")
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def _finalise_quietly(self) -> None:
        """Finalisation on open must not stop a run from starting: a busy or full history is finalised by a later
        open."""
        with suppress(HistoryWriteError):
            self.finalise_interrupted()

    def close(self) -> None:
        try:
            self._db.close()
        except sqlite3.Error as error:
            raise self._error(error, "close") from error

    def _private_companions(self) -> None:
        """SQLite gives the -wal and -shm it creates the database's mode; make sure of it for a private history
        (0600), whatever the umask. Those of a history with another mode are left as they are."""
        with suppress(OSError):
            if stat.S_IMODE(os.stat(self.path).st_mode) == PRIVATE_FILE_MODE:
                for suffix in ("-wal", "-shm"):
                    companion = _companion(self.path, suffix)
                    if os.path.exists(companion) and stat.S_IMODE(os.stat(companion).st_mode) != PRIVATE_FILE_MODE:
                        os.chmod(companion, PRIVATE_FILE_MODE)

    def __enter__(self) -> HistoryStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- errors -----------------------------------------------------------------------------------------------

    def _error(self, error: BaseException, doing: str, *, writing: bool = False) -> HistoryError:
        """The HistoryError for an SQLite or OS error met while `doing` ("open", "read", "save … to"). A fault a
        retry may get past (busy, full, I/O) is a HistoryWriteError when `writing` or on a writable store."""
        detail = _one_line(error)
        code = _sqlite_code(error) if isinstance(error, sqlite3.Error) else None
        if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            return HistoryError(f"{self.path} is damaged or not a database ({detail}); gpuanat leaves it untouched — "
                                "restore it from a backup or pass another path with --db", EXIT_BAD_FILE)
        if code in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH) or (
                isinstance(error, OSError) and error.errno in _PATH_ERRNOS):
            return HistoryError(f"cannot {doing} history {self.path} ({detail}); check the path and its permissions, "
                                "or pass another with --db", EXIT_BAD_FILE)
        reason = _fault_reason(error)
        if reason == "busy":
            waited_s = READ_BUSY_TIMEOUT_S if self.read_only else WRITE_BUSY_TIMEOUT_S
            message = (f"cannot {doing} history {self.path}: another process held its lock for more than {waited_s:g} "
                       f"s; try again when it is done (`fuser {self.path}` names it)")
        elif reason == "full":
            message = (f"cannot {doing} history {self.path}: the disk or the database is full ({detail}); free space "
                       "there and try again")
        elif reason is not None:
            message = f"cannot {doing} history {self.path}: {detail}; check the disk and its file system"
        else:
            return HistoryError(f"cannot {doing} history {self.path}: {detail}")
        if writing or not self.read_only:
            return HistoryWriteError(message, reason)
        return HistoryError(message)

    # --- reading and writing ----------------------------------------------------------------------------------

    def _execute(self, db: sqlite3.Connection, sql: str, parameters: Sequence[Any] = ()) -> list[sqlite3.Row]:
        try:
            return db.execute(sql, parameters).fetchall()
        except sqlite3.Error as error:
            raise self._error(error, "read") from error

    def _fetch(self, sql: str, parameters: Sequence[Any] = ()) -> list[sqlite3.Row]:
        """Rows of a read. Through immutable=1, a read during which a writer changed the file is read again, through
        the writer's WAL."""
        for _ in range(IMMUTABLE_READ_ATTEMPTS):
            before = self._immutable_state
            try:
                rows = self._db.execute(sql, parameters).fetchall()
            except sqlite3.Error as error:
                if before is None or self._file_state() == before:
                    raise self._error(error, "read") from error
            else:
                if before is None or self._file_state() == before:
                    return rows
            self._reopen_read_only()
        raise HistoryError(f"history {self.path} kept changing while it was read; try again")

    def _reopen_read_only(self) -> None:
        self._db.close()
        self._db = self._open_read_only()

    @contextmanager
    def _write(self, what: str) -> Iterator[sqlite3.Connection]:
        """One transaction, taken at once (BEGIN IMMEDIATE, waiting WRITE_BUSY_TIMEOUT_S for the lock); any failure
        rolls it back, so the connection stays usable and the write can be retried."""
        if self.read_only:
            raise HistoryError(f"history {self.path} was opened read-only; {what} cannot be saved")
        try:
            self._db.execute("BEGIN IMMEDIATE")
            yield self._db
            self._db.execute("COMMIT")
        except (sqlite3.Error, OSError) as error:
            self._rollback()
            raise self._error(error, f"save {what} to", writing=True) from error
        except BaseException:
            self._rollback()
            raise

    def _rollback(self) -> None:
        if self._db.in_transaction:
            with suppress(sqlite3.Error):  # the error that made us roll back is the one to report
                self._db.execute("ROLLBACK")

    def create_run(self, config: Mapping[str, Any], *, kind: str = "launched", name: str | None = None,
                   created_at: float | None = None) -> int:
        """A new run, `running` until `update_result` gives it a final status; `created_at` (Unix time)
        defaults to now and is set when importing runs recorded elsewhere. The recorder is this process."""
        config_json = json.dumps(dict(config))
        recorder_started_at = process_started_at(os.getpid())
        with self._write("the new run") as db:
            cursor = db.execute(
                "INSERT INTO runs (kind, name, status, created_at, config_json, recorder_pid, recorder_started_at)"
                " VALUES (?, ?, 'running', ?, ?, ?, ?)",
                (kind, name, time.time() if created_at is None else created_at, config_json, os.getpid(),
                 recorder_started_at),
            )
            assert cursor.lastrowid is not None
            return cursor.lastrowid

    def set_log_path(self, run_id: int, log_path: Path) -> None:
        with self._write("the run's log path") as db:
            db.execute("UPDATE runs SET log_path = ? WHERE id = ?", (str(log_path), run_id))

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

    def update_result(self, run_id: int, result: Mapping[str, Any], *, status: str | None = None) -> None:
        """Store the run's result so far; `status` other than running also marks it finished."""
        result_json = json.dumps(dict(result))
        with self._write("the run's result") as db:
            db.execute("UPDATE runs SET result_json = ? WHERE id = ?", (result_json, run_id))
            if status is not None:
                finished_at = None if status in ACTIVE_STATUSES else time.time()
                db.execute("UPDATE runs SET status = ?, finished_at = ? WHERE id = ?", (status, finished_at, run_id))

    def finalise_interrupted(self, *, now: Callable[[], float] = time.time) -> list[int]:
        """Finalise, once, every `running` run whose recorder is gone (`recorder_alive`): status `interrupted`,
        `finished_at` the time of its last recorded write (else `now()`), and a result rebuilt from its steps under
        what it had stored (`result_from_steps`, `interrupted_result`). Returns their ids. Runs on every writable
        open; raises HistoryWriteError when the history is busy or full (nothing changed then)."""
        query = f"SELECT {_RUN_COLUMNS} FROM runs WHERE status = 'running'"
        if not any(self._gone(row) for row in self._fetch(query)):
            return []
        finalised = []
        with self._write("the final state of interrupted runs") as db:
            for row in db.execute(query).fetchall():  # read again in the transaction: another process may be first
                if not self._gone(row):
                    continue
                run_id = row["id"]
                result = self._interrupted_result(row)
                finished_at = (row["last_recorded_at"] or self._estimated_last_record(run_id, row["created_at"])
                               or now())
                db.execute("UPDATE runs SET status = 'interrupted', finished_at = ?, result_json = ?"
                           " WHERE id = ? AND status = 'running'", (finished_at, json.dumps(result), run_id))
                finalised.append(run_id)
        return finalised

    def _estimated_last_record(self, run_id: int, created_at: float) -> float | None:
        """For a run of schema version 1 (no last_recorded_at): the creation time plus how long it recorded, by its
        last step's training time or the span of its samples (a monotonic clock), whichever is longer."""
        ((elapsed_s, first_t_s, last_t_s),) = self._db.execute(
            "SELECT (SELECT max(elapsed_s) FROM steps WHERE run_id = ?),"
            " (SELECT min(t_s) FROM samples WHERE run_id = ?), (SELECT max(t_s) FROM samples WHERE run_id = ?)",
            (run_id, run_id, run_id)).fetchall()
        spans = [span for span in (elapsed_s, last_t_s - first_t_s if first_t_s is not None else None)
                 if span is not None]
        return created_at + max(spans) if spans else None

    @staticmethod
    def _gone(row: sqlite3.Row) -> bool:
        return row["status"] in ACTIVE_STATUSES and not recorder_alive(
            row["recorder_pid"], row["recorder_started_at"], created_at=row["created_at"])

    def _interrupted_result(self, row: sqlite3.Row) -> dict[str, Any]:
        run_id = row["id"]
        rebuilt = result_from_steps(self._json(row["config_json"], run_id), self.steps(run_id), run_id=run_id,
                                    recorder_pid=row["recorder_pid"])
        return interrupted_result(self._json(row["result_json"], run_id), rebuilt)

    def _row(self, row: sqlite3.Row) -> RunRow:
        run_id, status, result = row["id"], row["status"], self._json(row["result_json"], row["id"])
        if self._gone(row):  # shown as a writable open will finalise it, without writing
            status, result = "interrupted", self._interrupted_result(row)
        return RunRow(
            id=run_id, kind=row["kind"], name=row["name"], status=status, created_at=row["created_at"],
            finished_at=row["finished_at"], config=self._json(row["config_json"], run_id),
            environment=self._json(row["environment_json"], run_id), result=result, log_path=row["log_path"],
        )

    def _json(self, text: str | None, run_id: int) -> Any:
        """A JSON column of run `run_id` (NULL reads as {})."""
        try:
            return json.loads(text) if text is not None else {}
        except ValueError as error:
            raise HistoryError(f"run {run_id} in history {self.path} is damaged ({_one_line(error)}); restore the "
                               "file from a backup or pass another path with --db", EXIT_BAD_FILE) from error

    def runs(self, limit: int | None = None) -> list[RunRow]:
        """Runs, oldest first (the last `limit` when given)."""
        query = f"SELECT {self._run_columns} FROM runs ORDER BY id DESC"
        parameters: tuple[Any, ...] = ()
        if limit is not None:
            query += " LIMIT ?"
            parameters = (limit,)
        return [self._row(row) for row in reversed(self._fetch(query, parameters))]

    def run(self, run_id: int) -> RunRow | None:
        rows = self._fetch(f"SELECT {self._run_columns} FROM runs WHERE id = ?", (run_id,))
        return self._row(rows[0]) if rows else None

    def steps(self, run_id: int) -> list[dict[str, Any]]:
        rows = self._fetch("SELECT record_json FROM steps WHERE run_id = ? ORDER BY step", (run_id,))
        return [self._json(record, run_id) for (record,) in rows]

    def samples(self, run_id: int) -> list[dict[str, Any]]:
        rows = self._fetch("SELECT sample_json FROM samples WHERE run_id = ? ORDER BY t_s", (run_id,))
        return [self._json(sample, run_id) for (sample,) in rows]


_RUN_COLUMNS = ("id, kind, name, status, created_at, finished_at, config_json, environment_json, result_json,"
                " log_path, recorder_pid, recorder_started_at, last_recorded_at")
"""The columns of a runs row as `_row`, `_gone` and `finalise_interrupted` read it (by name)."""
