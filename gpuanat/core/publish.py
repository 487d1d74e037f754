"""Where a training process that gpuanat did not launch publishes its probe events, and who may read them.

An `AnatomyCallback` in someone's own script (not launched by gpuanat) writes the same protocol lines it
would send to gpuanat's pipe into `<dir>/<pid>.jsonl`, where `<dir>` is `$XDG_RUNTIME_DIR/gpuanat` when
that variable is set, else `/tmp/gpuanat-<uid>`. The directory is created mode 0700 and the file mode
0600: only the user who runs the training (and root) can read what it publishes. A directory or file that
is not ours, is a symlink, or is open to other users is refused by the writer and distrusted by the reader.

The file stays small: plain step lines are throttled to a few per second (steps that carry measured
bands, `model`, `hello` and `done` always go through), and past `MAX_PUBLICATION_BYTES` the file is
replaced, atomically, by one that starts again from the header events (hello, model, the latest measured
step). The writer removes the file when its process exits normally; files of processes that died without
that are removed by the next publisher in the same directory, and a reader ignores a file older than the
process it claims to describe (a reused PID).

Plain Python (no torch): the writer runs inside the training process, the reader in `gpuanat watch`.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from gpuanat.core.history import pid_alive
from gpuanat.core.protocol import Done, Event, Hello, Malformed, ModelInfo, Step, decode, encode

PLAIN_STEP_INTERVAL_S = 0.25
"""A step without measured bands is written only this long after the previous step written (4 per second)."""
MAX_PUBLICATION_BYTES = 4 * 1024 * 1024
"""Past this size the file starts over from its header events (hours of steps at 4 per second)."""
PUBLICATION_SUFFIX = ".jsonl"
_OPEN_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC


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


def _private_problem(st: os.stat_result, uid: int, what: str, path: Path) -> str | None:
    if st.st_uid != uid:
        return f"{what} {path} belongs to uid {st.st_uid}, not to us (uid {uid})"
    if st.st_mode & 0o077:
        return f"{what} {path} is open to other users (mode {stat.S_IMODE(st.st_mode):04o})"
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
    """Why a publication file must not be trusted (not a regular file, not ours, readable by others,
    or in a directory that is not private), or None."""
    problem = private_dir_problem(path.parent, uid)
    if problem is not None:
        return problem
    try:
        st = os.lstat(path)
    except OSError as error:
        return f"cannot read {path}: {error.strerror}"
    if not stat.S_ISREG(st.st_mode):
        return f"{path} is not a regular file"
    return _private_problem(st, uid, "the publication file", path)


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


def remove_dead_publications(directory: Path) -> list[Path]:
    """Remove the files of processes that no longer exist (killed before they could clean up)."""
    removed = []
    with contextlib.suppress(OSError):
        for entry in os.scandir(directory):
            stem = entry.name.removesuffix(PUBLICATION_SUFFIX)
            if entry.name.endswith(PUBLICATION_SUFFIX) and stem.isdigit() and not pid_alive(int(stem)):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    return removed


def _create_private_file(path: Path) -> int:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | _OPEN_FLAGS, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data):]


class Publisher:
    """Writes one process's events to `<directory>/<pid>.jsonl`, throttled and bounded.

    `publish` raises OSError (or PublishRefused) when the file cannot be written; the caller decides
    what to do (the probe turns publishing off, never training).
    """

    def __init__(self, directory: Path, *, pid: int | None = None, uid: int | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 plain_step_interval_s: float = PLAIN_STEP_INTERVAL_S,
                 max_file_bytes: int = MAX_PUBLICATION_BYTES) -> None:
        self.directory = directory
        self.pid = os.getpid() if pid is None else pid
        self._uid = os.getuid() if uid is None else uid
        self.path = directory / f"{self.pid}{PUBLICATION_SUFFIX}"
        self._clock = clock
        self._plain_step_interval_s = plain_step_interval_s
        self._max_file_bytes = max_file_bytes
        self._fd: int | None = None
        self._file_bytes = 0
        self._last_step_s = -float("inf")
        self._header: dict[str, bytes] = {}
        """The latest hello, model and measured step, encoded: what a rewritten file starts with."""
        self.skipped_steps = 0
        self.rewrites = 0

    def open(self) -> None:
        ensure_private_dir(self.directory, self._uid)
        remove_dead_publications(self.directory)
        self._fd = _create_private_file(self.path)
        self._file_bytes = 0

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
        if isinstance(event, (Hello, ModelInfo)) or (isinstance(event, Step) and event.bands is not None):
            self._header[event.type] = line
        if self._file_bytes + len(line) > self._max_file_bytes and not isinstance(event, Done):
            self._rewrite()
        assert self._fd is not None
        _write_all(self._fd, line)
        self._file_bytes += len(line)
        return True

    def _rewrite(self) -> None:
        """Start the file over from the header events, atomically: a reader sees the old or the new file."""
        header = b"".join(self._header[kind] for kind in ("hello", "model", "step") if kind in self._header)
        temporary = self.path.with_name(self.path.name + ".new")
        fd = _create_private_file(temporary)
        try:
            _write_all(fd, header)
            os.replace(temporary, self.path)
        except OSError:
            os.close(fd)
            raise
        assert self._fd is not None
        os.close(self._fd)
        self._fd, self._file_bytes = fd, len(header)
        self.rewrites += 1

    def close(self, *, remove: bool = True) -> None:
        """Close the file and, by default, remove it. Idempotent; never raises."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None
        if remove:
            with contextlib.suppress(OSError):
                os.unlink(self.path)


class PublicationReader:
    """Follows one publication file: each `read` returns the events appended since the last one.

    Before trusting the file it checks, on the open file itself, that it is a regular file owned by
    `uid` and unreadable to others; `problem` says why it was not trusted. A rewritten (replaced) file is
    reopened and read from its start.
    """

    def __init__(self, path: Path, *, uid: int | None = None, not_before_s: float | None = None) -> None:
        """`not_before_s` (Unix time): a file last written before then belongs to an earlier process that
        had the same PID, and is ignored."""
        self.path = path
        self._uid = os.getuid() if uid is None else uid
        self._not_before_s = not_before_s
        self._fd: int | None = None
        self._inode: tuple[int, int] | None = None
        self._remainder = b""
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
                problem = (f"{self.path} is not a regular file" if not stat.S_ISREG(st.st_mode)
                           else _private_problem(st, self._uid, "the publication file", self.path))
                if problem is None and self._not_before_s is not None and st.st_mtime < self._not_before_s:
                    problem = f"{self.path} is older than the process (left by an earlier process with that PID)"
                if problem is not None:
                    os.close(fd)
                else:
                    self._close()
                    self._fd, self._inode, self._remainder = fd, (st.st_dev, st.st_ino), b""
        self.problem = problem
        return problem is None

    def _replaced(self) -> bool:
        try:
            st = os.stat(self.path, follow_symlinks=False)
        except OSError:
            return False
        return (st.st_dev, st.st_ino) != self._inode

    def read(self) -> list[Event | Malformed]:
        if (self._fd is None or self._replaced()) and not self._open():
            return []
        assert self._fd is not None
        chunks = [self._remainder]
        while chunk := os.read(self._fd, 1 << 16):
            chunks.append(chunk)
        data = b"".join(chunks)
        complete, _, self._remainder = data.rpartition(b"\n")
        return [decode(line) for line in complete.split(b"\n") if line.strip()]

    def _close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def close(self) -> None:
        self._close()
