"""Failure paths of a real run: out of memory, a hard crash, garbage on the events pipe, Ctrl-C.

CI has no GPU, so the out-of-memory error is raised inside the real training child by the test-only
hook in tests/fault_injection/sitecustomize.py (torch.OutOfMemoryError from Trainer.training_step at
a chosen step); everything that handles it — worker, runner, history, CLI — is the real code. A real
CUDA OOM is exercised on the GPU machine (scripts/gpu_check.sh).
"""

from __future__ import annotations

import signal

import psutil
import pytest
from conftest import TINY_CPU, last_json, start_cli, wait_for_steps
from result_golden import assert_as_recorded

from gpuanat.core.store.history import HistoryStore

pytestmark = pytest.mark.xdist_group("test_failures")
"""Its tests share a module-scoped real run: pytest-xdist gives them all to one worker (`--dist loadgroup`)."""

FAULTS = {"oom": "oom@3", "crash": "crash@3", "garbage": "garbage@2"}
STOPPED_RUN = [
    *("run", "--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "100000", "--batch-size", "4"),
    *("--workers", "2", "--json"),
]
"""A long run with two DataLoader worker processes, for Ctrl-C to stop."""


@pytest.fixture(scope="module")
def faulted(tmp_path_factory):
    db = tmp_path_factory.mktemp("faults") / "history.sqlite"
    processes = {name: start_cli(["run", *TINY_CPU, "--json"], db, fault=fault) for name, fault in FAULTS.items()}
    outcomes = {}
    for name, process in processes.items():
        stdout, stderr = process.communicate(timeout=600)
        assert stdout.strip(), f"{name}: nothing on stdout, exit {process.returncode}; stderr:\n{stderr[-4000:]}"
        outcomes[name] = (process.returncode, last_json(stdout), stderr)
    return db, outcomes


def test_every_faulted_result_prints_as_gpuanat_printed_it_before_the_result_was_typed(faulted):
    _, outcomes = faulted
    for name, (_, result, _) in outcomes.items():
        assert_as_recorded(name, result)


def test_oom_is_recorded_and_reported_plainly(faulted):
    db, outcomes = faulted
    returncode, result, stderr = outcomes["oom"]
    assert returncode == 3
    assert result["status"] == "oom"
    assert result["error"]["kind"] == "oom" and result["error"]["step"] == 3
    assert "out of memory" in result["error"]["message"].lower()
    # a CPU run: its line says host memory (the GPU's line: tests/test_host_oom.py)
    assert "gpuanat: out of host memory (RAM) at step 3" in stderr
    assert "try a smaller --batch-size" in stderr  # no GPU to fit: the techniques that lower memory, not yet on
    assert "Traceback" not in stderr
    with HistoryStore(db) as store:
        run = store.run(result["run_id"])
        assert run is not None and run.status == "oom"
        assert run.config["batch_size"] == 4
        assert [step["step"] for step in store.steps(run.id)] == [1, 2]


def test_a_crashed_child_keeps_what_was_recorded(faulted):
    db, outcomes = faulted
    returncode, result, _ = outcomes["crash"]
    assert returncode == 1
    assert result["status"] == "failed"
    assert result["exit_code"] == -signal.SIGKILL
    assert "exited with code -9" in result["error"]["message"]
    with HistoryStore(db) as store:
        run = store.run(result["run_id"])
        assert run is not None and run.status == "failed"
        assert [step["step"] for step in store.steps(run.id)] == [1, 2]
        # the bands measured at steps 1 and 2 survive the crash
        assert store.steps(run.id)[0]["bands"]["weights_bytes"] > 0


def test_a_malformed_event_is_counted_and_the_run_goes_on(faulted):
    _, outcomes = faulted
    returncode, result, _ = outcomes["garbage"]
    assert returncode == 0
    assert result["status"] == "ok"
    assert result["malformed_events"] == 1
    assert result["steps"] == 8


def test_ctrl_c_stops_the_child_and_its_dataloader_workers(db_path):
    # A long run with two DataLoader worker processes; Ctrl-C arrives as SIGINT to gpuanat itself.
    process = start_cli(STOPPED_RUN, db_path)
    try:
        wait_for_steps(db_path, 2, psutil.Process(process.pid))
        tree = psutil.Process(process.pid).children(recursive=True)
        training = [p for p in psutil.Process(process.pid).children() if "gpuanat.worker" in " ".join(p.cmdline())]
        assert len(training) == 1
        assert len(training[0].children()) >= 2, "expected DataLoader workers under the training process"
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=60)
    finally:
        if process.poll() is None:  # a failed assertion above must not leave a training run behind
            for leftover in psutil.Process(process.pid).children(recursive=True):
                leftover.kill()
            process.kill()
    assert process.returncode == 130, stderr
    result = last_json(stdout)
    assert result["status"] == "stopped"
    assert_as_recorded("stopped", result)
    _gone, alive = psutil.wait_procs(tree, timeout=5)
    assert alive == []
    with HistoryStore(db_path) as store:
        run = store.run(result["run_id"])
        assert run is not None and run.status == "stopped"
        assert len(store.steps(run.id)) >= 2
    assert result["samples"] >= 8
