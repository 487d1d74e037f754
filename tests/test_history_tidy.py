"""A history you can keep tidy (issue #52): tags, deletes that ask first, tune's and fit's trials folded under their
search — through the real CLI in subprocesses, against real history files (schema 4, and the schema-3 file today's
gpuanat wrote, tests/data/v3_cpu_history.sqlite), with other processes holding or writing the history."""

from __future__ import annotations

import json
import os
import pty
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from contextlib import closing
from pathlib import Path

from conftest import REPO, TINY_CPU, cli_env, run_cli, start_cli

from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.history_schema import SCHEMA_VERSION
from gpuanat.core.vocabulary.result import RunResult

RECORDED_V3 = REPO / "tests" / "data" / "v3_cpu_history.sqlite"
"""Schema version 3, two tiny CPU runs recorded by gpuanat at 077230e (runs 1 "v3 baseline" and 2 "v3 bf16")."""
HOSTILE_TAG = "base\x1b[31mline\u202e"
"""A tag with an ANSI escape and a right-to-left override: shown escaped, kept exact in JSON."""


def _count(db: Path, sql: str, *parameters: object) -> int:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as raw:
        return raw.execute(sql, parameters).fetchone()[0]


def _no_stdin(args: list[str], db: Path) -> subprocess.CompletedProcess[str]:
    process = start_cli(args, db, stdin=subprocess.DEVNULL)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _search(store: HistoryStore, kind: str, rates: list[float | None], batches: list[int]) -> tuple[int, list[int]]:
    """A search with trials recorded as `execute_run` records them: `create_search`, `create_run(search_id=…)`, the
    result (None rate: out of memory)."""
    search_id = store.create_search(kind, f"{kind} tiny")
    run_ids = []
    for index, (rate, batch) in enumerate(zip(rates, batches, strict=True), start=1):
        run_id = store.create_run(
            {"preset": "tiny", "device": "cpu", "batch_size": batch}, name=f"{kind} {index}", search_id=search_id
        )
        store.add_steps(run_id, [{"step": 1, "elapsed_s": 0.1}])
        store.add_samples(run_id, [{"t_s": 0.0}])
        status = "ok" if rate is not None else "oom"
        store.update_result(
            run_id, RunResult(run_id=run_id, status=status, steady_samples_per_second=rate), status=status
        )
        run_ids.append(run_id)
    return search_id, run_ids


def test_a_version_3_history_is_read_as_it_is_and_upgraded_on_first_write(tmp_path):
    db = tmp_path / "history.sqlite"
    shutil.copy(RECORDED_V3, db)
    before = db.read_bytes()
    listed = run_cli(["history", "--json"], db)
    assert listed.returncode == 0, listed.stderr
    runs = json.loads(listed.stdout)
    assert [(run["id"], run["name"], run["tags"], run["search"]) for run in runs] == [
        (1, "v3 baseline", [], None),
        (2, "v3 bf16", [], None),
    ]
    tagged = run_cli(["history", "--tagged", "anything"], db)
    assert tagged.returncode == 0 and "No run tagged “anything”" in tagged.stdout
    assert db.read_bytes() == before  # reads upgrade nothing
    assert not (tmp_path / "history.sqlite-wal").exists()
    with closing(sqlite3.connect(db)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 3
    tagging = run_cli(["history", "--tag", "1", "2", "kept"], db)
    assert tagging.returncode == 0, tagging.stderr
    assert tagging.stdout == "Runs 1, 2 tagged “kept” (2 newly).\n"
    with closing(sqlite3.connect(db)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert raw.execute("PRAGMA foreign_key_check").fetchall() == []
    upgraded = json.loads(run_cli(["history", "--json", "--tagged", "kept"], db).stdout)
    assert [{**run, "tags": []} for run in upgraded] == runs  # the runs read as before, tagged now
    assert [run["tags"] for run in upgraded] == [["kept"], ["kept"]]


def test_tags_are_kept_exact_shown_escaped_and_filter_every_format(tmp_path):
    db = tmp_path / "history.sqlite"
    shutil.copy(RECORDED_V3, db)
    assert run_cli(["history", "--tag", "2", HOSTILE_TAG], db).returncode == 0
    assert run_cli(["history", "--tag", "1", "2", "bf16 study"], db).returncode == 0
    table = run_cli(["history", "--tagged", HOSTILE_TAG], db)
    assert table.returncode == 0, table.stderr
    assert "\x1b" not in table.stdout and "\u202e" not in table.stdout
    assert "v3 bf16" in table.stdout and "v3 baseline" not in table.stdout
    assert "tags" in table.stdout.splitlines()[0]
    (exact,) = json.loads(run_cli(["history", "--json", "--tagged", HOSTILE_TAG], db).stdout)
    assert exact["id"] == 2 and exact["tags"] == sorted([HOSTILE_TAG, "bf16 study"])
    markdown = run_cli(["history", "--format", "md", "--tagged", "bf16 study"], db).stdout
    assert markdown.splitlines()[0].endswith("| tags |") and len(markdown.splitlines()) == 4
    assert "\x1b" not in markdown and "base\\x1b[31mline\\u202e" in markdown
    csv_text = run_cli(["history", "--format", "csv", "--tagged", HOSTILE_TAG], db).stdout
    header, row = csv_text.splitlines()
    assert header.endswith(",tags") and row.startswith("2,") and "\x1b" not in row
    untag = run_cli(["history", "--untag", "2", HOSTILE_TAG], db)
    assert untag.returncode == 0 and untag.stdout == "Run 2 not tagged “base\\x1b[31mline\\u202e” now (1 had it).\n"
    assert json.loads(run_cli(["history", "--json", "--tagged", HOSTILE_TAG], db).stdout) == []
    # a tag's flags refuse what they cannot do, in one line, exit 2, writing nothing
    before = db.read_bytes()
    for args, says in [
        (["history", "--tag", "baseline"], "give the runs and then the tag"),
        (["history", "--tag", "1", "   "], "a tag cannot be empty or blank"),
        (["history", "--tag", "1x", "t"], "1x is not a run's number or a search (sN)"),
        (["history", "--tag", "99", "t"], "there is no run 99"),
        (["history", "--tag", "s7", "t"], "there is no search s7"),
        (["history", "--tag", "1", "t", "--json"], "--json shapes a listing"),
        (["history", "--tag", "1", "t", "--delete", "1"], "give --delete in a command of its own"),
    ]:
        refused = run_cli(args, db)
        assert (refused.returncode, refused.stdout) == (2, ""), args
        assert len(refused.stderr.splitlines()) == 1 and says in refused.stderr, (args, refused.stderr)
    assert db.read_bytes() == before


def test_run_tag_at_launch_then_delete_asks_removes_its_rows_and_its_own_log_only(tmp_path):
    db = tmp_path / "history.sqlite"
    launched = run_cli(["run", *TINY_CPU, "--tag", "launch", "--tag", HOSTILE_TAG, "--json"], db)
    assert launched.returncode == 0, launched.stderr
    (run,) = json.loads(run_cli(["history", "--json"], db).stdout)
    assert run["tags"] == sorted(["launch", HOSTILE_TAG])
    run_id = run["id"]
    own_log = tmp_path / "logs" / f"run-{run_id}.log"
    assert own_log.is_file()
    elsewhere = tmp_path / "elsewhere" / "run-2.log"  # a log path gpuanat did not write its log under
    elsewhere.parent.mkdir()
    elsewhere.write_text("not gpuanat's\n")
    with HistoryStore(db) as store:
        other = store.create_run({"preset": "tiny"}, name="imported", tags=["launch"])
        store.set_log_path(other, elsewhere)
        store.update_result(other, RunResult(run_id=other, status="ok"), status="ok")
    assert _count(db, "SELECT count(*) FROM steps WHERE run_id = ?", run_id) > 0
    assert _count(db, "SELECT count(*) FROM samples WHERE run_id = ?", run_id) > 0

    refused = _no_stdin(["history", "--delete", str(run_id)], db)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr == (
        f"gpuanat: error: --delete: it asks before it deletes, and stdin is not a terminal; add --yes to delete 1 run "
        f"({run_id}) without asking\n"
    )
    assert _count(db, "SELECT count(*) FROM runs") == 2

    deleted = _no_stdin(["history", "--delete", str(run_id), str(other), "--yes"], db)
    assert deleted.returncode == 0, deleted.stderr
    lines = deleted.stdout.splitlines()
    assert lines[0] == "Deleting 2 runs with their steps, samples, tags and logs:"
    assert lines[1].startswith(f"  run {run_id} · ") and lines[1].endswith(" · (no name) · ok")
    assert lines[2].startswith(f"  run {other} · ") and lines[2].endswith(" · “imported” · ok")
    assert lines[3:] == ["Deleted 2 runs.", f"  removed its log {own_log}"]
    assert not own_log.exists() and elsewhere.read_text() == "not gpuanat's\n"
    for table in ("steps", "samples", "run_tags"):
        assert _count(db, f"SELECT count(*) FROM {table}") == 0, table
    assert _count(db, "SELECT count(*) FROM runs") == 0


def _in_terminal(args: list[str], db: Path, answer: bytes) -> tuple[int, str]:
    """`gpuanat ARGS` with stdin and stdout on a real terminal, `answer` typed once it asks."""
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuanat", *args], cwd=REPO, env=cli_env(db), stdin=follower, stdout=follower
    )
    os.close(follower)
    output = bytearray()
    try:
        while b"[y/N] " not in output:
            chunk = os.read(leader, 65536)
            if not chunk:
                break
            output += chunk
        os.write(leader, answer)
        while chunk := os.read(leader, 65536):
            output += chunk
    except OSError:  # the terminal closes when the process has gone
        pass
    process.wait(timeout=60)
    os.close(leader)
    return process.returncode, output.decode("utf-8").replace("\r\n", "\n")


def test_delete_on_a_terminal_asks_and_no_keeps_everything(tmp_path):
    db = tmp_path / "history.sqlite"
    shutil.copy(RECORDED_V3, db)
    code, shown = _in_terminal(["history", "--delete", "2"], db, b"\n")
    assert code == 0
    assert "  run 2 · " in shown and " · “v3 bf16” · ok" in shown and "Delete it? [y/N] " in shown
    assert shown.endswith("Nothing deleted.\n")
    assert _count(db, "SELECT count(*) FROM runs") == 2
    code, shown = _in_terminal(["history", "--delete", "2"], db, b"y\n")
    assert code == 0 and shown.endswith("Deleted 1 run.\n")
    assert [run["id"] for run in json.loads(run_cli(["history", "--json"], db).stdout)] == [1]
    # its log was written on another machine, under another folder: not this history's to delete
    assert "removed its log" not in shown


def test_a_search_is_one_line_until_trials_and_its_delete_takes_every_trial(tmp_path):
    db = tmp_path / "history.sqlite"
    shutil.copy(RECORDED_V3, db)
    with HistoryStore(db) as store:
        tune_id, tune_runs = _search(store, "tune", [100.0, 140.0, None, 120.0], [4, 8, 64, 16])
        fit_id, fit_runs = _search(store, "fit", [50.0, None, 60.0], [2, 32, 8])
        store.tag_runs([tune_runs[0]], "first")
    table = run_cli(["history"], db)
    assert table.returncode == 0, table.stderr
    body = table.stdout.splitlines()
    rows = [line.split("│")[0].strip() for line in body[2:] if "│" in line]
    assert rows == ["1", "2", f"s{tune_id}", f"s{fit_id}"]
    assert f"tune tiny · 4 trials, best: run {tune_runs[1]}" in table.stdout  # the fastest that trained
    assert f"fit tiny · 3 trials, best: run {fit_runs[2]}" in table.stdout  # the largest batch that trained
    assert body[-1] == (
        f"s{tune_id}, s{fit_id}: searches (tune, fit) shown as their best trial; --trials lists every trial, "
        f"--delete s{fit_id} deletes all of them"
    )
    folded = json.loads(run_cli(["history", "--json"], db).stdout)
    assert [entry["id"] for entry in folded] == [1, 2, tune_runs[1], fit_runs[2]]
    assert folded[2]["search"] == {
        "id": tune_id,
        "kind": "tune",
        "name": "tune tiny",
        "trials": 4,
        "trial_ids": tune_runs,
    }
    every = json.loads(run_cli(["history", "--json", "--trials"], db).stdout)
    assert [entry["id"] for entry in every] == [1, 2, *tune_runs, *fit_runs]
    assert {entry["search"]["id"] for entry in every[2:6]} == {tune_id}
    # a tag's filter folds what it keeps, and says how many of the search's trials it shows
    first = run_cli(["history", "--tagged", "first"], db).stdout
    assert f"tune tiny · 1 of 4 trials, best: run {tune_runs[0]}" in first
    csv_rows = run_cli(["history", "--format", "csv"], db).stdout.splitlines()
    assert [line.split(",")[0] for line in csv_rows] == ["id", "1", "2", f"s{tune_id}", f"s{fit_id}"]

    deleted = _no_stdin(["history", "--delete", f"s{tune_id}", "--yes"], db)
    assert deleted.returncode == 0, deleted.stderr
    shown = deleted.stdout.splitlines()
    assert shown[0] == "Deleting 4 runs with their steps, samples, tags and logs:"
    assert [line.split(" · ")[0] for line in shown[1:5]] == [f"  run {run_id}" for run_id in tune_runs]
    assert all(line.endswith(f" · trial of s{tune_id} (tune)") for line in shown[1:5])
    assert shown[5] == "Deleted 4 runs."
    assert _count(db, "SELECT count(*) FROM searches") == 1
    assert _count(db, "SELECT count(*) FROM runs WHERE search_id = ?", tune_id) == 0
    assert _count(db, "SELECT count(*) FROM runs") == 5
    for table_name in ("steps", "samples", "run_tags"):
        assert _count(db, f"SELECT count(*) FROM {table_name} WHERE run_id IN (SELECT id FROM runs)") == _count(
            db, f"SELECT count(*) FROM {table_name}"
        ), table_name
    gone = _no_stdin(["history", "--delete", f"s{tune_id}", "--yes"], db)
    assert gone.returncode == 2 and gone.stderr.startswith(f"gpuanat: error: --delete: there is no search s{tune_id}")


def test_a_run_another_process_records_is_not_deleted(tmp_path):
    db = tmp_path / "history.sqlite"
    with HistoryStore(db) as store:  # this process records it: alive, still running
        run_id = store.create_run({"preset": "tiny"}, name="live")
        store.add_steps(run_id, [{"step": 1, "elapsed_s": 0.1}])
        refused = _no_stdin(["history", "--delete", str(run_id), "--yes"], db)
        assert refused.returncode == 2 and refused.stdout == ""
        assert refused.stderr == (
            f"gpuanat: error: --delete: run {run_id} is still being recorded by another process; stop it (or let it "
            "end), then delete it\n"
        )
        store.update_result(run_id, RunResult(run_id=run_id, status="ok"), status="ok")
    assert _count(db, "SELECT count(*) FROM steps") == 1
    assert _no_stdin(["history", "--delete", str(run_id), "--yes"], db).returncode == 0


def test_a_delete_waits_for_another_process_that_holds_the_history(tmp_path):
    db = tmp_path / "history.sqlite"
    shutil.copy(RECORDED_V3, db)
    assert run_cli(["history", "--tag", "1", "t"], db).returncode == 0  # upgraded: the holder's lock is the test
    holder = sqlite3.connect(db, isolation_level=None, timeout=0)
    holder.execute("BEGIN IMMEDIATE")
    deleting = start_cli(["history", "--delete", "1", "--yes"], db, stdin=subprocess.DEVNULL)
    time.sleep(3.0)  # beyond one attempt's wait for the lock (WRITE_BUSY_TIMEOUT_S)
    assert deleting.poll() is None
    assert holder.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
    holder.execute("COMMIT")
    holder.close()
    stdout, stderr = deleting.communicate(timeout=60)
    assert deleting.returncode == 0, stderr
    assert "Deleted 1 run." in stdout
    assert _count(db, "SELECT count(*) FROM runs") == 1 and _count(db, "SELECT count(*) FROM run_tags") == 0


def test_a_delete_interrupted_by_a_signal_leaves_the_history_whole(tmp_path):
    db = tmp_path / "history.sqlite"
    samples_per_run = 200_000
    with HistoryStore(db) as store:
        run_ids = [store.create_run({"preset": "tiny"}, name=f"big {index}") for index in range(2)]
        for run_id in run_ids:
            for start in range(0, samples_per_run, 50_000):
                store.add_samples(run_id, ({"t_s": float(t)} for t in range(start, start + 50_000)))
            store.update_result(run_id, RunResult(run_id=run_id, status="ok"), status="ok")
    for stop in (signal.SIGTERM, signal.SIGKILL):
        if _count(db, "SELECT count(*) FROM runs") == 0:
            break
        present = [run_id for run_id in run_ids if _count(db, "SELECT count(*) FROM runs WHERE id = ?", run_id)]
        deleting = start_cli(["history", "--delete", *map(str, present), "--yes"], db, stdin=subprocess.DEVNULL)
        assert deleting.stdout is not None
        assert deleting.stdout.readline().startswith("Deleting")  # it is about to take its transaction
        time.sleep(0.05)
        deleting.send_signal(stop)
        _, stderr = deleting.communicate(timeout=60)
        with closing(sqlite3.connect(db)) as raw:
            assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            kept = [run_id for (run_id,) in raw.execute("SELECT id FROM runs ORDER BY id")]
            counts = dict(raw.execute("SELECT run_id, count(*) FROM samples GROUP BY run_id").fetchall())
        # one transaction: every run asked for is there whole, or all of them are gone
        assert kept in (present, [run_id for run_id in run_ids if run_id not in present])
        assert counts == dict.fromkeys(kept, samples_per_run), stop
        if stop == signal.SIGTERM and kept == present:  # stopped as Ctrl-C stops a command, the write rolled back
            assert (deleting.returncode, stderr) == (128 + signal.SIGTERM, "gpuanat: interrupted\n")


def test_bad_deletes_are_one_line_and_exit_2_and_delete_nothing(tmp_path):
    db = tmp_path / "history.sqlite"
    shutil.copy(RECORDED_V3, db)
    with HistoryStore(db) as store:  # upgraded, and a run with a hostile name
        hostile = store.create_run({"preset": "tiny"}, name=HOSTILE_TAG)
        store.update_result(hostile, RunResult(run_id=hostile, status="ok"), status="ok")
    before = db.read_bytes()
    for args, says in [
        (["--delete", "12x"], "--delete: 12x is not a run's number or a search (sN)"),
        (["--delete", "0"], "--delete: 0 is not a run's number"),
        (["--delete", "s"], "--delete: s is not a run's number"),
        (["--delete", "1", "\x1b[2J"], "--delete: \\x1b[2J is not a run's number"),
        (["--delete", "1", "99", "--yes"], "--delete: there is no run 99"),
        (["--delete", "s1", "--yes"], "--delete: there is no search s1"),
        (["--delete", "1", "--limit", "1"], "--delete: --limit shapes a listing"),
        (["--yes"], "--yes answers --delete's question"),
        (["--rename", "1", "x", "--yes"], "--yes answers --delete's question; --rename asks none"),
    ]:
        refused = _no_stdin(["history", *args], db)
        assert (refused.returncode, refused.stdout) == (2, ""), args
        assert len(refused.stderr.splitlines()) == 1 and says in refused.stderr, (args, refused.stderr)
        assert "\x1b" not in refused.stderr
    assert db.read_bytes() == before
    listed = _no_stdin(["history", "--delete", str(hostile), "--yes"], db)
    assert listed.returncode == 0 and "\x1b" not in listed.stdout and "\u202e" not in listed.stdout
    assert f"  run {hostile} · " in listed.stdout and "“base\\x1b[31mline\\u202e” · ok" in listed.stdout
