"""The loss (issue #52, item 3): what the training loop logged — loss, learning rate, gradients' norm — from every
probe, in the result (`final_loss`, `min_loss`, `loss_curve`), the history, compare and Prometheus; real runs on the
CPU, checked against what the loop itself printed or wrote down."""

from __future__ import annotations

import ast
import csv
import io
import json
import math
import re
import sqlite3
from pathlib import Path

import pytest
from conftest import REPO, TINY_CPU, last_json, run_cli

from gpuanat.core.measure.loss_curve import LOSS_CURVE_POINTS, NO_LOSS_REASON, LossCurve, downsampled
from gpuanat.core.store.compare import compare_runs
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.protocol import Step, decode, encode
from gpuanat.core.vocabulary.result import RunResult

pytestmark = pytest.mark.xdist_group("test_loss")
"""Four of its tests share a module-scoped real run: pytest-xdist gives them all to one worker (`--dist loadgroup`),
so that run trains once, not once on each worker."""

TRAINER_SAMPLES = "120"
"""30 steps of 4 samples: the Trainer logs at steps 10, 20 and 30 (gpuanat's LOGGING_STEPS)."""


def trainer_logs(log_text: str) -> list[dict[str, str]]:
    """The dicts HF Trainer printed in the run's log (its ProgressCallback writes each float as f"{v:.4g}")."""
    return [ast.literal_eval(found) for found in re.findall(r"\{'loss': [^}]*\}", log_text)]


@pytest.fixture(scope="module")
def trainer_run(tmp_path_factory):
    db = tmp_path_factory.mktemp("loss") / "history.sqlite"
    completed = run_cli(["run", *TINY_CPU, "--samples", TRAINER_SAMPLES, "--json", "--name", "logged"], db)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    return result, db, Path(result["log_path"]).read_text()


def test_a_trainer_run_s_result_has_the_loss_the_trainer_logged(trainer_run):
    result, db, log_text = trainer_run
    logs = trainer_logs(log_text)
    assert len(logs) == 3, log_text[-2000:]
    curve = result["loss_curve"]
    assert [step for step, _ in curve] == [10, 20, 30]
    # each point is the loss the Trainer printed at that log, to the digits it printed
    assert [f"{loss:.4g}" for _, loss in curve] == [log["loss"] for log in logs]
    assert f"{result['final_loss']:.4g}" == logs[-1]["loss"]  # the last log: after the last step's end
    assert result["min_loss"] == min(loss for _, loss in curve)
    assert "final_loss" not in result["unavailable"]
    assert result["train_loss"] is not None and result["final_loss"] != result["train_loss"]  # not the run's mean
    # every step after a log carries it, with the learning rate and gradients' norm the Trainer logged with it
    with HistoryStore(db, read_only=True) as store:
        steps = store.steps(result["run_id"])
    after_first_log = next(step for step in steps if step["step"] == 11)
    assert after_first_log["loss_step"] == 10
    assert f"{after_first_log['learning_rate']:.4g}" == logs[0]["learning_rate"]
    assert f"{after_first_log['grad_norm']:.4g}" == logs[0]["grad_norm"]
    assert all(step["loss_step"] is None for step in steps if step["step"] <= 10)


def test_the_history_shows_the_loss_in_every_format(trainer_run):
    result, db, _ = trainer_run
    table = run_cli(["history", "--db", str(db)], None, extra_env={"COLUMNS": "200"})
    assert table.returncode == 0, table.stderr
    header, *rows = [line for line in table.stdout.splitlines() if "┃" in line or "│" in line]
    assert "loss" in header.split("┃")[10], header
    shown = f"{result['final_loss']:.4g}"
    assert any(shown in row for row in rows), table.stdout
    markdown = run_cli(["history", "--db", str(db), "--format", "md"], None).stdout
    titles = [cell.strip() for cell in markdown.splitlines()[0].strip("|").split("|")]
    cells = [cell.strip() for cell in markdown.splitlines()[2].strip("|").split("|")]
    assert cells[titles.index("loss")] == shown
    (row,) = csv.DictReader(io.StringIO(run_cli(["history", "--db", str(db), "--format", "csv"], None).stdout))
    assert float(row["loss"]) == result["final_loss"]
    (entry,) = json.loads(run_cli(["history", "--db", str(db), "--json"], None).stdout)
    assert entry["result"]["loss_curve"] == result["loss_curve"]


def test_compare_gives_the_final_and_lowest_loss_lower_being_better(trainer_run):
    result, _, _ = trainer_run
    first = RunResult.from_json(result)
    better = RunResult.from_json({**result, "final_loss": result["final_loss"] / 2, "min_loss": result["min_loss"]})
    comparison = compare_runs([1, 2], [{}, {}], [first, better])
    rows = {row.key: row for row in comparison.metrics}
    assert rows["final_loss"].values == (result["final_loss"], result["final_loss"] / 2)
    assert rows["final_loss"].deltas_percent[1] == pytest.approx(-50.0)
    assert "lower is better" in rows["final_loss"].label and rows["min_loss"].deltas_percent[1] == 0
    # runs recorded before the loss was kept: no rows of dashes
    older = RunResult.from_json({key: value for key, value in result.items() if "loss" not in key})
    assert "final_loss" not in {row.key for row in compare_runs([1, 2], [{}, {}], [older, older]).metrics}


def test_history_compare_gives_the_final_and_lowest_loss_of_recorded_runs(trainer_run, tmp_path):
    first, trainer_db, _ = trainer_run
    db = tmp_path / "history.sqlite"
    with sqlite3.connect(trainer_db) as source, sqlite3.connect(db) as copy:  # the module's run, and one more here
        source.backup(copy)
    completed = run_cli(["run", *TINY_CPU, "--samples", TRAINER_SAMPLES, "--batch-size", "8", "--json"], db)
    assert completed.returncode == 0, completed.stderr[-3000:]
    second = last_json(completed.stdout)
    ids = [str(first["run_id"]), str(second["run_id"])]
    table = run_cli(["history", "--db", str(db), "--compare", *ids], None)
    assert table.returncode == 0, table.stderr
    final_row = next(line for line in table.stdout.splitlines() if "final loss" in line)
    assert f"{first['final_loss']:.4g}" in final_row and f"{second['final_loss']:.4g}" in final_row, table.stdout
    assert "batch_size" in table.stdout  # the technique that differs
    compared = json.loads(run_cli(["history", "--db", str(db), "--compare", *ids, "--json"], None).stdout)
    rows = {row["key"]: row for row in compared["metrics"]}
    assert rows["final_loss"]["values"] == [first["final_loss"], second["final_loss"]]
    assert rows["min_loss"]["values"] == [first["min_loss"], second["min_loss"]]
    assert compared["differing"]["batch_size"] == [4, 8]
    markdown = run_cli(["history", "--db", str(db), "--compare", *ids, "--format", "md"], None).stdout
    assert any(line.startswith("| min loss (lower is better) |") for line in markdown.splitlines()), markdown
    for bad in ([ids[0]], [ids[0], "999"], [ids[0], "x"]):  # one line and exit 2, nothing written
        refused = run_cli(["history", "--db", str(db), "--compare", *bad], None)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr


def test_a_plain_loop_gives_its_loss_learning_rate_and_grad_norm_through_track(tmp_path):
    written = tmp_path / "losses.jsonl"
    completed = run_cli(
        [
            "run",
            "--json",
            "--script",
            str(REPO / "tests" / "scripts" / "tiny_plain_loop.py"),
            "--",
            "--probe",
            "--loss-log",
            str(written),
        ],
        tmp_path / "history.sqlite",
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    lines = [json.loads(line) for line in written.read_text().splitlines()]
    assert len(lines) == result["steps"] == 16
    # tensors are read every 10 steps and at the last (16): exactly the values the loop had then
    read = [line for line in lines if line["step"] in (10, 16)]
    assert result["loss_curve"] == [[line["step"], line["loss"]] for line in read]
    assert result["final_loss"] == read[-1]["loss"] and result["min_loss"] == min(line["loss"] for line in read)
    with HistoryStore(tmp_path / "history.sqlite", read_only=True) as store:
        steps = store.steps(result["run_id"])
    step_11 = next(step for step in steps if step["step"] == 11)
    assert (step_11["loss_step"], step_11["grad_norm"]) == (10, read[0]["grad_norm"])
    assert step_11["learning_rate"] == read[0]["learning_rate"]


def test_lightning_s_probe_gives_the_loss_lightning_logs_and_its_learning_rate(tmp_path):
    written = tmp_path / "losses.jsonl"
    script = str(REPO / "tests" / "scripts" / "tiny_lightning.py")
    completed = run_cli(
        ["run", "--json", "--script", script, "--", "--probe", "--loss-log", str(written)], tmp_path / "history.sqlite"
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    losses = {line["step"]: line["loss"] for line in map(json.loads, written.read_text().splitlines())}
    assert len(losses) == result["steps"] == 16
    # Lightning logs every 5 steps here (log_every_n_steps=5), and the probe reads the last step's too
    assert result["loss_curve"] == [[step, losses[step]] for step in (5, 10, 15, 16)]
    assert result["final_loss"] == losses[16]
    with HistoryStore(tmp_path / "history.sqlite", read_only=True) as store:
        step_6 = store.steps(result["run_id"])[5]
    assert (step_6["step"], step_6["loss_step"], step_6["learning_rate"]) == (6, 5, 1e-4)  # the AdamW's lr


def test_a_run_whose_loop_logs_no_loss_says_why(tmp_path):
    completed = run_cli(["run", *TINY_CPU, "--json"], tmp_path / "history.sqlite")  # 8 steps: no log at 10
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert (result["final_loss"], result["min_loss"], result["loss_curve"]) == (None, None, None)
    assert result["unavailable"]["final_loss"] == NO_LOSS_REASON == result["unavailable"]["loss_curve"]


def test_nan_and_infinity_travel_as_null():
    step = Step(
        step=3, samples=12, tokens=384, step_time_s=0.1, elapsed_s=1.0, loss=math.nan, loss_step=3,
        learning_rate=math.inf, grad_norm=2.0,
    )  # fmt: skip
    decoded = decode(encode(step))
    assert isinstance(decoded, Step)
    assert (decoded.loss, decoded.learning_rate, decoded.grad_norm, decoded.loss_step) == (None, None, 2.0, 3)
    curve = LossCurve()
    assert curve.observe(decoded) and curve.points == [] and curve.result_values()[0]["final_loss"] is None


def test_a_long_curve_keeps_its_shape_in_500_points():
    """A loss that falls with a spike in the middle: downsampled, the first and last points, the spike and the
    lowest loss survive, in step order."""
    points = [(step, 10.0 / (1 + step / 1000)) for step in range(1, 100_001)]
    points[50_000] = (points[50_000][0], 99.0)
    kept = downsampled(points)
    assert len(kept) <= LOSS_CURVE_POINTS
    assert kept[0] == points[0] and kept[-1] == points[-1]
    assert (points[50_000][0], 99.0) in kept
    assert min(loss for _, loss in kept) == min(loss for _, loss in points)
    assert [step for step, _ in kept] == sorted(step for step, _ in kept)
    curve = LossCurve()
    for step, loss in points:
        curve.add(step, loss)
    values, _ = curve.result_values()
    assert len(values["loss_curve"]) <= LOSS_CURVE_POINTS and values["min_loss"] == min(p[1] for p in points)
    assert values["final_loss"] == points[-1][1] and [loss for _, loss in values["loss_curve"] if loss > 50] == [99.0]


def test_a_runs_summary_gives_the_last_and_lowest_logged_loss():
    """`gpuanat run`'s summary of the packed qwen2.5-0.5b run recorded on the H100 (benchmarks/results/h100/data52/),
    and of a result whose loop logged no loss."""
    from gpuanat.cli.run_text import loss_lines

    recorded = Path(__file__).resolve().parent.parent / "benchmarks/results/h100/data52/run_pack.json"
    packed = RunResult.from_json(json.loads(recorded.read_text().splitlines()[-1]))
    assert packed.loss_curve is not None and packed.final_loss == packed.loss_curve[-1][1]
    assert loss_lines(packed) == [
        f"Loss: {packed.final_loss:.4g} at the last log (step {packed.loss_curve[-1][0]:.0f}), lowest "
        f"{packed.min_loss:.4g}; the run's mean {packed.train_loss:.4g}"
    ]
    silent = RunResult.from_json({"status": "ok", "unavailable": {"final_loss": "the loop logged no loss"}})
    assert loss_lines(silent) == ["Loss: — (the loop logged no loss)"]
