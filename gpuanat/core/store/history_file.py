"""The history's file and its connection: where it is, what makes a file ours, how it is opened, created and
upgraded, and the one transaction or read at a time that `HistoryStore` (`history.py`) builds its runs on.

What it guarantees:
- **Read-only opens never write.** `HistoryStore(path, read_only=True)` creates no file or directory (a missing
  history reads as empty), changes no journal mode, user_version or schema, and leaves the database, its -wal and
  its -shm byte-identical. It reads a read-only file, a read-only directory and a history on a full disk:
  SQLite's `mode=ro`, with `readonly_shm=1` when a writer's -wal and -shm exist (SQLite reads the WAL without
  touching the -shm) and `immutable=1` when there is no -wal to read (each read is then checked against the
  file's mtime, size and inode and repeated through the WAL if a writer started meanwhile).
- **Only our files.** A history gpuanat creates carries `PRAGMA application_id` APPLICATION_ID ('GANT') and
  `user_version` SCHEMA_VERSION. An existing file is used only if it carries our application_id, or is a
  version-1 history of an earlier gpuanat (application_id 0, user_version 1, exactly the tables runs, steps and
  samples with their columns), which a writable open upgrades, as it does a version-2 or version-3 history, to
  SCHEMA_VERSION in one transaction. Anything else —
  another application's SQLite file, a truncated or damaged file, random bytes, a directory, a symbolic link, an
  empty file — is refused with exit code 2 and left untouched. An empty file is never ours: gpuanat builds a new
  history beside its path and links it in whole, so no crash leaves an empty or half-made file at the path.
- **Private.** Directories it creates are 0700 and the files 0600 (the -wal and -shm too), whatever the umask;
  the modes of existing files and directories are left alone.
- **One typed line per failure** (`history_errors`): every SQLite or OS error met here becomes a `HistoryError`;
  a write the history refused for now, a `HistoryWriteError`, rolled back, the connection still usable.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import stat
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

from gpuanat.core.store.history_errors import (
    EXIT_BAD_FILE,
    PATH_ERRNOS,
    HistoryError,
    HistoryWriteError,
    fault_reason,
    one_line,
    sqlite_code,
)
from gpuanat.core.store.history_schema import (
    APPLICATION_ID,
    RUN_COLUMNS,
    SCHEMA,
    SCHEMA_VERSION,
    V1_INDEXES,
    V1_TABLES,
    upgrade_statements,
)

DB_ENV = "GPUANAT_DB"
WRITE_BUSY_TIMEOUT_S = 2.0
"""How long a write waits for another process's lock before it raises HistoryWriteError: short, so a run never
stalls on its history; the caller keeps the records and the next flush retries."""
READ_BUSY_TIMEOUT_S = 5.0
"""How long a read waits for a lock: only a history in rollback-journal mode blocks readers, while a writer commits."""
IMMUTABLE_READ_ATTEMPTS = 3
"""How often a read through immutable=1 is tried when writers keep changing the file meanwhile."""
PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600

SQLITE_MAGIC = b"SQLite format 3\x00"
SQLITE_HEADER_BYTES = 100


def default_db_path() -> Path:
    """GPUANAT_DB, else the XDG data directory."""
    if os.environ.get(DB_ENV):
        return Path(os.environ[DB_ENV]).expanduser()
    data_home = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(data_home) / "gpuanat" / "history.sqlite"


@dataclass(frozen=True)
class _Header:
    """What the first 100 bytes of an SQLite file say (https://sqlite.org/fileformat.html#the_database_header)."""

    wal: bool
    user_version: int
    application_id: int


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


class HistoryFile:
    """An open history file: one connection, read-only or writable. Safe to open from several processes (WAL); one
    instance per thread.

    `read_only=True` for commands that only read: see the module docstring for what that guarantees.
    """

    def __init__(self, path: Path | str, *, read_only: bool = False) -> None:
        self.path = Path(path)
        self.read_only = read_only
        self._immutable_state: tuple[int, ...] | None = None
        """The file's state when read through immutable=1 (reads check it did not change); None otherwise."""
        self._run_columns = RUN_COLUMNS
        self.keeps_tags = True
        """Whether the file has version 4's tags and searches: a read-only open of an earlier file has none."""
        if read_only:
            self._db = self._open_read_only()
        else:
            self._db = self._open_writable()
            try:
                self._migrate()
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
            raise HistoryError(
                f"history {self.path} is a symbolic link; gpuanat only uses a history at its real "
                "path — pass that path with --db",
                EXIT_BAD_FILE,
            )
        if stat.S_ISDIR(status.st_mode):
            raise HistoryError(
                f"history {self.path} is a directory; pass a file path with --db, e.g. {self.path / 'history.sqlite'}",
                EXIT_BAD_FILE,
            )
        if not stat.S_ISREG(status.st_mode):
            raise HistoryError(f"history {self.path} is not a regular file; pass a file path with --db", EXIT_BAD_FILE)
        return status

    def _not_ours(self, what: str) -> HistoryError:
        return HistoryError(
            f"{self.path} is not a gpuanat history ({what}); gpuanat leaves it untouched — pass another path with --db",
            EXIT_BAD_FILE,
        )

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
            raise HistoryError(
                f"{self.path} is truncated or damaged ({size} bytes, pages of {page_size}); gpuanat "
                "leaves it untouched — restore it from a backup or pass another path with --db",
                EXIT_BAD_FILE,
            )
        header_ = _Header(
            wal=header[18] == 2 or header[19] == 2,
            user_version=int.from_bytes(header[60:64], "big"),
            application_id=int.from_bytes(header[68:72], "big"),
        )
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
            self.keeps_tags = bool(
                self._execute(db, "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'run_tags'")
            )
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
            db = sqlite3.connect(
                _uri(self.path, parameters), uri=True, timeout=READ_BUSY_TIMEOUT_S, isolation_level=None
            )
        except sqlite3.Error as error:
            raise self._error(error, "open") from error
        db.row_factory = sqlite3.Row
        return db

    def _columns_present(self, db: sqlite3.Connection) -> str:
        """The runs columns to select: NULL for the columns of later versions an earlier file lacks."""
        present = {name for (name,) in self._execute(db, "SELECT name FROM pragma_table_info('runs')")}
        return ", ".join(column if column in present else f"NULL AS {column}" for column in RUN_COLUMNS.split(", "))

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
                raise HistoryError(
                    f"history {self.path} is read-only ({checked} is not writable); make it writable "
                    "or pass another path with --db (`gpuanat history` reads it as it is)",
                    EXIT_BAD_FILE,
                )
        try:
            db = sqlite3.connect(
                _uri(self.path, "mode=rw"), uri=True, timeout=WRITE_BUSY_TIMEOUT_S, isolation_level=None
            )
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
            descriptor, staging_name = tempfile.mkstemp(
                prefix=f".{self.path.name}.", suffix=".new", dir=self.path.parent
            )
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
                raise HistoryError(
                    f"history {self.path} was written by a newer gpuanat (schema {version}, this one "
                    f"knows {SCHEMA_VERSION}); update gpuanat or pass another path with --db",
                    EXIT_BAD_FILE,
                )
            return
        objects = self._execute(db, "SELECT type, name FROM sqlite_master WHERE name NOT LIKE 'sqlite\\_%' ESCAPE '\\'")
        tables = {
            name: tuple(column for (column,) in self._execute(db, "SELECT name FROM pragma_table_info(?)", (name,)))
            for kind, name in objects
            if kind == "table"
        }
        others = {name for kind, name in objects if kind != "table" and not (kind == "index" and name in V1_INDEXES)}
        if application_id == 0 and version == 1 and tables == V1_TABLES and not others:
            return
        found = ", ".join(sorted(tables)) or "none"
        raise self._not_ours(f"application_id {application_id:#x}, user_version {version}, tables: {found}")

    def _migrate(self) -> None:
        """Upgrade a history of version 1 to 4 to SCHEMA_VERSION in one transaction (another process may have done
        it first)."""
        version = self._execute(self._db, "PRAGMA user_version")[0][0]
        if version >= SCHEMA_VERSION and self._execute(self._db, "PRAGMA application_id")[0][0] == APPLICATION_ID:
            return
        with self._write(f"the upgrade of its schema to version {SCHEMA_VERSION}") as db:
            found = db.execute("PRAGMA user_version").fetchone()[0]
            if found < SCHEMA_VERSION:
                for statement in upgrade_statements(found):
                    db.execute(statement)
                db.execute(f"PRAGMA application_id={APPLICATION_ID}")
                db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

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

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- errors -----------------------------------------------------------------------------------------------

    def _error(self, error: BaseException, doing: str, *, writing: bool = False) -> HistoryError:
        """The HistoryError for an SQLite or OS error met while `doing` ("open", "read", "save … to"). A fault a
        retry may get past (busy, full, I/O) is a HistoryWriteError when `writing` or on a writable store."""
        detail = one_line(error)
        code = sqlite_code(error) if isinstance(error, sqlite3.Error) else None
        if code in (sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB):
            return HistoryError(
                f"{self.path} is damaged or not a database ({detail}); gpuanat leaves it untouched — "
                "restore it from a backup or pass another path with --db",
                EXIT_BAD_FILE,
            )
        if code in (sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM, sqlite3.SQLITE_AUTH) or (
            isinstance(error, OSError) and error.errno in PATH_ERRNOS
        ):
            return HistoryError(
                f"cannot {doing} history {self.path} ({detail}); check the path and its permissions, "
                "or pass another with --db",
                EXIT_BAD_FILE,
            )
        reason = fault_reason(error)
        if reason == "busy":
            waited_s = READ_BUSY_TIMEOUT_S if self.read_only else WRITE_BUSY_TIMEOUT_S
            message = (
                f"cannot {doing} history {self.path}: another process held its lock for more than {waited_s:g} "
                f"s; try again when it is done (`fuser {self.path}` names it)"
            )
        elif reason == "full":
            message = (
                f"cannot {doing} history {self.path}: the disk or the database is full ({detail}); free space "
                "there and try again"
            )
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
