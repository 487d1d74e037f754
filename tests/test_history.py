"""The SQLite history: what is written while a run streams survives, a dead recorder's run is finalised once,
read-only opens write nothing, files that are not gpuanat's are refused, and failed writes leave a usable store.

Faults made by other processes, full disks and read-only mounts are in test_faults_history.py."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
from contextlib import closing
from pathlib import Path

import psutil
import pytest
from conftest import REPO, cli_env

from gpuanat.core.measure.process_tree import pid_alive
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.history_errors import HistoryError, HistoryWriteError, write_with_backoff
from gpuanat.core.store.history_file import default_db_path
from gpuanat.core.store.history_schema import APPLICATION_ID, SCHEMA_VERSION
from gpuanat.core.store.interrupted import result_from_steps
from gpuanat.core.vocabulary.result import RunResult

RECORDED_V1 = Path(__file__).parent / "data" / "h100_history_tf32.sqlite"
"""A history written by gpuanat before schema version 2 (no application_id, user_version 1), on an H100."""


def _fingerprint(path: Path) -> dict[str, tuple[str, int]]:
    """sha256 and mtime of the database and whichever of its -wal and -shm exist."""
    return {
        companion.name: (hashlib.sha256(companion.read_bytes()).hexdigest(), companion.stat().st_mtime_ns)
        for companion in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"))
        if companion.exists()
    }


def _raw_run(path: Path, run_id: int) -> dict:
    """The run's row as stored, read with plain sqlite3 (no interpretation by HistoryStore)."""
    with closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        db.row_factory = sqlite3.Row
        return dict(db.execute("SELECT * FROM runs WHERE id = ?", (run_id,)).fetchone())


def test_run_lifecycle(tmp_path):
    with HistoryStore(tmp_path / "h.sqlite") as store:
        run_id = store.create_run({"batch_size": 4}, name="vanilla")
        store.add_steps(run_id, [{"step": 1, "elapsed_s": 0.1, "samples": 4}, {"step": 2, "elapsed_s": 0.2}])
        store.add_samples(run_id, [{"t_s": 5.0, "gpus": []}])
        assert store.run(run_id).status == "running"  # its recorder (this process) is alive
        store.update_result(run_id, RunResult.from_json({"status": "ok", "samples_per_second": 9.5}), status="ok")
        run = store.run(run_id)
    assert run.status == "ok" and run.name == "vanilla" and run.finished_at >= run.created_at
    assert run.result.samples_per_second == 9.5
    with HistoryStore(tmp_path / "h.sqlite") as reopened:
        assert [step["step"] for step in reopened.steps(run_id)] == [1, 2]
        assert reopened.samples(run_id) == [{"t_s": 5.0, "gpus": []}]


def test_a_run_whose_recorder_exited_is_finalised_once_by_the_next_writable_open(tmp_path):
    db = tmp_path / "h.sqlite"
    code = (
        "from gpuanat.core.store.history import HistoryStore\n"
        f"s = HistoryStore({str(db)!r}); r = s.create_run({{'batch_size': 4}})\n"
        "s.add_steps(r, [{'step': 1, 'elapsed_s': 0.5, 'samples': 4, 'loss': 2.5},"
        " {'step': 2, 'elapsed_s': 1.0, 'samples': 8}])\n"
        "import os; os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    before = _fingerprint(db)
    with HistoryStore(db, read_only=True) as reader:  # shown interrupted, nothing written
        (shown,) = reader.runs()
    assert shown.status == "interrupted" and shown.result.steps == 2
    assert _fingerprint(db) == before and _raw_run(db, shown.id)["status"] == "running"

    with HistoryStore(db) as store:
        (run,) = store.runs()
        assert store.steps(run.id)[0] == {"step": 1, "elapsed_s": 0.5, "samples": 4, "loss": 2.5}
    row = _raw_run(db, run.id)
    assert row["status"] == "interrupted"
    assert row["finished_at"] == row["last_recorded_at"] and row["finished_at"] >= row["created_at"]
    result = json.loads(row["result_json"])
    assert result["steps"] == 2 and result["samples"] == 8 and result["train_loss"] == 2.5
    assert result["train_runtime_s"] == 1.0 and result["samples_per_second"] == 8.0
    assert result["error"]["kind"] == "interrupted" and "from its 2 recorded steps" in result["error"]["message"]
    with HistoryStore(db):  # once: a later open leaves the finalised row as it is
        pass
    assert _raw_run(db, run.id) == row


def test_a_live_pid_that_started_at_another_time_is_not_the_recorder(tmp_path):
    """A reused PID: this process is alive, but the row says its recorder started 100 s before it did."""
    with HistoryStore(tmp_path / "h.sqlite") as store:
        run_id = store.create_run({"batch_size": 4})
        store._db.execute("UPDATE runs SET recorder_started_at = recorder_started_at - 100 WHERE id = ?", (run_id,))
        assert store.run(run_id).status == "interrupted"
    with HistoryStore(tmp_path / "h.sqlite") as reopened:
        assert _raw_run(tmp_path / "h.sqlite", run_id)["status"] == "interrupted"
        assert reopened.run(run_id).result.error.kind == "interrupted"


def test_a_thread_id_is_not_a_live_process():
    """`kill(tid, 0)` accepts a live thread's id; a recorder PID that now names a thread is no recorder."""
    started, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=lambda: (started.set(), release.wait(10)))
    thread.start()
    try:
        started.wait(10)
        tid = thread.native_id
        assert tid is not None and tid != os.getpid()
        os.kill(tid, 0)  # the kernel takes it: a liveness check by signal would say alive
        assert not pid_alive(tid)
        assert pid_alive(os.getpid())
    finally:
        release.set()
        thread.join()
    assert not pid_alive(None) and not pid_alive(0)


def test_result_from_steps_takes_each_figure_from_the_steps_that_have_it():
    steps = [
        {
            "step": 1,
            "elapsed_s": 2.0,
            "samples": 4,
            "loss": 3.0,
            "peak_allocated_bytes": 900,
            "reserved_bytes": 2000,
            "bands": {
                "weights_bytes": 100,
                "gradients_bytes": 100,
                "optimizer_state_bytes": 200,
                "activations_bytes": 50,
                "activations_method": "allocator",
                "batch_bytes": 8,
                "measured_at_step": 1,
                "gradients_at_forward_end_bytes": 0,
                "optimizer_state_at_forward_end_bytes": 0,
            },
        },
        {"step": 2, "elapsed_s": 3.0, "samples": 8, "loss": 2.0, "allocated_bytes": 500, "reserved_bytes": 4000},
        {"step": 3, "elapsed_s": 4.0, "samples": 12, "loss": None, "peak_allocated_bytes": 1200},
    ]
    result = result_from_steps({"batch_size": 4}, steps, run_id=7, recorder_pid=4242)
    assert result.run_id == 7 and result.status == "interrupted" and result.config == {"batch_size": 4}
    assert (result.steps, result.samples, result.train_runtime_s) == (3, 12, 4.0)
    assert result.samples_per_second == 3.0
    assert result.train_loss == 2.0  # the last step that had a loss
    assert (result.peak_allocated_bytes, result.peak_reserved_bytes) == (1200, 4000)
    # step 1's probe bands as one moment's, the end of its forward pass, the gradients' maximum beside them
    assert result.bands is not None
    assert {
        band: getattr(result.bands, band)
        for band in ("weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes")
    } == {"weights_bytes": 100, "gradients_bytes": 0, "optimizer_state_bytes": 0, "activations_bytes": 50}
    assert result.gradients_after_backward_bytes == 100
    assert result.to_json()["error"] == {
        "kind": "interrupted",
        "message": "the recorder (PID 4242) stopped before the run finished; this result was rebuilt from its 3 "
        "recorded steps",
    }
    empty = result_from_steps({}, [])
    assert (empty.steps, empty.samples, empty.train_runtime_s, empty.samples_per_second) == (
        0,
        0,
        None,
        None,
    )


def test_what_a_partial_result_stored_wins_over_the_rebuilt_one(tmp_path):
    db = tmp_path / "h.sqlite"
    code = (
        "from gpuanat.core.store.history import HistoryStore\n"
        "from gpuanat.core.vocabulary.result import RunResult\n"
        f"s = HistoryStore({str(db)!r}); r = s.create_run({{'batch_size': 4}})\n"
        "s.add_steps(r, [{'step': 1, 'elapsed_s': 0.5, 'samples': 4}])\n"
        "partial = {'status': 'running', 'params': 110, 'gpu_name': 'H100', 'train_loss': None}\n"
        "s.update_result(r, RunResult.from_json(partial))\n"
        "import os; os._exit(0)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    with HistoryStore(db) as store:
        (run,) = store.runs()
    assert run.status == "interrupted" and run.result.status == "interrupted"
    assert run.result.params == 110 and run.result.gpu_name == "H100" and run.result.steps == 1


def test_a_new_history_is_private_whatever_the_umask(tmp_path):
    db = tmp_path / "data" / "gpuanat" / "history.sqlite"
    previous = os.umask(0)
    try:
        with HistoryStore(db) as store:
            store.create_run({"batch_size": 4})
            modes = {
                path.name: stat.S_IMODE(path.stat().st_mode)
                for path in (
                    db.parent.parent,
                    db.parent,
                    *(db.with_name(db.name + suffix) for suffix in ("", "-wal", "-shm")),
                )
            }
    finally:
        os.umask(previous)
    assert modes == {
        "data": 0o700,
        "gpuanat": 0o700,
        "history.sqlite": 0o600,
        "history.sqlite-wal": 0o600,
        "history.sqlite-shm": 0o600,
    }
    assert sorted(path.name for path in db.parent.iterdir()) == ["history.sqlite"]  # no staging file left


def test_an_existing_file_keeps_its_mode(tmp_path):
    db = tmp_path / "h.sqlite"
    HistoryStore(db).close()
    db.chmod(0o644)
    with HistoryStore(db) as store:
        store.create_run({"batch_size": 4})
    assert stat.S_IMODE(db.stat().st_mode) == 0o644


def test_a_new_history_is_marked_as_gpuanat_s(tmp_path):
    HistoryStore(tmp_path / "h.sqlite").close()
    with closing(sqlite3.connect(tmp_path / "h.sqlite")) as db:
        assert db.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID == 0x47414E54
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_a_version_1_history_is_read_as_it_is_and_upgraded_by_a_writable_open(tmp_path):
    db = tmp_path / "history.sqlite"
    shutil.copy(RECORDED_V1, db)
    before = _fingerprint(db)
    with HistoryStore(db, read_only=True) as reader:
        (recorded,) = reader.runs()
        assert len(reader.steps(recorded.id)) > 0
    assert _fingerprint(db) == before
    with HistoryStore(db) as store:
        assert store.runs() == [recorded]
        new_id = store.create_run({"batch_size": 4})
    with closing(sqlite3.connect(db, isolation_level=None)) as raw:
        assert raw.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert raw.execute("SELECT recorder_started_at FROM runs WHERE id = ?", (new_id,)).fetchone()[0] > 0


def test_a_version_1_lookalike_with_another_table_is_refused(tmp_path):
    db = tmp_path / "history.sqlite"
    shutil.copy(RECORDED_V1, db)
    with closing(sqlite3.connect(db, isolation_level=None)) as raw:
        raw.execute("CREATE TABLE notes (body TEXT)")
    before = _fingerprint(db)
    for read_only in (True, False):
        with pytest.raises(HistoryError, match="not a gpuanat history") as refused:
            HistoryStore(db, read_only=read_only)
        assert refused.value.exit_code == 2
    assert _fingerprint(db) == before


def test_a_history_of_a_newer_gpuanat_is_read_but_not_written(tmp_path):
    db = tmp_path / "h.sqlite"
    with HistoryStore(db) as store:
        store.create_run({"batch_size": 4})
    with closing(sqlite3.connect(db, isolation_level=None)) as raw:
        raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with HistoryStore(db, read_only=True) as reader:
        assert len(reader.runs()) == 1
    with pytest.raises(HistoryError, match="newer gpuanat") as refused:
        HistoryStore(db)
    assert refused.value.exit_code == 2


def test_a_missing_history_reads_as_empty_and_nothing_is_created(tmp_path):
    with HistoryStore(tmp_path / "missing" / "h.sqlite", read_only=True) as reader:
        assert reader.runs() == [] and reader.run(1) is None and reader.steps(1) == []
    assert list(tmp_path.iterdir()) == []


def test_a_read_only_store_sees_what_a_writer_added_after_it_opened(tmp_path):
    """With no -wal to read the reader opens immutable=1; a writer's change to the file is noticed and read."""
    db = tmp_path / "h.sqlite"
    HistoryStore(db).close()
    with HistoryStore(db, read_only=True) as reader:
        assert reader.runs() == []
        add_a_run = f"from gpuanat.core.store.history import HistoryStore\nHistoryStore({str(db)!r}).create_run({{}})\n"
        subprocess.run([sys.executable, "-c", add_a_run], check=True)  # closed: checkpointed into the file
        assert len(reader.runs()) == 1
        with HistoryStore(db) as writer:  # still open: the run is in its -wal
            writer.create_run({})
            assert len(reader.runs()) == 2


def test_a_read_only_store_refuses_to_write(tmp_path):
    HistoryStore(tmp_path / "h.sqlite").close()
    with HistoryStore(tmp_path / "h.sqlite", read_only=True) as reader, pytest.raises(HistoryError, match="read-only"):
        reader.create_run({"batch_size": 4})


def test_a_failed_write_is_rolled_back_and_the_store_stays_usable(tmp_path):
    """A full database (PRAGMA max_page_count, per connection) refuses a write whole; the same write succeeds once
    there is room."""
    with HistoryStore(tmp_path / "h.sqlite") as store:
        run_id = store.create_run({"batch_size": 4})
        store.add_steps(run_id, [{"step": 1, "elapsed_s": 0.1}])
        pages = store._db.execute("PRAGMA page_count").fetchone()[0]
        store._db.execute(f"PRAGMA max_page_count = {pages}")
        records = [{"step": step, "elapsed_s": step / 10, "padding": "x" * 4000} for step in range(2, 40)]
        with pytest.raises(HistoryWriteError) as full:
            store.add_steps(run_id, records)
        assert full.value.reason == "full" and full.value.exit_code == 1
        assert "\n" not in str(full.value) and "full" in str(full.value)
        assert [step["step"] for step in store.steps(run_id)] == [1]  # nothing of the failed write
        with pytest.raises(HistoryWriteError):
            store.create_run({"batch_size": 8, "padding": "x" * 40000})
        store._db.execute("PRAGMA max_page_count = 1073741823")
        store.add_steps(run_id, records)
        assert len(store.steps(run_id)) == 39 and len(store.runs()) == 1


def test_write_with_backoff_doubles_its_waits_until_the_deadline():
    now = [0.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    failures = iter(range(3))

    def succeeds_on_the_fourth_try() -> str:
        if next(failures, None) is not None:
            raise HistoryWriteError("busy", "busy")
        return "saved"

    assert write_with_backoff(succeeds_on_the_fourth_try, deadline_s=10, clock=lambda: now[0], sleep=sleep) == "saved"
    assert waits == [0.1, 0.2, 0.4]

    def always_busy() -> None:
        raise HistoryWriteError("busy", "busy")

    now[0], waits[:] = 0.0, []
    with pytest.raises(HistoryWriteError):
        write_with_backoff(always_busy, deadline_s=5, clock=lambda: now[0], sleep=sleep)
    assert waits == [0.1, 0.2, 0.4, 0.8, 1.6, pytest.approx(1.9)] and now[0] == pytest.approx(5.0)

    def not_ours() -> None:
        raise HistoryError("not a gpuanat history", 2)

    waits[:] = []
    with pytest.raises(HistoryError):
        write_with_backoff(not_ours, deadline_s=5, clock=lambda: now[0], sleep=sleep)
    assert waits == []  # only a write fault is retried


def test_finalisation_is_skipped_while_the_recorder_lives(tmp_path):
    """A run recorded by a live process (this one) stays running through any number of writable opens."""
    db = tmp_path / "h.sqlite"
    with HistoryStore(db) as store:
        run_id = store.create_run({"batch_size": 4})
    with HistoryStore(db) as again:
        assert again.finalise_interrupted() == [] and again.run(run_id).status == "running"
    assert _raw_run(db, run_id)["recorder_pid"] == os.getpid()
    assert _raw_run(db, run_id)["recorder_started_at"] == pytest.approx(psutil.Process().create_time(), abs=1.0)


def test_db_location_follows_env_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUANAT_DB", str(tmp_path / "x.sqlite"))
    assert default_db_path() == tmp_path / "x.sqlite"
    monkeypatch.delenv("GPUANAT_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_db_path() == tmp_path / "data" / "gpuanat" / "history.sqlite"


def test_history_csv_ends_its_lines_with_a_newline_alone(tmp_path):
    """Issue #48: Python's csv writes \r\n; a CSV for Unix tools (`wc -l`, `cut`, `diff`) ends its lines with \n."""
    db = tmp_path / "history.sqlite"
    with HistoryStore(db) as store:
        for name in ("plain", "with, a comma"):
            run_id = store.create_run({"batch_size": 4, "preset": "tiny"}, name=name)
            store.update_result(run_id, RunResult.from_json({"status": "ok", "run_id": run_id}), status="ok")
    completed = subprocess.run(
        [sys.executable, "-m", "gpuanat", "history", "--format", "csv"],
        cwd=REPO,
        env=cli_env(db),
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    lines = completed.stdout.split(b"\n")
    assert b"\r" not in completed.stdout and lines[-1] == b"" and len(lines) == 4, completed.stdout
    assert lines[0].startswith(b"id,") and lines[2].startswith(b"2,") and b'"with, a comma"' in lines[2]
