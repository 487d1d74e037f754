"""The SQLite history: what is written while a run streams survives, and a dead recorder shows."""

from __future__ import annotations

import subprocess
import sys

from gpuanat.core.history import HistoryStore, default_db_path


def test_run_lifecycle(tmp_path):
    with HistoryStore(tmp_path / "h.sqlite") as store:
        run_id = store.create_run({"batch_size": 4}, name="vanilla")
        store.add_steps(run_id, [{"step": 1, "elapsed_s": 0.1, "samples": 4}, {"step": 2, "elapsed_s": 0.2}])
        store.add_samples(run_id, [{"t_s": 5.0, "gpus": []}])
        assert store.run(run_id).status == "running"  # its recorder (this process) is alive
        store.update_result(run_id, {"status": "ok", "samples_per_second": 9.5}, status="ok")
        run = store.run(run_id)
    assert run.status == "ok" and run.name == "vanilla" and run.finished_at >= run.created_at
    assert run.result["samples_per_second"] == 9.5
    with HistoryStore(tmp_path / "h.sqlite") as reopened:
        assert [step["step"] for step in reopened.steps(run_id)] == [1, 2]
        assert reopened.samples(run_id) == [{"t_s": 5.0, "gpus": []}]


def test_a_run_whose_recorder_died_reads_as_interrupted(tmp_path):
    db = tmp_path / "h.sqlite"
    code = ("from gpuanat.core.history import HistoryStore\n"
            f"s = HistoryStore({str(db)!r}); r = s.create_run({{'batch_size': 4}})\n"
            "s.add_steps(r, [{'step': 1, 'elapsed_s': 0.5}])\n"
            "import os; os._exit(0)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
    with HistoryStore(db) as store:
        (run,) = store.runs()
        assert run.status == "interrupted"
        assert store.steps(run.id) == [{"step": 1, "elapsed_s": 0.5}]


def test_db_location_follows_env_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUANAT_DB", str(tmp_path / "x.sqlite"))
    assert default_db_path() == tmp_path / "x.sqlite"
    monkeypatch.delenv("GPUANAT_DB")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    assert default_db_path() == tmp_path / "data" / "gpuanat" / "history.sqlite"
