"""Shared helpers: run the real `gpuanat` CLI in a subprocess against a throwaway history."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import textual

from gpuanat.tui.textual_internals import WRITTEN_AGAINST

# One torch (OpenMP) thread for every training process the suite starts, and for the suite's own: on the two cores of
# the CI box a child's two spinning threads beside the test process and gpuanat itself made its steps 10-90x slower
# (16 steps of the tiny BERT: 2.7 s with two threads, 0.16 s with one; docs/testing.md). A run's behaviour does not
# depend on it; set OMP_NUM_THREADS yourself to try another count.
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parent.parent
FAULT_INJECTION_DIR = Path(__file__).resolve().parent / "fault_injection"
TINY_CPU = ["--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "32", "--batch-size", "4"]
"""A tiny BERT on the CPU: a few seconds of real training after the imports."""


def state_bytes(entry: dict) -> dict[str, int | None]:
    """Weights, gradients and optimizer state of a result, record or rank entry, as counted against a reference: the
    gradients by their size after backward (the bands hold those alive at the end of forward)."""
    return {
        "weights_bytes": entry["bands"]["weights_bytes"],
        "gradients_bytes": entry["gradients_after_backward_bytes"],
        "optimizer_state_bytes": entry["bands"]["optimizer_state_bytes"],
    }


def cli_env(
    db: Path | None, fault: str | None = None, offline_hub: bool = False, extra_env: dict[str, str] | None = None
) -> dict[str, str]:
    # COLUMNS and LINES describe the terminal pytest runs in (pytest-xdist's workers set 80x24): left in, they would
    # override the size of the terminal a test gives the dashboard (Python's shutil.get_terminal_size reads them first).
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("GPUANAT_") and key not in ("COLUMNS", "LINES")
    } | (extra_env or {})
    # A script run by path (tests/scripts/*.py) imports gpuanat from this checkout even without an install.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    if db is not None:
        env["GPUANAT_DB"] = str(db)
    env["PYTHONUNBUFFERED"] = "1"
    if offline_hub:  # no network here: fail fast instead of retrying the Hugging Face Hub
        env["HF_HUB_OFFLINE"] = "1"
    if fault is not None:
        env["GPUANAT_TEST_FAULT"] = fault
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(FAULT_INJECTION_DIR), env.get("PYTHONPATH")]))
    return env


def start_cli(
    args: list[str],
    db: Path | None,
    fault: str | None = None,
    offline_hub: bool = False,
    extra_env: dict[str, str] | None = None,
    **popen_kwargs,
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "gpuanat", *args],
        env=cli_env(db, fault, offline_hub, extra_env),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **popen_kwargs,
    )


def run_cli(
    args: list[str],
    db: Path | None,
    fault: str | None = None,
    timeout_s: float = 240,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    process = start_cli(args, db, fault, extra_env=extra_env)
    stdout, stderr = process.communicate(timeout=timeout_s)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def cli_in_terminal(
    args: list[str], db: Path | None, columns: int, lines: int = 40, term: str = "xterm"
) -> tuple[int, str, str]:
    """`gpuanat ARGS` with stdout on a real terminal `columns` wide: its exit code, every byte the terminal got
    (decoded; the line discipline's \\r\\n read as \\n) and stderr."""
    import pty

    leader, follower = pty.openpty()
    env = {**cli_env(db), "COLUMNS": str(columns), "LINES": str(lines), "TERM": term}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuanat", *args], cwd=REPO, env=env, stdout=follower, stderr=subprocess.PIPE
    )
    os.close(follower)
    output = bytearray()
    try:
        while chunk := os.read(leader, 65536):
            output += chunk
    except OSError:  # the terminal closes when the process has gone
        pass
    _, stderr = process.communicate(timeout=60)
    os.close(leader)
    return process.returncode, output.decode("utf-8").replace("\r\n", "\n"), stderr.decode("utf-8")


def tiny_model_reference() -> dict[str, int]:
    """Exact sizes of the model tests/scripts/tiny_trainer.py builds, counted here independently."""
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(
        BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
    )
    parameters = list(model.parameters())
    return {
        "params": sum(p.numel() for p in parameters),
        "weights_bytes": sum(p.numel() * p.element_size() for p in (*parameters, *model.buffers())),
        "gradients_bytes": sum(p.numel() * p.element_size() for p in parameters),
        # AdamW: two fp32 moments per parameter and one 4-byte step counter per parameter tensor
        "optimizer_state_bytes": sum(2 * p.numel() * 4 + 4 for p in parameters),
    }


def start_torchrun_job(
    tmp_path: Path,
    script: Path,
    *args: str,
    job_env: dict[str, str] | None = None,
) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """`torchrun --nproc-per-node=2 SCRIPT ARGS` in a session of its own, publishing into a private runtime
    directory, once both ranks publish; with the environment a watcher of it needs. `job_env`: variables for the job
    alone."""
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir(mode=0o700)
    env = {**cli_env(tmp_path / "history.sqlite", offline_hub=True), "XDG_RUNTIME_DIR": str(runtime_dir)}
    job = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script), *args],
        env={**env, **(job_env or {})},
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    deadline_s = time.monotonic() + 180
    while len(list((runtime_dir / "gpuanat").glob("*.jsonl")) if (runtime_dir / "gpuanat").exists() else []) < 2:
        if job.poll() is not None or time.monotonic() > deadline_s:
            os.killpg(job.pid, signal.SIGTERM)
            raise AssertionError(f"the two ranks did not publish: {job.stderr.read() if job.stderr else ''}")
        time.sleep(0.1)
    return job, env


def last_json(stdout: str):
    return json.loads(stdout.strip().splitlines()[-1])


def pytest_configure(config: pytest.Config) -> None:
    """`--snapshot-update` only with the Textual the SVG snapshots were drawn with (the `test` extra's pin): another
    draws other pictures, and would rewrite every snapshot with them."""
    if config.getoption("update_snapshots", default=False) and textual.__version__ != WRITTEN_AGAINST:
        pytest.exit(
            f"--snapshot-update refused: Textual {textual.__version__} is installed, the snapshots are drawn with "
            f"Textual {WRITTEN_AGAINST} (pip install 'textual=={WRITTEN_AGAINST}', or the 'test' extra).",
            returncode=pytest.ExitCode.USAGE_ERROR,
        )


@pytest.fixture(autouse=True)
def machine_without_cuda(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test but the GPU-marked ones sees a machine without CUDA, also on a GPU box: torch in this process and
    in every child finds no CUDA device (NVML, which ignores CUDA_VISIBLE_DEVICES, still sees the GPU). CI has no
    GPU; this keeps the suite's answers the same on the lent GPU machines, where the GPU tests run too."""
    if request.node.get_closest_marker("gpu") is None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "history.sqlite"


def mount(*arguments: str) -> bool:
    """`mount ARGUMENTS` as root; False where this machine does not permit it."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", *arguments], capture_output=True).returncode == 0


@contextlib.contextmanager
def small_tmpfs(mount_point: Path, size_mib: int) -> Iterator[Path]:
    """A file system of `size_mib` MiB of its own at `mount_point`, to fill up for real; the test is skipped where
    mounting is not permitted (tests/test_faults_history.py also simulates a full history without one)."""
    mount_point.mkdir()
    if not mount("-t", "tmpfs", "-o", f"size={size_mib}m", "tmpfs", str(mount_point)):
        pytest.skip("mounting a tmpfs is not permitted here")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill_file_system(directory: Path) -> Path:
    """Fill `directory`'s file system to its last byte; returns the filler file."""
    filler = directory / "filler"
    with open(filler, "wb", buffering=0) as file:
        for chunk_bytes in (1 << 16, 1 << 12, 1 << 9, 1):
            try:
                while True:
                    file.write(b"\0" * chunk_bytes)
            except OSError as error:
                assert error.errno == 28  # ENOSPC
    return filler


def max_step(db: Path) -> int:
    """The highest step recorded in the history `db` so far, read without writing (0 before there is any)."""
    try:
        with contextlib.closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as connection:
            row = connection.execute("SELECT MAX(step) FROM steps").fetchone()
    except sqlite3.OperationalError:  # not created yet
        return 0
    return row[0] or 0


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE  # exited, not yet reaped by its Popen
    except psutil.NoSuchProcess:
        return False


def wait_for_steps(db: Path, min_step: int, alive: psutil.Process | None = None, timeout_s: float = 180) -> None:
    """Wait until the run recording into `db` has recorded step `min_step`, failing early if `alive` ends."""
    deadline = time.monotonic() + timeout_s
    while max_step(db) < min_step:
        assert alive is None or _running(alive), "gpuanat ended before the run had recorded its steps"
        assert time.monotonic() < deadline, f"no step {min_step} recorded within {timeout_s} s"
        time.sleep(0.2)


@pytest.fixture(scope="session")
def word_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real tokenizer built once for the session from the tests' own words (`text_data.build_tokenizer`)."""
    from text_data import build_tokenizer

    return build_tokenizer(tmp_path_factory.mktemp("tokenizer"))
