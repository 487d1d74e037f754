"""What a newcomer sees from the CLI: help that shows defaults, one error prefix, shell completion, a history table
that fits the terminal, and a pipe reader that stops early. The real `gpuanat` in real subprocesses and terminals."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import REPO, cli_env, cli_in_terminal, run_cli

from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.report import HISTORY_COLUMNS, fit_columns
from gpuanat.core.vocabulary.result import RunResult

RUNS = [  # what real runs store: long technique strings, GPU names, every number
    (
        {
            "preset": "bert-large",
            "batch_size": 16,
            "precision": "bf16",
            "grad_checkpointing": True,
            "optim": "adamw_bnb_8bit",
            "expandable_segments": True,
            "device": "cuda",
        },
        {
            "status": "ok",
            "gpu_name": "NVIDIA H100 80GB HBM3",
            "train_runtime_s": 41.3,
            "samples_per_second": 301.2,
            "steady_samples_per_second": 412.9,
            "peak_allocated_bytes": 23 * 1024**3,
            "device_memory_used_bytes": 27 * 1024**3,
            "prediction_error_percent": -1.4,
        },
    ),
    (
        {"preset": "tiny", "batch_size": 4, "device": "cpu"},
        {"status": "ok", "device_name": "x86_64", "train_runtime_s": 0.4, "samples_per_second": 420.0},
    ),
]


@pytest.fixture
def history_db(tmp_path):
    db = tmp_path / "history.sqlite"
    with HistoryStore(db) as store:
        for config, result in RUNS:
            run_id = store.create_run(config, name="a rather long experiment name")
            store.update_result(run_id, RunResult.from_json({**result, "run_id": run_id}), status=result["status"])
    return db


def _in_terminal(args: list[str], db, columns: int) -> tuple[int, str]:
    """Run `gpuanat ARGS` with stdout on a real terminal `columns` wide; its exit code and what it printed."""
    returncode, output, stderr = cli_in_terminal(args, db, columns)
    return returncode, re.sub(r"\x1b\[[0-9;]*m", "", output).replace("\r", "") + stderr


@pytest.mark.parametrize("columns", [80, 100, 160])
def test_the_history_table_fits_the_terminal_and_keeps_id_name_status_and_the_key_numbers(history_db, columns):
    returncode, text = _in_terminal(["history"], history_db, columns)
    assert returncode == 0, text
    table = [line for line in text.splitlines() if "┃" in line or "│" in line]
    assert len(table) == 3 and all(len(line) <= columns for line in table), "\n".join(table)
    header = table[0]
    for title in ("id", "name", "status", "samples/s"):
        assert title in header
    assert "301.20" in table[1] and "ok" in table[1]
    if columns < 160:
        assert "more columns at a wider terminal" in text and "--format md" in text


def test_a_pipe_gets_every_column_whole(history_db):
    completed = run_cli(["history"], history_db, timeout_s=60)
    assert completed.returncode == 0
    for column in HISTORY_COLUMNS:
        assert column.title in completed.stdout
    assert "NVIDIA H100 80GB HBM3" in completed.stdout and "a rather long experiment name" in completed.stdout


def test_fit_columns_cuts_free_text_before_dropping_and_drops_by_keep():
    rows = [{"id": 1, "name": "n" * 40, "status": "ok", "techniques": "t" * 40, "samples_per_second": 1.0}]
    columns, widths = fit_columns(HISTORY_COLUMNS, rows, 90)
    kept = [column.key for column in columns]
    assert {"id", "name", "status", "samples_per_second"} <= set(kept)
    assert widths["name"] < 40  # cut short rather than dropped
    assert kept.index("id") < kept.index("name") < kept.index("status")  # the order stays
    assert "prediction_error_delta" not in kept and "device" not in kept  # the first to go
    wide, _ = fit_columns(HISTORY_COLUMNS, rows, 1000)
    assert wide == list(HISTORY_COLUMNS)


def test_help_shows_each_techniques_default_and_no_issue_numbers():
    completed = run_cli(["run", "--help"], None, timeout_s=60)
    assert completed.returncode == 0
    text = " ".join(completed.stdout.split())
    for flag, default in (
        ("--batch-size", "4"),
        ("--precision", "fp32"),
        ("--grad-checkpointing", "off"),
        ("--optim", "adamw_torch_fused"),
    ):
        assert re.search(re.escape(flag) + r".*?\(default: " + re.escape(default) + r"\)", text), flag
    # the workload follows the machine: bert-large is the default with CUDA only (issue #48, point 9)
    assert "(default: bert-large with CUDA; on a machine without CUDA, tiny)" in text
    assert re.search(r"--seq-len N tokens per sample \(default: 512 with CUDA; on a machine without CUDA, 64,", text)
    dashboard = " ".join(run_cli(["--help"], None, timeout_s=60).stdout.split())
    assert re.search(r"--samples N .*?\(default: 512 with CUDA; on a machine without CUDA, 64; 2048 in the", dashboard)
    predict = run_cli(["predict", "--help"], None, timeout_s=60).stdout
    assert "issue" not in predict and "#" not in predict


@pytest.mark.parametrize(
    "args",
    [
        ["run", "--batch-size", "four"],
        ["run", "--batch-size", "0", "--device", "cpu"],
        ["histroy"],
        ["history", "--format", "xml"],
    ],
)
def test_argparse_and_gpuanat_errors_share_one_prefix(args, db_path):
    completed = run_cli(args, db_path, timeout_s=60)
    assert completed.returncode == 2
    (line,) = completed.stderr.strip().splitlines()
    assert line.startswith("gpuanat: error: ")


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_shell_completion_knows_the_commands_and_flags(shell):
    completed = run_cli(["--print-completion", shell], None, timeout_s=60)
    assert completed.returncode == 0
    for word in ("history", "watch", "--batch-size", "--grad-checkpointing"):
        assert word in completed.stdout


def test_a_reader_that_stops_early_is_no_failure(history_db):
    pipeline = subprocess.run(
        f"{sys.executable} -m gpuanat history --json | head -c 1",
        shell=True,
        cwd=REPO,
        env=cli_env(history_db),
        capture_output=True,
        text=True,
        timeout=60,
        executable="/bin/bash",
    )
    assert pipeline.stdout == "["
    status = subprocess.run(
        f"{sys.executable} -m gpuanat history --json | head -c 1 >/dev/null; echo ${{PIPESTATUS[0]}}",
        shell=True,
        cwd=REPO,
        env=cli_env(history_db),
        capture_output=True,
        text=True,
        timeout=60,
        executable="/bin/bash",
    )
    assert status.stdout.strip() == "0", status.stderr
    assert "Traceback" not in status.stderr
