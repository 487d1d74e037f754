"""The history under real faults, made by real processes and real file systems (no mock of SQLite):
another process holding the write lock, a full database and a full disk, files that are not a usable gpuanat
history, read-only files and mounts, and a recorder killed with SIGKILL or whose PID now names another process.

Mounting (a 2 MiB tmpfs, a read-only bind mount) needs root; those tests are skipped where mount is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pty
import select
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import psutil
import pytest
from conftest import REPO, TINY_CPU, cli_env, fill_file_system, mount, run_cli, small_tmpfs

from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.history_errors import HistoryError, HistoryWriteError, write_with_backoff
from gpuanat.core.store.history_file import WRITE_BUSY_TIMEOUT_S
from gpuanat.core.vocabulary.result import RunResult

HOLD_LOCK = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
"""
"""Another process that takes the history's write lock and holds it for argv[2] seconds."""

RECORDER = """
import sys, time
from gpuanat.core.store.history import HistoryStore
store = HistoryStore(sys.argv[1])
run_id = store.create_run({"batch_size": 4, "preset": "tiny"})
store.add_steps(run_id, [
    {"step": 1, "elapsed_s": 1.5, "samples": 4, "loss": 2.5, "peak_allocated_bytes": 1000, "reserved_bytes": 2048,
     "bands": {"weights_bytes": 64, "gradients_bytes": 64, "optimizer_state_bytes": 128, "activations_bytes": 32,
               "activations_method": "allocator", "batch_bytes": 16, "measured_at_step": 1,
               "gradients_at_forward_end_bytes": 0, "optimizer_state_at_forward_end_bytes": 0}},
    {"step": 2, "elapsed_s": 2.0, "samples": 8, "loss": 2.25, "peak_allocated_bytes": 1500, "reserved_bytes": 4096},
    {"step": 3, "elapsed_s": 4.0, "samples": 12, "peak_allocated_bytes": 1200, "reserved_bytes": 4096},
])
store.add_samples(run_id, [{"t_s": 100.0, "gpus": []}, {"t_s": 101.0, "gpus": []}])
print(run_id, flush=True)
time.sleep(60)
"""
"""A process recording a run: three steps and two samples, then it waits (to be killed)."""


def _fingerprint(path: Path) -> dict[str, tuple[str, int]]:
    """sha256 and mtime of every file in the history's directory (so a created -wal or -shm shows too)."""
    return {
        entry.name: (hashlib.sha256(entry.read_bytes()).hexdigest(), entry.stat().st_mtime_ns)
        for entry in sorted(path.parent.iterdir())
        if entry.is_file() and not entry.is_symlink()
    }


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent.parent), os.environ.get("PYTHONPATH")])),
    }
    return subprocess.Popen([sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env)


def _hold_lock(db: Path, seconds: float) -> subprocess.Popen[str]:
    holder = _start(HOLD_LOCK, str(db), str(seconds))
    assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
    return holder


def _history_json(db: Path) -> list[dict]:
    completed = run_cli(["history", "--json", "--db", str(db)], None, timeout_s=60)
    assert completed.returncode == 0, completed.stderr
    assert "Traceback" not in completed.stderr
    return json.loads(completed.stdout)


def _history_with_runs(db: Path, runs: int = 2) -> list[int]:
    with HistoryStore(db) as store:
        run_ids = []
        for index in range(runs):
            run_id = store.create_run({"batch_size": 4 * (index + 1)})
            store.add_steps(run_id, [{"step": 1, "elapsed_s": 0.5, "samples": 4}])
            store.update_result(run_id, RunResult.from_json({"status": "ok", "run_id": run_id}), status="ok")
            run_ids.append(run_id)
    return run_ids


# --- (a) another process holds the write lock -------------------------------------------------------------------


def test_a_write_blocked_by_another_process_fails_fast_and_succeeds_once_the_lock_is_released(tmp_path):
    db = tmp_path / "h.sqlite"
    with HistoryStore(db) as store:
        run_id = store.create_run({"batch_size": 4})
        holder = _hold_lock(db, seconds=4)
        started = time.monotonic()
        with pytest.raises(HistoryWriteError) as busy:
            store.add_steps(run_id, [{"step": 1, "elapsed_s": 0.5}])
        waited_s = time.monotonic() - started
        assert busy.value.reason == "busy" and busy.value.exit_code == 1
        assert "lock" in str(busy.value) and "\n" not in str(busy.value)
        assert WRITE_BUSY_TIMEOUT_S - 0.2 <= waited_s < WRITE_BUSY_TIMEOUT_S + 1.5
        assert [run["id"] for run in _history_json(db)] == [run_id]  # readers are not blocked meanwhile
        assert holder.wait(timeout=10) == 0
        store.add_steps(run_id, [{"step": 1, "elapsed_s": 0.5}])  # the same write, retried: the store is usable
        assert store.steps(run_id) == [{"step": 1, "elapsed_s": 0.5}]


def test_write_with_backoff_succeeds_once_the_lock_is_released(tmp_path):
    db = tmp_path / "h.sqlite"
    with HistoryStore(db) as store:
        run_id = store.create_run({"batch_size": 4})
        holder = _hold_lock(db, seconds=3)
        started = time.monotonic()
        write_with_backoff(
            lambda: store.update_result(run_id, RunResult.from_json({"status": "ok"}), status="ok"), deadline_s=20
        )
        new_run = write_with_backoff(lambda: store.create_run({"batch_size": 8}), deadline_s=20)
        assert time.monotonic() - started >= 2.5  # it had to wait for the holder
        assert holder.wait(timeout=10) == 0
        assert store.run(run_id).status == "ok" and store.run(new_run).status == "running"


def test_write_with_backoff_gives_up_at_its_deadline(tmp_path):
    db = tmp_path / "h.sqlite"
    with HistoryStore(db) as store:
        run_id = store.create_run({"batch_size": 4})
        holder = _hold_lock(db, seconds=8)
        started = time.monotonic()
        with pytest.raises(HistoryWriteError):
            write_with_backoff(lambda: store.add_steps(run_id, [{"step": 1, "elapsed_s": 0.5}]), deadline_s=1)
        assert time.monotonic() - started < 1 + 2 * WRITE_BUSY_TIMEOUT_S + 1
        holder.kill()
        holder.wait()
        store.add_steps(run_id, [{"step": 1, "elapsed_s": 0.5}])
        assert len(store.steps(run_id)) == 1


def test_processes_creating_one_new_history_at_once_share_it(tmp_path):
    """The history is built beside its path and linked in whole: every process ends up in the same file."""
    db = tmp_path / "new" / "history.sqlite"
    code = (
        "import sys\nfrom gpuanat.core.store.history import HistoryStore\n"
        "with HistoryStore(sys.argv[1]) as store: print(store.create_run({}))\n"
    )
    creators = [_start(code, str(db)) for _ in range(4)]
    run_ids = sorted(int(creator.communicate(timeout=60)[0]) for creator in creators)
    assert all(creator.returncode == 0 for creator in creators)
    assert run_ids == [1, 2, 3, 4]
    assert sorted(entry.name for entry in db.parent.iterdir()) == ["history.sqlite"]


# --- (b) a full database, a full disk ----------------------------------------------------------------------------


def test_a_full_database_refuses_writes_whole_while_the_history_stays_readable(tmp_path):
    """PRAGMA max_page_count makes SQLite answer SQLITE_FULL as on a full disk, on every system."""
    db = tmp_path / "h.sqlite"
    (kept_run, _) = _history_with_runs(db)
    with HistoryStore(db) as store:
        store._db.execute(f"PRAGMA max_page_count = {store._db.execute('PRAGMA page_count').fetchone()[0]}")
        records = [{"step": step, "elapsed_s": step / 10, "padding": "x" * 4000} for step in range(2, 30)]
        for _attempt in range(2):
            with pytest.raises(HistoryWriteError) as full:
                store.add_steps(kept_run, records)
            assert full.value.reason == "full" and full.value.exit_code == 1
        assert [run["status"] for run in _history_json(db)] == ["ok", "ok"]
        store._db.execute("PRAGMA max_page_count = 1073741823")
        store.add_steps(kept_run, records)
        assert len(store.steps(kept_run)) == 1 + len(records)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs, unmounted afterwards."""
    with small_tmpfs(tmp_path / "small", size_mib=2) as mount_point:
        yield mount_point


def test_a_full_disk_fails_writes_with_one_line_and_history_still_lists_the_runs(small_disk):
    db = small_disk / "history.sqlite"
    run_ids = _history_with_runs(db)
    records = [{"step": step, "elapsed_s": step / 10, "padding": "x" * 2000} for step in range(2, 400)]
    store = HistoryStore(db)
    filler = fill_file_system(small_disk)
    for _attempt in range(2):
        with pytest.raises(HistoryWriteError) as full:
            store.add_steps(run_ids[0], records)
        assert full.value.reason == "full" and full.value.exit_code == 1
    with pytest.raises(HistoryWriteError):
        store.create_run({"batch_size": 4, "padding": "x" * 100_000})
    assert [run["id"] for run in _history_json(db)] == run_ids  # while the writer has it open
    store.close()
    before = _fingerprint(db)
    completed = run_cli(["history", "--db", str(db)], None, timeout_s=60)  # with no writer: no -wal to read
    assert completed.returncode == 0 and "Traceback" not in completed.stderr
    assert _fingerprint(db) == before

    with pytest.raises(HistoryWriteError) as cannot_create:  # a new history on the full disk
        HistoryStore(small_disk / "new.sqlite")
    assert cannot_create.value.exit_code == 1
    assert not (small_disk / "new.sqlite").exists()
    assert sorted(entry.name for entry in small_disk.iterdir()) == sorted(before)  # no staging file left

    filler.unlink()
    with HistoryStore(db) as reopened:  # space freed: the same write succeeds
        reopened.add_steps(run_ids[0], records)
        assert len(reopened.steps(run_ids[0])) == 1 + len(records)


# --- (c) files that are not a usable gpuanat history -------------------------------------------------------------


def _truncated(path: Path) -> Path:
    _history_with_runs(path, runs=20)
    os.truncate(path, path.stat().st_size // 2 + 100)
    return path


def _cut_at_a_page(path: Path) -> Path:
    _history_with_runs(path, runs=20)
    os.truncate(path, 2 * 4096)
    return path


def _random_bytes(path: Path) -> Path:
    path.write_bytes(os.urandom(20_000))
    return path


def _directory(path: Path) -> Path:
    path.mkdir()
    return path


def _another_application_s(path: Path) -> Path:
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA user_version = 7")
        db.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
        db.execute("INSERT INTO notes (body) VALUES ('not a run')")
    return path


def _another_application_s_in_wal_mode(path: Path) -> Path:
    with closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA journal_mode = WAL")
        db.execute("PRAGMA application_id = 1234")
        db.execute("CREATE TABLE runs (id INTEGER PRIMARY KEY)")
    return path


def _empty_file(path: Path) -> Path:
    path.touch()
    return path


def _link_to_an_empty_file(path: Path) -> Path:
    (path.parent / "empty").touch()
    path.symlink_to(path.parent / "empty")
    return path


def _link_to_a_history(path: Path) -> Path:
    _history_with_runs(path.parent / "real.sqlite")
    path.symlink_to(path.parent / "real.sqlite")
    return path


BAD_FILES = [
    _truncated,
    _cut_at_a_page,
    _random_bytes,
    _directory,
    _another_application_s,
    _another_application_s_in_wal_mode,
    _empty_file,
    _link_to_an_empty_file,
    _link_to_a_history,
]


@pytest.mark.parametrize("make", BAD_FILES, ids=[make.__name__.strip("_") for make in BAD_FILES])
def test_what_is_not_a_usable_history_gets_one_line_exit_2_and_stays_untouched(tmp_path, make):
    db = make(tmp_path / "history.sqlite")
    before = _fingerprint(db)
    listing = sorted(entry.name for entry in tmp_path.rglob("*"))
    completed = run_cli(["history", "--db", str(db)], None, timeout_s=60)
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpuanat: error: "), completed.stderr
    assert "Traceback" not in completed.stderr and completed.stdout == ""
    with pytest.raises(HistoryError) as refused:  # a writing command is refused the same way
        HistoryStore(db)
    assert refused.value.exit_code == 2 and not isinstance(refused.value, HistoryWriteError)
    assert _fingerprint(db) == before
    assert sorted(entry.name for entry in tmp_path.rglob("*")) == listing


UNUSABLE_DB_PATHS = {
    "a text file": lambda folder: _text_file(folder / "notes.txt"),
    "a missing folder": lambda folder: folder / "no" / "such" / "history.sqlite",
    "a directory": lambda folder: folder,
}


def _text_file(path: Path) -> Path:
    path.write_text("not a history\n")
    return path


def _commands_with_a_history(db: Path) -> dict[str, list[str]]:
    """Every command that takes --db (gpuanat/cli/parser.py), as a user would start it, with `db`."""
    flag = ["--db", str(db)]
    return {
        "history": ["history", *flag],
        "history --rename": ["history", "--rename", "1", "x", *flag],
        "explain": ["explain", *flag],
        "run": ["run", *TINY_CPU, *flag],
        "run --script": ["run", "--script", str(Path(__file__).parent / "scripts" / "tiny_trainer.py"), *flag],
        "sweep": ["sweep", "--device", "cpu", "--max-steps", "2", *flag],
        "fit": ["fit", *flag],
        "tune": ["tune", "--device", "cpu", "--budget", "2", *flag],
        "watch --save": ["watch", str(os.getpid()), "--json", "--save", "--duration", "5", *flag],
        "serve": ["serve", "--port", "1", "--", *flag],
    }


@pytest.mark.parametrize("unusable", sorted(UNUSABLE_DB_PATHS))
def test_an_unusable_db_is_refused_at_once_by_every_command_that_takes_one(tmp_path, unusable):
    """One line saying what is wrong and what to do, exit 2, before anything trains or is watched or served: nothing
    printed on stdout, no file or folder made, and none of the commands' own checks reached (fit would say it needs
    a GPU, serve that port 1 is not its to take)."""
    folder = tmp_path / "here"
    folder.mkdir()
    db = UNUSABLE_DB_PATHS[unusable](folder)
    listing = sorted(entry.relative_to(tmp_path) for entry in tmp_path.rglob("*"))
    for command, args in _commands_with_a_history(db).items():
        completed = run_cli(args, None, timeout_s=60)
        lines = completed.stderr.strip().splitlines()
        assert completed.returncode == 2 and len(lines) == 1, (command, completed.stderr)
        assert lines[0].startswith("gpuanat: error: ") and str(db) in lines[0] and "--db" in lines[0], (command, lines)
        assert completed.stdout == "", (command, completed.stdout)
        assert sorted(entry.relative_to(tmp_path) for entry in tmp_path.rglob("*")) == listing, command


def test_the_dashboard_refuses_an_unusable_db_before_it_draws(tmp_path):
    """In a real terminal: before, it opened and failed only at `r` or `h`."""
    db = _text_file(tmp_path / "notes.txt")
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuanat", "--db", str(db)],
        cwd=REPO,
        env={**cli_env(None), "COLUMNS": "80", "LINES": "24", "TERM": "xterm"},
        stdin=follower,
        stdout=follower,
        stderr=subprocess.PIPE,
    )
    os.close(follower)
    try:
        returncode = process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail("the dashboard opened on a text file given as --db")
    finally:
        drawn = b""
        with contextlib.suppress(OSError):
            while select.select([leader], [], [], 0)[0] and (chunk := os.read(leader, 65536)):
                drawn += chunk
        os.close(leader)
    stderr = process.stderr.read().decode() if process.stderr is not None else ""
    assert returncode == 2 and stderr.strip().splitlines() == [
        f"gpuanat: error: {db} is not a gpuanat history (not an SQLite database); gpuanat leaves it untouched — "
        "pass another path with --db"
    ], stderr
    assert b"\x1b[?1049h" not in drawn  # the alternate screen never opened
    assert db.read_text() == "not a history\n"


def test_a_missing_history_in_an_existing_folder_is_no_error(tmp_path):
    completed = run_cli(["history", "--db", str(tmp_path / "new.sqlite")], None, timeout_s=60)
    assert completed.returncode == 0 and "No runs recorded yet" in completed.stdout, completed.stderr
    assert list(tmp_path.iterdir()) == []  # a read creates nothing


def test_a_busy_history_is_not_refused_the_command_waits_for_it(tmp_path):
    db = tmp_path / "history.sqlite"
    _history_with_runs(db)
    holder = _hold_lock(db, 3)
    completed = run_cli(["history", "--rename", "1", "renamed", "--db", str(db)], None, timeout_s=60)
    holder.wait(timeout=30)
    assert completed.returncode == 0 and "Run 1 is named “renamed” now." in completed.stdout, completed.stderr
    with HistoryStore(db, read_only=True) as store:
        assert store.run(1).name == "renamed"


def test_history_leaves_the_file_byte_identical(tmp_path):
    """sha256 and mtime of the database, its -wal and -shm: closed cleanly; with a writer still recording; after
    that writer was killed (its -wal and -shm left behind)."""
    db = tmp_path / "history.sqlite"
    _history_with_runs(db)
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["history.sqlite"]
    before = _fingerprint(db)
    assert len(_history_json(db)) == 2
    assert _fingerprint(db) == before  # and no -wal or -shm created

    recorder = _start(RECORDER, str(db))
    assert recorder.stdout is not None and recorder.stdout.readline().strip()
    before = _fingerprint(db)
    assert {"history.sqlite-wal", "history.sqlite-shm"} <= set(before)
    assert [run["status"] for run in _history_json(db)] == ["ok", "ok", "running"]
    assert _fingerprint(db) == before
    recorder.send_signal(signal.SIGKILL)
    recorder.wait()
    before = _fingerprint(db)
    assert [run["status"] for run in _history_json(db)] == ["ok", "ok", "interrupted"]
    assert _fingerprint(db) == before


def test_a_read_only_file_is_listed_and_left_as_it_is(tmp_path):
    db = tmp_path / "history.sqlite"
    _history_with_runs(db)
    db.chmod(0o444)
    before = _fingerprint(db)
    assert len(_history_json(db)) == 2
    assert _fingerprint(db) == before


@pytest.fixture
def read_only_mount(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """(a writable directory, the same directory mounted read-only), unmounted afterwards."""
    source, mounted = tmp_path / "source", tmp_path / "read-only"
    source.mkdir()
    mounted.mkdir()
    if not mount("--bind", str(source), str(mounted)):
        pytest.skip("bind mounts are not permitted here")
    try:
        if not mount("-o", "remount,bind,ro", str(mounted)):
            pytest.skip("a read-only remount is not permitted here")
        yield source, mounted
    finally:
        subprocess.run(["umount", "-l", str(mounted)], check=True)


def test_a_history_in_a_read_only_directory_is_listed_and_refused_for_writing(read_only_mount):
    source, mounted = read_only_mount
    _history_with_runs(source / "clean.sqlite")
    _history_with_runs(source / "killed.sqlite")
    recorder = _start(RECORDER, str(source / "killed.sqlite"))
    assert recorder.stdout is not None and recorder.stdout.readline().strip()
    recorder.send_signal(signal.SIGKILL)
    recorder.wait()
    before = _fingerprint(source / "clean.sqlite")
    assert {"killed.sqlite-wal", "killed.sqlite-shm"} <= set(before)  # a WAL only the -shm indexes

    assert [run["status"] for run in _history_json(mounted / "clean.sqlite")] == ["ok", "ok"]
    assert [run["status"] for run in _history_json(mounted / "killed.sqlite")] == ["ok", "ok", "interrupted"]
    with pytest.raises(HistoryError, match="read-only") as refused:
        HistoryStore(mounted / "clean.sqlite")
    assert refused.value.exit_code == 2
    assert _fingerprint(source / "clean.sqlite") == before


# --- (d) a recorder that died, a PID that names another process ----------------------------------------------------


def test_a_recorder_killed_with_sigkill_has_its_run_finalised_by_the_next_writable_open(tmp_path):
    db = tmp_path / "history.sqlite"
    recorder = _start(RECORDER, str(db))
    assert recorder.stdout is not None
    run_id = int(recorder.stdout.readline())
    recorder.send_signal(signal.SIGKILL)
    recorder.wait()

    before = _fingerprint(db)
    (shown,) = _history_json(db)  # read-only: shown interrupted, not written
    assert shown["status"] == "interrupted" and shown["finished_at"] is None
    assert _fingerprint(db) == before

    with HistoryStore(db) as store:
        store.create_run({"batch_size": 8})
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as raw:
        raw.row_factory = sqlite3.Row
        row = dict(raw.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone())
    assert row["status"] == "interrupted"
    assert row["finished_at"] == row["last_recorded_at"] and row["created_at"] <= row["finished_at"] <= time.time()
    result = json.loads(row["result_json"])
    assert result == {
        "run_id": run_id,
        "status": "interrupted",
        "config": {"batch_size": 4, "preset": "tiny"},
        "steps": 3,
        "samples": 12,
        "train_runtime_s": 4.0,
        "samples_per_second": 3.0,
        "train_loss": 2.25,
        "peak_allocated_bytes": 1500,
        "peak_reserved_bytes": 4096,
        # step 1's probe bands as one moment's, the end of its forward pass: no gradients nor optimizer state yet
        "bands": {
            "other_processes_bytes": None,
            "cuda_context_bytes": None,
            "weights_bytes": 64,
            "gradients_bytes": 0,
            "optimizer_state_bytes": 0,
            "activations_bytes": 32,
            "temporaries_and_cache_bytes": None,
            "free_bytes": None,
        },
        "gradients_after_backward_bytes": 64,
        "error": {
            "kind": "interrupted",
            "message": f"the recorder (PID {recorder.pid}) stopped before the run finished; this result was "
            "rebuilt from its 3 recorded steps",
        },
        # the steps were recorded without `loss_step`: each loss placed at the first step that carried it
        "final_loss": 2.25,
        "min_loss": 2.25,
        "loss_curve": [[1, 2.5], [2, 2.25]],
        "unavailable": {},
    }
    assert [run["status"] for run in _history_json(db)] == ["interrupted", "running"]


def test_a_pid_reused_by_a_live_process_of_another_start_time_reads_interrupted(tmp_path):
    db = tmp_path / "history.sqlite"
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started_at = psutil.Process(other.pid).create_time()
        with HistoryStore(db) as store:
            reused = store.create_run({"batch_size": 4})
            alive = store.create_run({"batch_size": 8})
            for run_id, recorder_started_at in ((reused, started_at - 50), (alive, started_at)):
                store._db.execute(
                    "UPDATE runs SET recorder_pid = ?, recorder_started_at = ? WHERE id = ?",
                    (other.pid, recorder_started_at, run_id),
                )
        before = _fingerprint(db)
        assert [run["status"] for run in _history_json(db)] == ["interrupted", "running"]
        assert _fingerprint(db) == before
        with HistoryStore(db) as store:
            assert store.finalise_interrupted() == []  # done by the open already
        with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as raw:
            assert raw.execute("SELECT status FROM runs ORDER BY id").fetchall() == [("interrupted",), ("running",)]
    finally:
        other.kill()
        other.wait()
