"""`gpuanat tune` for real on the CPU: the tiny BERT's trials are real runs in real child processes, recorded in a
real history; pruning is the real prediction for a GPU of the --gpu-memory given; an out-of-memory trial comes
from the test hook in tests/fault_injection (CI has no GPU to run out of)."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import sqlite3
import time

import pytest
from conftest import last_json, run_cli, start_cli

from gpuanat.cli.common import config_from_args
from gpuanat.cli.parser import build_parser
from gpuanat.core.memory.predict import max_batch_size
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import RunConfig

pytestmark = pytest.mark.xdist_group("test_tune_cpu")
"""Its tests share a module-scoped real run: pytest-xdist gives them all to one worker (`--dist loadgroup`)."""

GPU_MEMORY = "1509MiB"
"""Small enough that the prediction bounds the tiny BERT at seq 32: batch 34 fits with SDPA, 31 with eager
attention (the CUDA context and the driver's share take 1.35 GiB of it); 64 does not."""
TUNE = [
    "tune",
    "--device",
    "cpu",
    "--preset",
    "tiny",
    "--seq-len",
    "32",
    "--gpu-memory",
    GPU_MEMORY,
    "--search",
    "batch,attn",
    "--trial-steps",
    "4",
    "--budget",
    "3",
]
TRIAL_STEPS = 4


def search_config(entry: dict) -> RunConfig:
    return RunConfig.from_json(entry["config"])


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
    db = tmp_path_factory.mktemp("tune") / "history.sqlite"
    # Batches above 16 run out of memory: the start (32, the largest power of two predicted to fit) does.
    completed = run_cli([*TUNE, "--json", "--tag", "tuned"], db, fault="oom-above@16", timeout_s=600)
    assert completed.returncode == 0, completed.stderr[-3000:]
    with HistoryStore(db) as store:
        runs = {run.id: run for run in store.runs()}
    return last_json(completed.stdout), runs, completed.stderr, db


def test_json_contract(tuned):
    summary, *_ = tuned
    assert set(summary) >= {
        "status",
        "device",
        "gpu_memory_bytes",
        "usable_memory_bytes",
        "budget_s",
        "trial_steps",
        "elapsed_s",
        "searched",
        "held",
        "memory_source",
        "memory_source_description",
        "trials",
        "pruned",
        "front",
        "best",
    }
    assert summary["status"] in ("converged", "budget") and summary["device"] == "cpu"
    assert summary["searched"] == ["batch", "attn"] and summary["held"] == []
    assert summary["gpu_memory_bytes"] == 1509 * 2**20 and summary["trial_steps"] == TRIAL_STEPS
    # a CPU run measures no GPU memory: the front's memory axis is the prediction, and says so
    assert summary["memory_source"] == "predicted_peak_allocated_bytes"
    for trial in summary["trials"]:
        assert set(trial) >= {
            "index",
            "name",
            "run_id",
            "status",
            "dimension",
            "kept",
            "config",
            "techniques",
            "samples_per_second",
            "rate_source",
            "peak_memory_bytes",
            "wall_s",
            "error",
        }
        assert trial["name"].startswith(f"tune {trial['index']}: ")
    assert summary["best"]["command"].startswith("gpuanat run ")


def test_an_oom_start_steps_down_and_rules_the_batch_out(tuned):
    summary, _, stderr, _ = tuned
    trials = summary["trials"]
    assert [(t["config"]["batch_size"], t["status"], t["dimension"]) for t in trials[:2]] == [
        (32, "oom", "start"),
        (16, "ok", "start"),
    ]
    assert "out of memory" in trials[0]["error"].lower() or "OutOfMemory" in trials[0]["error"]
    assert trials[1]["kept"]
    # after the OOM no batch of 32 or more with the same techniques was tried again
    sdpa = [t for t in trials[1:] if t["config"]["attn"] == "sdpa"]
    assert all(t["config"]["batch_size"] < 32 for t in sdpa)
    assert "tune 1: bs32 — oom" in stderr


def test_each_trial_says_the_time_left_by_the_trials_left(tuned):
    """Issue #48, point 5: the time left is the trials still to run if no move helps, each at the measured time of
    the trials done (start-up included; no compiled trial here, so every kind is timed), and more only if a move
    helps; the last trial of a search that converged has none left."""
    summary, _, stderr, _ = tuned
    lines = [line for line in stderr.splitlines() if re.match(r"tune \d+: ", line)]
    assert len(lines) == len(summary["trials"])
    for line in lines:
        assert re.search(
            r"about \d+:\d\d left \(\d+ trials?; more if a move helps\)$|no trial left unless a move helps$", line
        ), line
    if summary["status"] == "converged":
        assert lines[-1].endswith("no trial left unless a move helps"), lines[-1]


def test_pruned_candidates_never_ran(tuned):
    summary, runs, *_ = tuned
    usable = summary["usable_memory_bytes"]
    assert summary["pruned"], "the prediction bounded nothing"
    for refused in summary["pruned"]:
        config = search_config(refused)
        assert config.batch_size > max_batch_size(config, usable), refused
        assert refused["reason"].startswith("predicted not to fit")
    assert any(refused["config"]["batch_size"] == 64 for refused in summary["pruned"])  # the start's bound
    tried = [search_config(trial) for trial in summary["trials"]]
    for config in tried:
        assert config.batch_size <= max_batch_size(config, usable), config
    assert not {search_config(refused) for refused in summary["pruned"]} & set(tried)
    # and the history holds exactly the trials: nothing else ran
    assert sorted(runs) == sorted(trial["run_id"] for trial in summary["trials"])


def test_every_point_of_the_front_is_a_recorded_run(tuned):
    summary, runs, *_ = tuned
    assert summary["front"]
    for point in summary["front"]:
        run = runs[point["run_id"]]
        assert run.status == "ok" and run.name == point["name"]
        assert run.result.steady_samples_per_second == point["samples_per_second"]
        assert point["rate_source"] == "steady"
        assert run.result.predicted.peak_allocated_bytes == point["peak_memory_bytes"]
        assert run.result.steps == TRIAL_STEPS
        assert run.config["batch_size"] == point["config"]["batch_size"]
        assert run.config["attn"] == point["config"]["attn"]
    for trial in summary["trials"]:
        assert runs[trial["run_id"]].status == trial["status"]
    # nothing on the front is beaten on both counts by another ok trial
    ok = [trial for trial in summary["trials"] if trial["status"] == "ok"]
    for point in summary["front"]:
        assert not any(
            other["samples_per_second"] > point["samples_per_second"]
            and other["peak_memory_bytes"] <= point["peak_memory_bytes"]
            for other in ok
        )


def test_the_best_is_the_fastest_trial_and_runs_as_printed(tuned):
    summary, *_ = tuned
    best = summary["best"]
    ok = [trial for trial in summary["trials"] if trial["status"] == "ok"]
    assert best["samples_per_second"] == max(trial["samples_per_second"] for trial in ok)
    assert best["run_id"] in {point["run_id"] for point in summary["front"]}
    # the printed command gives back the configuration searched, with the workload as the user asked it
    args = build_parser().parse_args(best["command"].split()[1:])
    assert config_from_args(args, cuda_available=False) == search_config(best)
    assert search_config(best).samples == 512 and search_config(best).max_steps is None


def test_the_trials_are_one_search_in_the_history_its_best_the_tunes(tuned):
    summary, runs, _, db = tuned
    searches = {run.search for run in runs.values()}
    assert len(searches) == 1 and next(iter(searches)).kind == "tune"
    assert all(run.tags == ("tuned",) for run in runs.values())  # `tune --tag` tags every trial
    (line,) = json.loads(run_cli(["history", "--json"], db).stdout)
    assert line["id"] == summary["best"]["run_id"]
    assert line["search"]["trials"] == len(summary["trials"]) and line["search"]["trial_ids"] == sorted(runs)
    assert len(json.loads(run_cli(["history", "--json", "--trials"], db).stdout)) == len(runs)


def _runs_created(db) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
            return connection.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    except sqlite3.OperationalError:  # not created yet
        return 0


def test_ctrl_c_stops_the_search_and_prints_the_front_so_far(db_path):
    # Two candidates, batch 2 (the start) and batch 1; Ctrl-C comes as soon as the second trial is recorded as
    # started. That trial's process is started ahead, during the first (the warm worker), so its steps must outlast
    # the stop's way to it: 300 of the tiny model's (seconds); with 30, all of them were recorded before it on an
    # idle 2-core machine (status stopped, 30 steps). The budget is ample, so that only Ctrl-C ends the search early.
    process = start_cli(
        [
            "tune",
            "--device",
            "cpu",
            "--preset",
            "tiny",
            "--seq-len",
            "32",
            "--search",
            "batch",
            "--max-batch",
            "2",
            "--trial-steps",
            "300",
            "--budget",
            "60",
        ],
        db_path,
    )
    deadline = time.monotonic() + 300
    while _runs_created(db_path) < 2:
        assert process.poll() is None, process.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the second trial did not start"
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr[-3000:]
    assert "tune: interrupted: 2 trials" in stderr
    assert "Pareto front" in stdout and "tune 1" in stdout and "tune 2" not in stdout
    assert "Best: gpuanat run --preset tiny --device cpu --batch-size 2 --seq-len 32" in stdout
    with HistoryStore(db_path) as store:
        runs = store.runs()
    assert [(run.name, run.status) for run in runs] == [("tune 1: bs2", "ok"), ("tune 2: bs1", "stopped")]
    assert runs[0].result.steps == 300 and runs[1].result.steps < 300


def test_bad_input_is_one_line_and_exit_2(db_path):
    for arguments, message in (
        (["--search", "batch,warp-speed"], "--search: 'warp-speed': choose from batch, precision"),
        (["--effective-batch", "64", "--grad-accum", "2"], "--effective-batch: the search sets --grad-accum"),
        (["--trial-steps", "2"], "--trial-steps: must be an integer ≥ 3"),
        (["--budget", "0"], "--budget: minutes, more than 0"),
        (["--gpu-memory", "24"], "--gpu-memory: give a unit"),
        (["--objective", "energy"], "--objective energy: a trial's energy is read from NVML's energy counter"),
    ):
        completed = run_cli(["tune", "--device", "cpu", "--preset", "tiny", *arguments], db_path)
        assert completed.returncode == 2, (arguments, completed.stderr)
        assert completed.stderr.startswith(f"gpuanat: error: {message}"), completed.stderr
        assert len(completed.stderr.strip().splitlines()) == 1
    assert not db_path.exists()
