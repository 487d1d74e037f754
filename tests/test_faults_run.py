"""Faults around a real run, injected as a tester would: garbage on the events pipe, stop signals, a killed
parent, a terminal that hangs up. Each test runs the real `gpuanat` in a real subprocess training a tiny model
on the CPU, and checks that nothing is lost or left behind: the run ends with a final status, its recorded
steps and a result, and no process of it outlives gpuanat.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import signal
import sqlite3
import struct
import subprocess
import sys
import termios
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from conftest import (
    REPO,
    TINY_CPU,
    cli_env,
    fill_file_system,
    last_json,
    max_step,
    run_cli,
    small_tmpfs,
    start_cli,
    wait_for_steps,
)
from event_fuzz import malformed_lines
from textual.widgets import DataTable

from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import RUN_RESULT_KEYS
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.screens.compare import CompareScreen
from gpuanat.worker.lifeline import PARENT_GONE_GRACE_S

LONG_CPU_RUN = ["--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "100000", "--batch-size", "4"]
"""Trains for far longer than any test waits: the test ends it."""
ORPHAN_DEADLINE_S = PARENT_GONE_GRACE_S + 10
"""How long the training processes may take to go once gpuanat is gone (their stop grace and some slack)."""


def _is_training_child(process: psutil.Process) -> bool:
    """The training child, not the capability probe (which may have just exited)."""
    try:
        return "--events-fd" in process.cmdline()
    except psutil.Error:
        return False


def _training_tree(parent_pid: int, timeout_s: float = 120) -> list[psutil.Process]:
    """The training child of `parent_pid` and its own children, once the child exists."""
    deadline = time.monotonic() + timeout_s
    while True:
        children = [child for child in psutil.Process(parent_pid).children() if _is_training_child(child)]
        if children:
            return [children[0], *children[0].children(recursive=True)]
        assert time.monotonic() < deadline, "no training child started"
        time.sleep(0.02)


def _assert_all_gone(processes: list[psutil.Process], timeout_s: float) -> None:
    _gone, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for process in alive:  # leave nothing behind, then fail
        with contextlib.suppress(psutil.Error):
            process.kill()
    assert alive == [], f"outlived gpuanat: {[p.pid for p in alive]}"


def _sigkill_and_expect_gone(gpuanat: subprocess.Popen[str], training: list[psutil.Process]) -> None:
    gpuanat.kill()
    gpuanat.wait(timeout=10)
    _assert_all_gone(training, ORPHAN_DEADLINE_S)


def _stored_run(db: Path) -> tuple[object, list[dict]]:
    with HistoryStore(db) as store:
        (run,) = store.runs()
        return run, store.steps(run.id)


# --- garbage on the events pipe --------------------------------------------------------------------------------


def test_thousands_of_garbage_lines_on_the_real_pipe_are_counted_and_the_run_finishes(tmp_path, db_path):
    lines = malformed_lines(5_000, seed=1)
    fuzz_file = tmp_path / "fuzz.bin"
    fuzz_file.write_bytes(b"".join(line + b"\n" for line in lines))
    process = start_cli(
        ["run", *TINY_CPU, "--json"], db_path, fault="fuzz@2", extra_env={"GPUANAT_TEST_FUZZ_FILE": str(fuzz_file)}
    )
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 0, stderr[-3000:]
    result = last_json(stdout)
    assert result["status"] == "ok" and result["steps"] == 8
    assert result["malformed_events"] == len(lines)
    run, steps = _stored_run(db_path)
    assert run.status == "ok"
    assert [step["step"] for step in steps] == list(range(1, 9))  # whole numbers, not the garbage's strings
    assert all(isinstance(step["samples"], int) for step in steps)


def test_garbage_then_a_killed_child_mid_line_still_ends_with_a_status_steps_and_a_result(tmp_path, db_path):
    # The child writes garbage, then the first 5 MB of a line it never finishes, then dies.
    lines = malformed_lines(1_000, seed=2, too_long=0)
    fuzz_file = tmp_path / "fuzz.bin"
    fuzz_file.write_bytes(b"".join(line + b"\n" for line in lines) + b'{"v":1,"type":"step","x":"' + b"y" * 5_000_000)
    process = start_cli(
        ["run", *TINY_CPU, "--json"],
        db_path,
        fault="fuzz-crash@2",
        extra_env={"GPUANAT_TEST_FUZZ_FILE": str(fuzz_file)},
    )
    stdout, stderr = process.communicate(timeout=300)
    assert process.returncode == 1, stderr[-3000:]
    result = last_json(stdout)
    assert result["status"] == "failed" and result["exit_code"] == -signal.SIGKILL
    assert result["malformed_events"] == len(lines) + 1  # the cut-off line too
    assert result["steps"] == 1
    run, steps = _stored_run(db_path)
    assert run.status == "failed" and [step["step"] for step in steps] == [1]


# --- stop signals ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "signals",
    [[signal.SIGTERM], [signal.SIGHUP], [signal.SIGINT, signal.SIGTERM]],
    ids=["SIGTERM", "SIGHUP", "SIGINT-then-SIGTERM"],
)
def test_a_stop_signal_stops_the_run_and_records_it_as_stopped(db_path, signals):
    process = start_cli(["run", *LONG_CPU_RUN, "--workers", "2", "--json"], db_path)
    try:
        tree = _training_tree(process.pid)
        wait_for_steps(db_path, 3, psutil.Process(process.pid))
        tree = _training_tree(process.pid)  # DataLoader workers included, now that training runs
        for number in signals:  # a second signal while stopping must not cut the recording short
            process.send_signal(number)
            time.sleep(0.3)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signals[0], stderr[-3000:]
    assert "Traceback" not in stderr
    result = last_json(stdout)  # stdout is a pipe, alive after a hangup: the result is printed there
    assert result["status"] == "stopped" and result["steps"] >= 3
    _assert_all_gone(tree, timeout_s=10)
    run, steps = _stored_run(db_path)
    assert run.status == "stopped" and run.finished_at is not None
    assert run.result.status == "stopped" and run.result.run_id == result["run_id"]
    assert len(steps) >= 3


@pytest.mark.asyncio
async def test_a_run_stopped_after_its_warm_up_has_the_steady_rate_of_the_steps_it_made(db_path):
    """Issue #48: a run stopped after 1,299 steps said "— (stopped before the end)" for its steady samples/s, and
    compare "—". Its steady phase is the steps it finished after warm-up: their samples over their time, as the
    steps it recorded give it; `compare` shows it."""
    process = start_cli(["run", *LONG_CPU_RUN, "--json"], db_path)
    try:
        wait_for_steps(db_path, 30, psutil.Process(process.pid))  # 25,000 steps: the first 20 are warm-up
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 130, stderr[-3000:]
    result = last_json(stdout)
    assert result["status"] == "stopped" and result["warmup_steps"] == 20 and result["steps"] >= 30
    run, steps = _stored_run(db_path)
    assert [step["step"] for step in steps] == list(range(1, result["steps"] + 1))
    warm, last = steps[result["warmup_steps"] - 1], steps[-1]
    expected = (last["samples"] - warm["samples"]) / (last["elapsed_s"] - warm["elapsed_s"])
    assert result["steady_samples_per_second"] == pytest.approx(expected, rel=1e-6)
    assert run.result.steady_samples_per_second == result["steady_samples_per_second"]
    app = GpuAnatApp(
        RunConfig(preset="tiny", device="cpu"), db_path=db_path, sampler_factory=lambda: open_source(prefer_nvml=False)
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await app.push_screen(CompareScreen([run, run], {run.id: steps}, {}))
        await pilot.pause(0.2)
        table = app.screen.query_one("#compare-metrics", DataTable)
        cells = {str(row[0]): [str(cell) for cell in row[1:]] for row in map(table.get_row_at, range(table.row_count))}
    assert cells["steady samples/s"][0] == f"{expected:.2f}"


def test_a_run_stopped_in_its_warm_up_says_why_it_has_no_steady_rate(db_path):
    completed = run_cli(["run", *LONG_CPU_RUN, "--json"], db_path, fault="interrupt@5")
    result = last_json(completed.stdout)
    assert result["status"] == "stopped" and result["steps"] == 4 and result["warmup_steps"] == 20, completed.stderr
    assert result["steady_samples_per_second"] is None
    assert result["unavailable"]["steady_samples_per_second"] == (
        "stopped after 4 steps, before a steady one: the first 20 are warm-up"
    )


# --- a killed parent ----------------------------------------------------------------------------------------------


def test_a_sigkilled_gpuanat_takes_its_training_processes_with_it(db_path):
    process = start_cli(["run", *LONG_CPU_RUN, "--workers", "2", "--json"], db_path)
    try:
        wait_for_steps(db_path, 3, psutil.Process(process.pid))
        tree = _training_tree(process.pid)
        assert len(tree) >= 3, "expected the training child and its two DataLoader workers"
        _sigkill_and_expect_gone(process, tree)
    finally:
        if process.poll() is None:
            process.kill()
    run, steps = _stored_run(db_path)  # a writable open: it finalises the run its dead recorder left running
    assert len(steps) >= 3  # what was recorded before the kill stays
    assert run.status == "interrupted" and run.finished_at is not None
    assert run.result.steps == steps[-1]["step"] and run.result.error.kind == "interrupted"


def test_a_child_still_starting_dies_with_its_sigkilled_parent(db_path):
    # Killed while the child imports torch and transformers, long before it could write an event.
    process = start_cli(["run", *LONG_CPU_RUN], db_path)
    try:
        tree = _training_tree(process.pid)
        _sigkill_and_expect_gone(process, tree)
    finally:
        if process.poll() is None:
            process.kill()


def test_a_script_busy_before_its_trainer_dies_with_its_sigkilled_parent(tmp_path, db_path):
    ready = tmp_path / "ready"
    script = tmp_path / "slow_start.py"
    script.write_text(
        textwrap.dedent(f"""
        import os, pathlib, time
        pathlib.Path({str(ready)!r}).write_text(str(os.getpid()))
        time.sleep(120)  # data preparation, say, before any Trainer exists
    """)
    )
    process = start_cli(["run", "--script", str(script)], db_path)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None and time.monotonic() < deadline, "the script did not start"
            time.sleep(0.05)
        script_process = psutil.Process(int(ready.read_text()))
        _sigkill_and_expect_gone(process, [script_process])
    finally:
        if process.poll() is None:
            process.kill()


# --- the dashboard in a real terminal -------------------------------------------------------------------------------


class _Terminal:
    """A real pseudo-terminal running the dashboard as its session leader, as an SSH login would."""

    def __init__(self, args: list[str], db: Path, rows: int = 40, columns: int = 120) -> None:
        env = {**cli_env(db), "TERM": "xterm-256color"}
        self.pid, self.master_fd = pty.fork()
        if self.pid == 0:  # the child: the pty is its controlling terminal
            os.chdir(REPO)
            os.execvpe(sys.executable, [sys.executable, "-m", "gpuanat", *args], env)
        fcntl.ioctl(self.master_fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.output = bytearray()
        self.exit_code: int | None = None
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:  # a terminal that is not read from blocks the app's writes
        with contextlib.suppress(OSError):
            while chunk := os.read(self.master_fd, 65536):
                self.output += chunk

    def type(self, keys: str) -> None:
        os.write(self.master_fd, keys.encode())

    def hang_up(self) -> None:
        """Close the terminal's master side: the kernel sends SIGHUP to the session (an SSH drop)."""
        os.close(self.master_fd)

    def wait(self, timeout_s: float) -> int | None:
        """The exit code (128 + signal when a signal killed it), or None if it is still running."""
        deadline = time.monotonic() + timeout_s
        while self.exit_code is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.exit_code = (
                    os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)
                )
            elif time.monotonic() >= deadline:
                break
            else:
                time.sleep(0.1)
        return self.exit_code

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        self.wait(10)


@pytest.mark.parametrize("how", ["hang up", "SIGTERM"])
def test_the_dashboard_records_its_run_as_stopped_when_the_terminal_hangs_up_or_it_is_terminated(db_path, how):
    terminal = _Terminal([*LONG_CPU_RUN, "--workers", "2"], db_path)
    try:
        deadline = time.monotonic() + 180
        while b"Techniques" not in terminal.output:
            assert time.monotonic() < deadline, "the dashboard did not draw"
            time.sleep(0.1)
        terminal.type("r")
        wait_for_steps(db_path, 3, psutil.Process(terminal.pid))
        tree = _training_tree(terminal.pid)
        if how == "hang up":
            terminal.hang_up()
        else:
            os.kill(terminal.pid, signal.SIGTERM)
        exit_code = terminal.wait(timeout_s=90)
    finally:
        if terminal.wait(0) is None:
            terminal.kill()
    assert exit_code == 128 + (signal.SIGHUP if how == "hang up" else signal.SIGTERM)
    _assert_all_gone(tree, timeout_s=10)
    run, steps = _stored_run(db_path)
    assert run.status == "stopped" and run.finished_at is not None
    assert run.result.status == "stopped" and len(steps) >= 3
    assert set(RUN_RESULT_KEYS) <= run.result.to_json().keys()  # a whole result, as `gpuanat run --json` gives it
    assert run.result.steps >= 3


# --- a busy or full history ------------------------------------------------------------------------------------

MEDIUM_CPU_RUN = ["--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "2000", "--batch-size", "4"]
"""500 steps: several seconds of training, so a lock or a full disk can come and go while it runs."""
LOCK_HOLDER = textwrap.dedent("""
    import sqlite3, sys, time
    connection = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
    connection.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    time.sleep(float(sys.argv[2]))
    connection.execute("COMMIT")
""")


def test_a_history_locked_by_another_process_delays_the_records_but_never_ends_the_run(db_path):
    process = start_cli(["run", *MEDIUM_CPU_RUN, "--json"], db_path)
    try:
        wait_for_steps(db_path, 2, psutil.Process(process.pid))
        holder = subprocess.Popen(
            [sys.executable, "-c", LOCK_HOLDER, str(db_path), "15"], stdout=subprocess.PIPE, text=True
        )
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        locked_at_step = max_step(db_path)
        stdout, stderr = process.communicate(timeout=240)
        assert holder.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr and "warning" not in stderr
    result = last_json(stdout)
    assert result["status"] == "ok" and result["steps"] == 500 and result["history_error"] is None
    run, steps = _stored_run(db_path)
    assert run.status == "ok" and [step["step"] for step in steps] == list(range(1, 501))
    assert locked_at_step < 500  # the lock was held while it trained, not only after


@pytest.fixture
def small_disk(tmp_path):
    """4 MiB: room for a 500-step run's records and its write-ahead log, and little else."""
    with small_tmpfs(tmp_path / "small", size_mib=4) as mount_point:
        yield mount_point


def test_a_disk_that_fills_up_and_frees_again_loses_no_record_of_the_run(small_disk):
    db = small_disk / "history.sqlite"
    process = start_cli(["run", *MEDIUM_CPU_RUN, "--json"], db)
    try:
        wait_for_steps(db, 2, psutil.Process(process.pid))
        filler = fill_file_system(small_disk)
        full_at_step = max_step(db)
        time.sleep(3)
        assert max_step(db) == full_at_step, "records were still written to a full disk"
        filler.unlink()
        stdout, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-3000:]
    assert "Traceback" not in stderr
    result = last_json(stdout)
    assert result["status"] == "ok" and result["history_error"] is None
    run, steps = _stored_run(db)
    assert run.status == "ok" and [step["step"] for step in steps] == list(range(1, 501))


def test_a_disk_full_until_the_end_ends_the_run_with_its_result_and_says_what_was_not_saved(small_disk):
    db = small_disk / "history.sqlite"
    process = start_cli(["run", *MEDIUM_CPU_RUN, "--json"], db, extra_env={"GPUANAT_FINAL_WRITE_DEADLINE_S": "2"})
    try:
        wait_for_steps(db, 2, psutil.Process(process.pid))
        filler = fill_file_system(small_disk)
        saved_steps = max_step(db)
        stdout, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr[-3000:]  # the run trained: the history's trouble is said, not fatal
    assert "Traceback" not in stderr
    result = last_json(stdout)
    assert result["status"] == "ok" and result["steps"] == 500
    assert f"run {result['run_id']} could not be fully saved" in result["history_error"]
    assert f"gpuanat: warning: run {result['run_id']} could not be fully saved" in stderr
    filler.unlink()
    # The next writable open finalises the row from what was saved; nothing is left `running`.
    run, steps = _stored_run(db)
    assert run.status == "interrupted" and run.finished_at is not None
    assert [step["step"] for step in steps] == list(range(1, saved_steps + 1))
    assert run.result.steps == saved_steps and "rebuilt from its" in run.result.error.message


def test_the_watch_dashboard_saves_what_it_watched_when_the_terminal_hangs_up(tmp_path, db_path):
    watched = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    terminal = _Terminal(["watch", str(watched.pid), "--save", "hung up"], db_path)
    try:
        deadline = time.monotonic() + 60
        while not _saved_runs(db_path):
            assert time.monotonic() < deadline, "the watch dashboard did not start saving"
            time.sleep(0.1)
        time.sleep(1.5)  # a few samples recorded
        terminal.hang_up()
        exit_code = terminal.wait(timeout_s=60)
    finally:
        if terminal.wait(0) is None:
            terminal.kill()
        watched.kill()
        watched.wait()
    assert exit_code == 128 + signal.SIGHUP
    with HistoryStore(db_path) as store:
        (run,) = store.runs()
        samples = store.samples(run.id)
    assert (run.kind, run.name, run.status) == ("watched", "hung up", "detached")
    assert run.finished_at is not None and run.result.watched_s > 1
    assert len(samples) >= 3


def _saved_runs(db: Path) -> int:
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
            return connection.execute("SELECT COUNT(*) FROM runs").fetchone()[0]
    except sqlite3.OperationalError:
        return 0
