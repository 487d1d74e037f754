"""The warm worker (issue #32): the next training process prepared ahead, handed its run at `r`. Real processes
throughout: the real worker imports and trains the tiny BERT on the CPU; gpuanat is killed for real."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from conftest import REPO, cli_env

from gpuanat.core.run.runner import ChildExited, ChildProcess
from gpuanat.core.run.session import execute_run, run_environment
from gpuanat.core.run.warm import PREPARED, WarmWorkers, cold_start_reason, warm_worker_command
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import PROFILE_OPS_VARIABLE, RunConfig
from gpuanat.core.vocabulary.protocol import Error, Milestone

TINY = RunConfig(preset="tiny", device="cpu", seq_len=32, samples=64, batch_size=4)
READY_TIMEOUT_S = 120.0


def wait_until(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def environment(**extra: str) -> dict[str, str]:
    base = {**cli_env(None), **extra}
    return run_environment(TINY, base)[1]


def test_a_prepared_worker_takes_the_run_and_trains_as_a_cold_start_does(tmp_path):
    """Cold, then warm with gpuanat's operations profiling asked for only when the run starts (a variable the worker
    applies itself): the same training (loss, steps, weights), the imports gone from the warm start-up, the profile
    taken, the worker's output in the run's log."""
    workers = WarmWorkers(enabled=True)
    try:
        with HistoryStore(tmp_path / "history.sqlite") as store:
            cold = execute_run(TINY, store=store, log_dir=tmp_path / "logs", env=environment())
            workers.prepare(environment())
            wait_until(lambda: workers.status() == "ready", READY_TIMEOUT_S, "the prepared worker")
            prepared_pid = workers.prepared_pid
            warm = execute_run(
                TINY,
                store=store,
                log_dir=tmp_path / "logs",
                warm_workers=workers,
                env=environment(**{PROFILE_OPS_VARIABLE: "2"}),
            )
    finally:
        workers.close()
    assert cold.status == warm.status == "ok"
    assert cold.start["warm"] is False and cold.start["cold_reason"] == "this command prepares no process ahead"
    assert warm.start["warm"] is True and warm.start["imports_done"] is True
    assert warm.start["prepared_for_s"] > 0
    with HistoryStore(tmp_path / "history.sqlite") as store:
        assert store.run(warm.run_id).environment["pid"] == prepared_pid
    assert (warm.steps, warm.samples) == (cold.steps, cold.samples)
    assert warm.train_loss == pytest.approx(cold.train_loss, rel=1e-6)
    assert warm.bands.weights_bytes == cold.bands.weights_bytes
    cold_parts, warm_parts = cold.wall_breakdown_s, warm.wall_breakdown_s
    assert warm_parts["child start"] + warm_parts["imports"] < cold_parts["imports"] / 2, (cold_parts, warm_parts)
    assert warm.operations_anatomy is not None and cold.operations_anatomy is None
    assert "train_loss" in Path(warm.log_path).read_text()


def test_a_run_the_prepared_worker_cannot_take_starts_cold_and_says_why(tmp_path):
    """Prepared for other GPUs than the run chooses: the run starts cold, says why, and the unusable worker is
    ended; several ranks leave it for the next one-rank run."""
    workers = WarmWorkers(enabled=True)
    try:
        workers.prepare(environment(CUDA_VISIBLE_DEVICES="1"))
        unusable = workers.prepared_pid
        with HistoryStore(tmp_path / "history.sqlite") as store:
            result = execute_run(TINY, store=store, log_dir=tmp_path / "logs", warm_workers=workers, env=cli_env(None))
        assert result.status == "ok"
        assert result.start["warm"] is False
        assert "CUDA_VISIBLE_DEVICES" in result.start["cold_reason"]
        wait_until(lambda: gone(unusable), 10, "the unusable worker to end")
        kept = workers.prepared_pid  # prepared again for the run's own environment once it ended
        assert kept is not None and kept != unusable
        child, start = workers.take(environment(), ranks=2, requested_s=time.monotonic())
        assert child is None and start.cold_reason == "2 ranks start through torchrun"
        assert workers.prepared_pid == kept
    finally:
        workers.close()
    wait_until(lambda: gone(kept), 10, "the retired worker to end")


def test_a_prepared_worker_that_died_leaves_the_run_to_a_cold_start(tmp_path):
    workers = WarmWorkers(enabled=True)
    try:
        workers.prepare(environment())
        os.kill(workers.prepared_pid, signal.SIGKILL)
        wait_until(lambda: workers.status() is None, 10, "the death to be seen")
        with HistoryStore(tmp_path / "history.sqlite") as store:
            result = execute_run(TINY, store=store, log_dir=tmp_path / "logs", warm_workers=workers, env=cli_env(None))
    finally:
        workers.close()
    assert result.status == "ok" and result.start["warm"] is False
    assert result.start["cold_reason"].startswith("the prepared process had exited (code -9)")


@pytest.mark.parametrize("moment", ["importing", "ready"])
def test_a_prepared_worker_dies_with_gpuanat(tmp_path, moment):
    """gpuanat killed with SIGKILL while a worker is prepared (still importing, or waiting): the worker follows."""
    script = (
        "import os, sys, time\n"
        "from gpuanat.core.run.warm import WarmWorkers\n"
        "workers = WarmWorkers(enabled=True)\n"
        "workers.prepare(dict(os.environ))\n"
        "print(workers.prepared_pid, flush=True)\n"
        f"while {moment == 'ready'} and workers.status() != 'ready':\n"
        "    time.sleep(0.05)\n"
        "print(workers.status(), flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, env=cli_env(None), stdout=subprocess.PIPE, text=True
    )
    try:
        worker_pid = int(parent.stdout.readline())
        assert parent.stdout.readline().strip() == ("ready" if moment == "ready" else "preparing")
        assert not gone(worker_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        wait_until(lambda: gone(worker_pid), 15, "the prepared worker to follow its parent")
    finally:
        parent.kill()
        parent.wait()


def _events(child: ChildProcess, timeout_s: float = 60) -> list:
    events = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        event = child.next_event(0.2)
        if event is not None:
            events.append(event)
            if isinstance(event, ChildExited):
                return events
    raise AssertionError(f"the worker did not exit: {events}")


def test_a_worker_retired_unused_leaves_quietly_and_garbage_handed_over_is_an_error(tmp_path):
    retired = ChildProcess(warm_worker_command, log_path=None, env=cli_env(None), handoff=True)
    garbage = ChildProcess(warm_worker_command, log_path=tmp_path / "garbage.log", env=cli_env(None), handoff=True)
    retired.start()
    garbage.start()  # both import at once
    retired.close_handoff()
    garbage.hand_over(b"\x00not a run\n")
    events = _events(retired)
    assert isinstance(events[-1], ChildExited) and events[-1].returncode == 0
    assert [event.name for event in events if isinstance(event, Milestone)] == [PREPARED]

    events = _events(garbage)
    errors = [event for event in events if isinstance(event, Error)]
    assert events[-1].returncode == 1 and len(errors) == 1 and errors[0].kind == "exception", events
    assert errors[0].message.startswith("ValueError: the hand-over is not a run: "), errors[0].message
    assert "Traceback" in (tmp_path / "garbage.log").read_text()
    with pytest.raises(OSError):  # handed over once only
        garbage.hand_over(b"{}\n")


def test_output_before_the_log_is_named_lands_in_it_first(tmp_path):
    """A prepared process's output (import warnings) is kept until its run names the log, then written there first."""
    script = (
        "import os, sys\nprint('while preparing', flush=True)\n"
        "data = os.read(int(sys.argv[1]), 100)\nprint('handed', data.decode().strip(), flush=True)\n"
    )
    child = ChildProcess(
        lambda events_fd, handoff_fd: [sys.executable, "-c", script, str(handoff_fd)], log_path=None, handoff=True
    )
    child.start()
    wait_until(lambda: child.early_output() == b"while preparing\n", 30, "the early output")
    log = tmp_path / "logs" / "run-1.log"
    child.set_log_path(log)
    child.hand_over(b"the run\n")
    _events(child)
    child.kill_group()
    assert log.read_text() == "while preparing\nhanded the run\n"


def test_cold_start_reasons():
    prepared = {"PATH": "/bin", "CUDA_VISIBLE_DEVICES": "0", "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    # the allocator's options and gpuanat's measurement requests are applied by the worker itself
    assert (
        cold_start_reason(
            prepared,
            {**prepared, "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:False", PROFILE_OPS_VARIABLE: "3"},
            ranks=1,
        )
        is None
    )
    assert "CUDA_VISIBLE_DEVICES=1" in cold_start_reason(prepared, {**prepared, "CUDA_VISIBLE_DEVICES": "1"}, 1)
    assert cold_start_reason(prepared, prepared, ranks=4) == "4 ranks start through torchrun"
    changed = cold_start_reason(prepared, {**prepared, "HF_HOME": "/x", "A": "1", "B": "2", "C": "3"}, 1)
    assert changed == "the environment changed since the process was prepared (A, B, C and 1 more)"
    assert WarmWorkers(enabled=False).take(prepared, 1, 0.0)[1].cold_reason == (
        "warm starts are off (GPUANAT_WARM_WORKER=0)"
    )


def test_warm_starts_can_be_turned_off(monkeypatch):
    for value, wanted in (("0", False), ("off", False), ("1", True), ("", True)):
        monkeypatch.setenv("GPUANAT_WARM_WORKER", value)
        assert WarmWorkers().enabled is wanted
    workers = WarmWorkers(enabled=False)
    workers.prepare(dict(os.environ))
    assert workers.prepared_pid is None and workers.status() is None


@pytest.mark.asyncio
async def test_the_dashboard_starts_warm_says_so_and_ends_its_worker(db_path):
    """The real dashboard with warm starts: the status line says when the training process is warm, `r` hands it the
    run (the log says so), and quitting ends the process prepared for the next run."""
    from test_tui import TINY as DASHBOARD_TINY
    from test_tui import run_to_completion, wait_for

    from gpuanat.core.measure.nvml_source import open_source
    from gpuanat.tui.app import GpuAnatApp
    from gpuanat.tui.run_backend import LocalRunBackend
    from gpuanat.tui.widgets.status_line import StatusLine

    workers = WarmWorkers(enabled=True)
    app = GpuAnatApp(
        DASHBOARD_TINY,
        db_path=db_path,
        sampler_factory=lambda: open_source(prefer_nvml=False),
        backend=LocalRunBackend(db_path, warm_workers=workers),
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: workers.status() == "ready", READY_TIMEOUT_S, "the prepared worker")
        await pilot.pause(0.3)
        assert "idle · training process warm" in str(app.query_one(StatusLine).render())
        before = [str(line.text) for line in app.query_one("#log").lines]
        result = await run_to_completion(app, pilot)
        log = [str(line.text) for line in app.query_one("#log").lines]
        await wait_for(pilot, lambda: workers.prepared_pid is not None, 30, "the next prepared worker")
        following = workers.prepared_pid
    assert result.status == "ok" and result.start["warm"] is True
    assert any(line.startswith("gpuanat · warm start: a training process prepared") for line in log), log
    assert any("the next training process is ready" in line for line in before), before
    wait_until(lambda: gone(following), 10, "the next prepared worker to end with the dashboard")
    assert json.loads(json.dumps(result.start)) == result.start
