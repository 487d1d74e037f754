"""Where a training process that gpuanat did not launch publishes its probe events, and who may read them.

An `AnatomyCallback` in someone's own script (not launched by gpuanat) writes the same protocol lines it
would send to gpuanat's pipe into `<dir>/<pid>.jsonl`, where `<dir>` is `$XDG_RUNTIME_DIR/gpuanat` when
that variable is set, else `/tmp/gpuanat-<uid>`. The directory is created mode 0700 and the file mode
0600: only the user who runs the training (and root) can read what it publishes. A directory or file that
is not ours, is a symlink, has another name (a hard link) or is open to other users is refused by the
writer and distrusted by the reader.

The writer never writes into, truncates or removes a file it did not create. It creates its files
exclusively (`O_EXCL`, no symlink followed) and checks the open file itself; a file already at its path is
removed first only when it is a leftover: a regular file of ours with no other name, written by a process
that no longer runs (or by an earlier process with the same PID). It remembers the identity (device, inode)
of every file it created and removes only those.

The file stays small: plain step lines are throttled to a few per second (steps that carry measured
bands, `model`, `hello`, `operations` and `done` always go through), and past `MAX_PUBLICATION_BYTES` the file is
replaced, atomically, by one that starts again from the header events (hello, model, the latest measured
step, the operations profiled). The writer removes the file when its process exits normally; files of processes
that died without that are removed by the next publisher in the same directory, and a reader ignores a file older
than the process it claims to describe (a reused PID).

The reader trusts nothing in the file: lines are cut with `EventLines`, so a line longer than
`protocol.MAX_EVENT_LINE_BYTES` costs at most that much memory and comes out as one `Malformed`, and each `read`
takes a bounded number of bytes and events.

Plain Python (no torch): the writer runs inside the training process, the reader in `gpuanat watch`.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import psutil

from gpuanat.core.measure.process_tree import pid_alive
from gpuanat.core.vocabulary.protocol import (
    Done,
    Event,
    EventLines,
    Hello,
    Malformed,
    ModelInfo,
    Operations,
    Ranked,
    Step,
    encode,
)

PLAIN_STEP_INTERVAL_S = 0.25
"""A step without measured bands is written only this long after the previous step written (4 per second)."""
MAX_PUBLICATION_BYTES = 4 * 1024 * 1024
"""Past this size the file starts over from its header events (hours of steps at 4 per second)."""
PUBLICATION_SUFFIX = ".jsonl"
TEMPORARY_SUFFIX = ".new"
"""A rewrite writes `<pid>.jsonl.new`, then renames it over `<pid>.jsonl`."""
READ_CHUNK_BYTES = 1 << 16
MAX_READ_BYTES = 64 << 20
"""Bytes one `PublicationReader.read` takes at most (about 50 ms of reading); the rest waits for the next call.
Memory does not depend on it: lines are cut chunk by chunk and an over-long one is dropped as it comes."""
MAX_EVENTS_PER_READ = 4096
"""Events (malformed lines included) after which a `read` stops taking chunks. A publisher writes a few events
a second; a file of tiny garbage lines must not turn into millions of `Malformed` objects in one call."""
STALE_MARGIN_S = 1.0
"""A file at our path counts as left by an earlier process with our PID only when it was last written this
long before our process started: process start times (psutil) are exact to about a second."""
MAX_PID = 1 << 22
"""The kernel's largest possible PID (pid_max's ceiling on 64-bit Linux): larger numbers are no process's."""
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _OPEN_FLAGS

FileIdentity = tuple[int, int]
"""(st_dev, st_ino): which file a name pointed at."""


class PublishRefused(Exception):
    """The publication directory or file cannot be used safely; the message says why, in one line."""


def publication_dirs(environ: Mapping[str, str], uid: int) -> list[Path]:
    """Where a process with environment `environ` run by `uid` publishes: the first entry is used by the
    writer; a reader tries them all (the training and the watcher may have different environments)."""
    dirs = []
    runtime_dir = environ.get("XDG_RUNTIME_DIR")
    if runtime_dir and os.path.isabs(runtime_dir):
        dirs.append(Path(runtime_dir) / "gpuanat")
    dirs.append(Path("/tmp") / f"gpuanat-{uid}")
    return dirs


def _identity(st: os.stat_result) -> FileIdentity:
    return st.st_dev, st.st_ino


def _private_problem(st: os.stat_result, uid: int, what: str, path: Path) -> str | None:
    if st.st_uid != uid:
        return f"{what} {path} belongs to uid {st.st_uid}, not to us (uid {uid})"
    if st.st_mode & 0o077:
        return f"{what} {path} is open to other users (mode {stat.S_IMODE(st.st_mode):04o})"
    return None


def _file_problem(st: os.stat_result, uid: int, path: Path) -> str | None:
    """Why the file `st` describes is not a private publication file: not regular, not ours, readable by
    others, or known under another name too (a hard link: its data is someone else's file)."""
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    if st.st_nlink != 1:
        return f"{path} has {st.st_nlink} hard links (it is another file's data under a second name)"
    return _private_problem(st, uid, "the publication file", path)


def _removal_problem(st: os.stat_result, uid: int) -> str | None:
    """Why an entry found where we want to create a file is not ours to remove, or None."""
    if stat.S_ISLNK(st.st_mode):
        return "is a symbolic link"
    if stat.S_ISDIR(st.st_mode):
        return "is a directory"
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != uid:
        return f"belongs to uid {st.st_uid}, not to us (uid {uid})"
    if st.st_nlink != 1:
        return f"has {st.st_nlink} hard links (it is another file's data under a second name)"
    return None


def private_dir_problem(path: Path, uid: int) -> str | None:
    """Why `path` is not a usable private directory (a real directory, ours, mode 0700), or None."""
    try:
        st = os.lstat(path)
    except OSError as error:
        return f"cannot read the publication directory {path}: {error.strerror}"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    return _private_problem(st, uid, "the publication directory", path)


def publication_file_problem(path: Path, uid: int) -> str | None:
    """Why a publication file must not be trusted (not a regular file, not ours, readable by others, a hard
    link, or in a directory that is not private), or None."""
    problem = private_dir_problem(path.parent, uid)
    if problem is not None:
        return problem
    try:
        st = os.lstat(path)
    except OSError as error:
        return f"cannot read {path}: {error.strerror}"
    return _file_problem(st, uid, path)


def ensure_private_dir(path: Path, uid: int) -> None:
    """Create `path` mode 0700 if it does not exist; raise PublishRefused if it is not private."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as error:
        raise PublishRefused(f"cannot create the publication directory {path}: {error.strerror}") from error
    problem = private_dir_problem(path, uid)
    if problem is not None:
        raise PublishRefused(problem)


def _unlink_if_same(path: Path, identity: FileIdentity) -> bool:
    """Remove `path` only while it still names the file `identity` describes. Between the check and the
    unlink only our own processes can swap the entry: the directory is private (0700, ours)."""
    try:
        if _identity(os.lstat(path)) != identity:
            return False
        os.unlink(path)
    except OSError:
        return False
    return True


def _publication_pid(name: str) -> int | None:
    """The PID a publication file or its temporary is named after, or None for any other name."""
    stem = name.removesuffix(TEMPORARY_SUFFIX).removesuffix(PUBLICATION_SUFFIX)
    if stem == name or not stem.isdigit() or len(stem) > 7:
        return None
    pid = int(stem)
    return pid if 0 < pid <= MAX_PID else None


def remove_dead_publications(directory: Path, uid: int | None = None) -> list[Path]:
    """Remove the files (and rewrite temporaries) of processes that no longer exist, killed before they
    could clean up: only regular files of `uid` (default ours) with no other name; anything else is left."""
    uid = os.getuid() if uid is None else uid
    removed = []
    with contextlib.suppress(OSError), os.scandir(directory) as entries:
        for entry in entries:
            pid = _publication_pid(entry.name)
            if pid is None or pid_alive(pid):
                continue
            with contextlib.suppress(OSError):
                st = entry.stat(follow_symlinks=False)
                if _removal_problem(st, uid) is None and _unlink_if_same(Path(entry.path), _identity(st)):
                    removed.append(Path(entry.path))
    return removed


def _process_start_s(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


class Publisher:
    """Writes one process's events to `<directory>/<pid>.jsonl`, throttled and bounded.

    `publish` raises OSError (or PublishRefused) when the file cannot be written; the caller decides
    what to do (the probe turns publishing off, never training).
    """

    def __init__(
        self,
        directory: Path,
        *,
        pid: int | None = None,
        uid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        plain_step_interval_s: float = PLAIN_STEP_INTERVAL_S,
        max_file_bytes: int = MAX_PUBLICATION_BYTES,
    ) -> None:
        self.directory = directory
        self.pid = os.getpid() if pid is None else pid
        self._uid = os.getuid() if uid is None else uid
        self.path = directory / f"{self.pid}{PUBLICATION_SUFFIX}"
        self._clock = clock
        self._plain_step_interval_s = plain_step_interval_s
        self._max_file_bytes = max_file_bytes
        self._fd: int | None = None
        self._identity: FileIdentity | None = None
        """The file now at `path` that this publisher created (what `close` may remove)."""
        self._created: set[FileIdentity] = set()
        """Every file this publisher created: one of them found at its paths again is its own to replace."""
        self._file_bytes = 0
        self._last_step_s = -float("inf")
        self._header: dict[str, bytes] = {}
        """The latest hello, model and measured step, encoded: what a rewritten file starts with."""
        self.skipped_steps = 0
        self.rewrites = 0

    def open(self) -> None:
        ensure_private_dir(self.directory, self._uid)
        remove_dead_publications(self.directory, self._uid)
        self._fd, self._identity = self._create(self.path)
        self._file_bytes = 0

    def _leftover_problem(self, st: os.stat_result) -> str | None:
        """Why a file of ours at one of our paths is not a leftover we may remove (see `_create`), or None."""
        if _identity(st) in self._created or not pid_alive(self.pid):
            return None
        started_s = _process_start_s(self.pid)
        if started_s is not None and st.st_mtime < started_s - STALE_MARGIN_S:
            return None  # left by an earlier process that had our PID
        return f"was written since process {self.pid} started, not by this publisher"

    def _create(self, path: Path) -> tuple[int, FileIdentity]:
        """Create `path` exclusively, mode 0600, and check the open file. A leftover of ours there is removed
        first; anything else raises PublishRefused and is left untouched."""
        try:
            fd = os.open(path, _CREATE_FLAGS, 0o600)
        except FileExistsError:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                st = None
            if st is not None:
                problem = _removal_problem(st, self._uid) or self._leftover_problem(st)
                if problem is not None:
                    raise PublishRefused(f"{path} already exists and {problem}; left untouched") from None
                _unlink_if_same(path, _identity(st))
            try:
                fd = os.open(path, _CREATE_FLAGS, 0o600)
            except FileExistsError:
                raise PublishRefused(
                    f"{path} was created again by someone else while we replaced it; left untouched"
                ) from None
        st = os.fstat(fd)
        identity = _identity(st)
        problem = _file_problem(st, self._uid, path)
        if problem is None:
            try:
                os.fchmod(fd, 0o600)
            except OSError:
                os.close(fd)
                _unlink_if_same(path, identity)
                raise
            self._created.add(identity)
            return fd, identity
        os.close(fd)
        _unlink_if_same(path, identity)  # created by us a moment ago (O_EXCL); another name of it stays
        raise PublishRefused(f"refused just after creating it: {problem}")

    def publish(self, event: Event) -> bool:
        """Write `event` unless throttled; True when it was written."""
        if isinstance(event, Step):
            now_s = self._clock()
            if event.bands is None and now_s - self._last_step_s < self._plain_step_interval_s:
                self.skipped_steps += 1
                return False
            self._last_step_s = now_s
        if self._fd is None:
            self.open()
        line = encode(event)
        if isinstance(event, (Hello, ModelInfo, Operations)) or (isinstance(event, Step) and event.bands is not None):
            self._header[event.type] = line
        if self._file_bytes + len(line) > self._max_file_bytes and not isinstance(event, Done):
            self._rewrite()
        assert self._fd is not None
        _write_all(self._fd, line)
        self._file_bytes += len(line)
        return True

    def _rewrite(self) -> None:
        """Start the file over from the header events, atomically: a reader sees the old or the new file."""
        header = b"".join(
            self._header[kind] for kind in ("hello", "model", "step", "operations") if kind in self._header
        )
        temporary = self.path.with_name(self.path.name + TEMPORARY_SUFFIX)
        fd, identity = self._create(temporary)
        try:
            _write_all(fd, header)
            try:
                current: FileIdentity | None = _identity(os.lstat(self.path))
            except FileNotFoundError:
                current = None
            if current != self._identity:
                raise PublishRefused(
                    f"{self.path} was replaced by a file this publisher did not create; left untouched"
                )
            os.replace(temporary, self.path)
        except BaseException:
            os.close(fd)
            _unlink_if_same(temporary, identity)
            raise
        assert self._fd is not None
        os.close(self._fd)
        self._fd, self._identity, self._file_bytes = fd, identity, len(header)
        self.rewrites += 1

    def close(self, *, remove: bool = True) -> None:
        """Close the file and, by default, remove it — only while its path still names the file this
        publisher created. Idempotent; never raises."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if remove and self._identity is not None:
            _unlink_if_same(self.path, self._identity)
            self._identity = None


class PublicationReader:
    """Follows one publication file: each `read` returns the events appended since the last one.

    Before trusting the file it checks, on the open file itself, that it is a regular file owned by
    `uid`, unreadable to others and with no other name; `problem` says why it was not trusted. A rewritten
    (replaced) file is reopened and read from its start. Memory stays bounded whatever the file holds.
    """

    def __init__(self, path: Path, *, uid: int | None = None, not_before_s: float | None = None) -> None:
        """`not_before_s` (Unix time): a file last written before then belongs to an earlier process that
        had the same PID, and is ignored."""
        self.path = path
        self._uid = os.getuid() if uid is None else uid
        self._not_before_s = not_before_s
        self._fd: int | None = None
        self._inode: FileIdentity | None = None
        self._lines = EventLines()
        self.problem: str | None = None

    def _open(self) -> bool:
        problem = publication_file_problem(self.path, self._uid)
        if problem is None:
            try:
                fd = os.open(self.path, os.O_RDONLY | _OPEN_FLAGS)
            except OSError as error:
                problem = f"cannot open {self.path}: {error.strerror}"
            else:
                st = os.fstat(fd)
                problem = _file_problem(st, self._uid, self.path)
                if problem is None and self._not_before_s is not None and st.st_mtime < self._not_before_s:
                    problem = f"{self.path} is older than the process (left by an earlier process with that PID)"
                if problem is not None:
                    os.close(fd)
                else:
                    self._close()
                    self._fd, self._inode, self._lines = fd, _identity(st), EventLines()
        self.problem = problem
        return problem is None

    def _replaced(self) -> bool:
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        return _identity(st) != self._inode

    def read(self) -> list[Event | Ranked | Malformed]:
        """The events completed since the last call: at most `MAX_READ_BYTES` read and about
        `MAX_EVENTS_PER_READ` events returned; what is left waits for the next call."""
        if (self._fd is None or self._replaced()) and not self._open():
            return []
        assert self._fd is not None
        events: list[Event | Ranked | Malformed] = []
        budget_bytes = MAX_READ_BYTES
        while budget_bytes > 0 and len(events) < MAX_EVENTS_PER_READ:
            try:
                chunk = os.read(self._fd, min(READ_CHUNK_BYTES, budget_bytes))
            except OSError as error:
                self.problem = f"cannot read {self.path}: {error.strerror}"
                self._close()
                break
            if not chunk:
                break
            budget_bytes -= len(chunk)
            events.extend(self._lines.feed(chunk))  # total: a line is an event or Malformed, never an exception
        return events

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._close()
