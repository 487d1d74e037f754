"""`gpuanat explain [RUN]` and the run summary of an out-of-memory run, on real data: the history of out-of-memory runs
recorded on an H200 (tests/data/h200_oom_history.sqlite), a real tiny run on the CPU, a result as an earlier gpuanat
stored it, and bad input — every command a real CLI subprocess.

The expected values are read from the stored results, never written here: the recorded history may be replaced by a
fuller recording of the same kinds of runs.
"""

from __future__ import annotations

import hashlib
import json
import shlex
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, run_cli

from gpuanat.cli.run import print_named_summary
from gpuanat.core.printable import printable
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.report import format_bytes
from gpuanat.core.vocabulary.protocol import MODULES_REST
from gpuanat.core.vocabulary.result import RunResult

pytestmark = pytest.mark.xdist_group("test_explain")
"""Its CPU-run tests share a module-scoped real run: pytest-xdist gives them all to one worker."""

H200_OOM_HISTORY = REPO / "tests" / "data" / "h200_oom_history.sqlite"
HOSTILE_NAME = "oom \x1b[31m[bold]red[/bold]\x1b]0;title\x07\nsecond line \u202e"
"""A run name with escape sequences, a bell, a newline, a bidi override and Rich markup."""


def recorded_runs() -> dict[int, dict[str, Any]]:
    """The recorded H200 history's runs as stored: id -> its name, kind, status and result (read-only)."""
    with closing(sqlite3.connect(f"file:{H200_OOM_HISTORY}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT id, name, kind, status, result_json FROM runs ORDER BY id").fetchall()
    return {
        run_id: {"name": name, "kind": kind, "status": status, "result": json.loads(result)}
        for run_id, name, kind, status, result in rows
    }


RECORDED = recorded_runs()


def explain(args: list[str], db: Path) -> tuple[str, str]:
    """`gpuanat explain ARGS --db DB`: its stdout and stderr; it must succeed."""
    completed = run_cli(["explain", *args, "--db", str(db)], None, timeout_s=60)
    assert completed.returncode == 0, completed.stderr
    assert completed.stderr == "", completed.stderr
    return completed.stdout, completed.stderr


def explained_json(args: list[str], db: Path) -> dict[str, Any]:
    stdout, _ = explain([*args, "--json"], db)
    assert len(stdout.strip().splitlines()) == 1
    return json.loads(stdout)


def refused(args: list[str]) -> str:
    """`gpuanat ARGS`, which must be refused: one line on stderr, exit 2, nothing on stdout. That line."""
    completed = run_cli(args, None, timeout_s=60)
    lines = completed.stderr.strip().splitlines()
    assert completed.returncode == 2 and len(lines) == 1, (completed.returncode, completed.stderr)
    assert lines[0].startswith("gpuanat: error: ") and "Traceback" not in completed.stderr
    assert completed.stdout == ""
    return lines[0]


def fingerprint(path: Path) -> dict[str, str]:
    """sha256 of the history and of any -wal or -shm beside it."""
    return {
        entry.name: hashlib.sha256(entry.read_bytes()).hexdigest()
        for entry in path.parent.iterdir()
        if entry.name.startswith(path.name)
    }


@pytest.mark.parametrize("run_id", sorted(RECORDED))
def test_explain_of_each_recorded_h200_oom_run_says_what_its_result_holds(run_id):
    """Text and JSON from the stored result: the failure's phase, module, operation, allocation and how far over the
    free memory it was; the bands and modules at the failure; the largest tensors; the prediction against what was
    allocated; what would fit. What a result lacks is said, with why. The history stays byte-identical."""
    recorded = RECORDED[run_id]
    stored, name = recorded["result"], recorded["name"]
    before = fingerprint(H200_OOM_HISTORY)
    text, _ = explain([str(run_id)], H200_OOM_HISTORY)
    explained = explained_json([str(run_id)], H200_OOM_HISTORY)
    assert fingerprint(H200_OOM_HISTORY) == before

    assert text.splitlines()[0].startswith(f"Run {run_id}: {recorded['status']} — ")
    assert (explained["run_id"], explained["status"], explained["name"]) == (run_id, recorded["status"], name)
    if name is not None:
        assert f"Name: {printable(name)}" in text
    assert explained["bands"] == stored.get("bands")
    assert explained["modules"] == stored.get("modules")
    failure = stored.get("out_of_memory")
    assert explained["out_of_memory"] == failure

    if failure is not None:
        assert explained["at"] == "failure" and "Memory at its failure, by band:" in text
        failed, free = failure["failed_allocation_bytes"], failure["device_free_bytes"]
        assert explained["over_bytes"] == failed - free
        sentence = next(line for line in text.splitlines() if line.startswith("Out of memory "))
        assert f"in the {failure['phase']}" in sentence and f"step {failure['step']}" in sentence
        assert f"tried to allocate {format_bytes(failed)} with {format_bytes(free)} free" in sentence
        if failed > free:
            assert f"{format_bytes(failed - free)} more than the GPU had free" in sentence
        if failure["module"] is not None:
            assert printable(failure["module"]) in sentence
        if failure["operation"]:
            assert printable(failure["operation"]) in sentence
        tensors = text.split("Largest live tensors at the failure:\n", 1)[1].splitlines()
        for tensor, line in zip(failure["largest_tensors"], tensors, strict=False):
            words = [*tensor["band"].split(), tensor["module"]]  # a band of two words: "optimizer state"
            assert line.split()[: len(words)] == words
            assert "×".join(map(str, tensor["shape"])) in line and tensor["dtype"] in line
        if failure.get("snapshot_path"):
            assert f"Out-of-memory snapshot: {printable(failure['snapshot_path'])}" in text
    else:
        assert explained["at"] == "peak" and "Memory at its peak, by band:" in text
        assert "out_of_memory" in explained["missing"]
        assert f"the failing allocation was not recorded: {explained['missing']['out_of_memory']}" in text

    if stored.get("modules") is not None:
        for row in stored["modules"]:
            assert any(line.startswith(f"  {row['module']}  ") for line in text.splitlines()), row["module"]
    else:
        why = explained["missing"]["modules"]
        assert why and f"by module: not recorded — {why}." in text

    predicted = stored.get("predicted")
    if predicted is not None:
        check = explained["prediction"]
        assert check["predicted_peak_allocated_bytes"] == predicted["peak_allocated_bytes"]
        measured = (
            failure["allocated_bytes"] + failure["failed_allocation_bytes"]
            if failure is not None
            else stored["peak_allocated_bytes"]
        )
        assert check["measured_bytes"] == measured and check["measured_is_a_floor"]
        assert check["missed_bytes"] == predicted["peak_allocated_bytes"] - measured
        assert f"Prediction before the run: peak {format_bytes(predicted['peak_allocated_bytes'])} allocated" in text
        assert format_bytes(measured) in text and format_bytes(abs(check["missed_bytes"])) in text
    else:
        assert f"Prediction before the run: none — {explained['missing']['prediction']}." in text

    would_fit = explained["would_fit"]
    if "script" in stored["config"] or recorded["kind"] != "launched":
        assert would_fit is None and f"What would fit: not predicted — {explained['missing']['would_fit']}" in text
        return
    assert would_fit is not None and "What would fit: " in text
    if would_fit["command"] is None:
        assert would_fit["ideas"] and all(idea in text for idea in would_fit["ideas"])
        return
    assert would_fit["command"] in text
    words = shlex.split(would_fit["command"])
    if would_fit["flags"]:  # the ladder's steps up to the one predicted to fit, added to the run's own flags
        assert would_fit["command"].endswith(" ".join(would_fit["flags"]))
    else:  # no step fits: the largest smaller batch predicted to fit
        assert 0 < would_fit["max_batch_size"] < stored["config"]["batch_size"]
        assert words[words.index("--batch-size") + 1] == str(would_fit["max_batch_size"])
    # the command is predicted to fit: `gpuanat predict` with its flags, for this GPU, needs no step of the ladder
    assert words[:2] == ["gpuanat", "run"]
    predicted_run = run_cli(
        ["predict", *words[2:], "--gpu-memory", f"{would_fit['gpu_memory_bytes']}B", "--json"], None, timeout_s=60
    )
    assert predicted_run.returncode == 0, predicted_run.stderr
    assert json.loads(predicted_run.stdout)["fit_ladder"] == []


def test_the_recorded_history_holds_out_of_memory_runs_with_their_failure():
    """What the test above reads: out-of-memory runs, some with the failing allocation and memory by module."""
    assert RECORDED and all(run["status"] == "oom" for run in RECORDED.values())
    assert any(run["result"].get("out_of_memory") and run["result"].get("modules") for run in RECORDED.values())


def test_the_last_run_is_explained_by_default():
    last = max(RECORDED)
    assert explained_json([], H200_OOM_HISTORY) == explained_json([str(last)], H200_OOM_HISTORY)


def test_an_oom_runs_summary_says_what_failed_and_the_top_modules_after_its_bands(capsys):
    """The summary of each recorded run with a failing allocation: after the bands (the failure's), the failing
    allocation in one line, the three modules holding the most activations, and the explain command."""
    for recorded in RECORDED.values():
        result = RunResult.from_json(recorded["result"])
        failure = result.out_of_memory
        if failure is None:
            continue
        print_named_summary(result, recorded["name"], H200_OOM_HISTORY)
        lines = capsys.readouterr().out.splitlines()
        after_bands = lines.index(
            "  (at the allocation that failed: activations are the tensors saved for backward so far)"
        )
        log = next(index for index, line in enumerate(lines) if line.startswith("Log: "))
        added = lines[after_bands + 1 : log]
        assert len(added) <= 3, added
        assert added[0].startswith(f"Out of memory in the {failure['phase']}")
        assert (
            f"step {failure['step']}: tried to allocate {format_bytes(failure['failed_allocation_bytes'])}" in added[0]
        )
        if failure["module"] is not None:
            assert printable(failure["module"]) in added[0]
        held = sorted(
            (row for row in result.modules or [] if row["module"] != MODULES_REST and row["activations_bytes"]),
            key=lambda row: -row["activations_bytes"],
        )[:3]
        if held:
            assert added[1].startswith("Most activations, by module: ")
            for row in held:
                assert f"{row['module']} {format_bytes(row['activations_bytes'])}" in added[1]
        assert added[-1] == (
            f"gpuanat explain {result.run_id} --db {shlex.quote(str(H200_OOM_HISTORY))} for the whole anatomy"
        )


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory) -> tuple[Path, str, dict[str, Any]]:
    """A real tiny run on the CPU, named with controls and markup: its history, its summary, its stored result."""
    db = tmp_path_factory.mktemp("explain") / "history.sqlite"
    completed = run_cli(
        ["run", "--preset", "tiny", "--device", "cpu", "--max-steps", "3", "--name", HOSTILE_NAME, "--db", str(db)],
        None,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    with HistoryStore(db, read_only=True) as store:
        row = store.runs()[-1]
    return db, completed.stdout, row.result.to_json()


def test_explain_of_a_cpu_run_shows_its_memory_by_module(cpu_run):
    db, _, stored = cpu_run
    assert stored["modules"], "the probe followed no module"
    text, _ = explain([], db)
    explained = explained_json(["1"], db)
    assert explained["modules"] == stored["modules"] and explained["bands"] == stored["bands"]
    assert explained["at"] == "peak" and explained["out_of_memory"] is None and explained["would_fit"] is None
    assert "Memory at its peak, by module:" in text
    table = text.split("Memory at its peak, by module:\n", 1)[1].splitlines()
    assert table[0].split() == ["module", "activations", "parameters", "gradients", "optimizer", "state"]
    for row, line in zip(stored["modules"], table[1:], strict=False):
        label = "(the model)" if row["module"] == "" else row["module"]
        assert line.startswith(f"  {label}  ")
    assert len(table) > len(stored["modules"])
    # a CPU run has no allocator peak: the prediction says so instead of a miss
    assert explained["prediction"]["measured_bytes"] is None
    assert f"({stored['unavailable']['peak_allocated_bytes']})" in text


def test_a_run_name_with_controls_and_markup_is_shown_escaped(cpu_run):
    db, summary, _ = cpu_run
    text, _ = explain([], db)
    assert f"Name: {printable(HOSTILE_NAME)}" in text
    assert "\x1b" not in text and "\x07" not in text and "\u202e" not in text
    assert explained_json([], db)["name"] == HOSTILE_NAME  # JSON keeps it exact
    assert f"Name: {printable(HOSTILE_NAME)}" in summary


def test_a_runs_summary_points_at_explain_for_memory_by_module(cpu_run):
    db, summary, stored = cpu_run
    assert f"Memory by module: gpuanat explain {stored['run_id']} --db {shlex.quote(str(db))}" in summary.splitlines()


def test_a_result_recorded_before_memory_by_module_explains_what_it_has(tmp_path):
    """An out-of-memory run as an earlier gpuanat stored it (no `modules`, no `out_of_memory`): its bands, its
    prediction and what would fit, and what it lacks said with why."""
    recorded = next(run for run in RECORDED.values() if run["result"].get("out_of_memory"))
    old = {key: value for key, value in recorded["result"].items() if key not in ("modules", "out_of_memory")}
    db = tmp_path / "history.sqlite"
    with HistoryStore(db) as store:
        run_id = store.create_run(old["config"], name=recorded["name"])
        store.update_result(run_id, RunResult.from_json(old), status="oom")
    text, _ = explain([str(run_id)], db)
    explained = explained_json([str(run_id)], db)
    assert explained["bands"] == old["bands"] and explained["at"] == "peak"
    assert explained["modules"] is None and explained["out_of_memory"] is None
    assert "earlier gpuanat" in explained["missing"]["modules"]
    assert "earlier gpuanat" in explained["missing"]["out_of_memory"]
    assert f"by module: not recorded — {explained['missing']['modules']}." in text
    assert f"the failing allocation was not recorded: {explained['missing']['out_of_memory']}" in text
    assert f"peak {format_bytes(old['predicted']['peak_allocated_bytes'])} allocated" in text
    assert explained["prediction"]["measured_bytes"] == old["peak_allocated_bytes"]
    assert explained["would_fit"] is not None and "What would fit: " in text


@pytest.mark.parametrize(
    ("key", "value"), [("model", "someone/not-in-this-cache"), ("preset", "a-preset-of-a-later-gpuanat")]
)
def test_a_run_this_machine_cannot_describe_still_gets_what_to_try(tmp_path, key, value):
    """A history from another box: its run's --model is not in this machine's cache, or its preset is one this version
    does not know, so no ladder is predicted; the techniques not on yet are said, and why there is no prediction."""
    recorded = next(run for run in RECORDED.values() if run["result"].get("out_of_memory"))
    result = {**recorded["result"], "config": {**recorded["result"]["config"], key: value}}
    db = tmp_path / "history.sqlite"
    with HistoryStore(db) as store:
        run_id = store.create_run(result["config"])
        store.update_result(run_id, RunResult.from_json(result), status="oom")
    text, _ = explain([str(run_id)], db)
    would_fit = explained_json([str(run_id)], db)["would_fit"]
    assert would_fit["command"] is None and value in would_fit["not_predicted"]
    assert "What would fit: not predicted here (" in text and "a smaller --batch-size" in text


def test_an_unknown_run_is_refused_in_one_line():
    unknown = max(RECORDED) + 1000
    line = refused(["explain", str(unknown), "--db", str(H200_OOM_HISTORY)])
    assert f"no run {unknown}" in line and f"its last is run {max(RECORDED)}" in line


@pytest.mark.parametrize("run", ["abc", "0", "1.5", "3x"])
def test_a_run_that_is_not_a_runs_number_is_refused_in_one_line(run):
    line = refused(["explain", run, "--db", str(H200_OOM_HISTORY)])
    assert "RUN must be a run's number" in line


def test_an_empty_history_is_refused_in_one_line_and_nothing_is_created(tmp_path):
    missing = tmp_path / "new.sqlite"
    assert "has no runs yet" in refused(["explain", "--db", str(missing)])
    assert list(tmp_path.iterdir()) == []
    empty = tmp_path / "empty.sqlite"
    HistoryStore(empty).close()
    assert "has no runs yet" in refused(["explain", "--db", str(empty)])
    assert "has no runs yet" in refused(["explain", "1", "--db", str(empty)])


@pytest.mark.parametrize("make", ["garbage", "text", "directory", "missing folder"])
def test_an_unreadable_history_is_refused_in_one_line_and_left_untouched(tmp_path, make):
    db = tmp_path / "history.sqlite"
    if make == "garbage":
        db.write_bytes(bytes(range(256)) * 64)
    elif make == "text":
        db.write_text("not a history\n")
    elif make == "directory":
        db.mkdir()
    else:
        db = tmp_path / "no" / "such" / "history.sqlite"
    listing = sorted(tmp_path.rglob("*"))
    before = db.read_bytes() if db.is_file() else None
    line = refused(["explain", "--db", str(db)])
    assert str(db) in line and "--db" in line
    assert sorted(tmp_path.rglob("*")) == listing
    assert (db.read_bytes() if db.is_file() else None) == before


def test_explain_imports_no_torch_and_its_help_says_what_it_shows():
    """A read of the history: seconds matter, so no torch (the history command's rule, test_import_hygiene)."""
    code = (
        "import sys\nfrom gpuanat.cli import main\n"
        f"main(['explain', '--db', {str(H200_OOM_HISTORY)!r}])\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert completed.stdout.strip().splitlines()[-1] == "NO-TORCH"
    assert "explain" in run_cli(["--help"], None, timeout_s=60).stdout
    help_text = " ".join(run_cli(["explain", "--help"], None, timeout_s=60).stdout.split())
    for words in ("RUN", "the last run", "--db", "--json", "by band and by module", "predicted to fit", "Exit codes"):
        assert words in help_text, words
