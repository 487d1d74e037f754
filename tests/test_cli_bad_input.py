"""Bad input is refused before anything starts: exit 2, one line on stderr naming the flag, no traceback."""

from __future__ import annotations

import pytest
from conftest import run_cli

from gpuanat.core.store.history import HistoryStore

TINY = ["--preset", "tiny", "--device", "cpu"]


@pytest.mark.parametrize(("args", "flag", "allowed"), [
    (["run", "--batch-size", "0"], "--batch-size", "≥ 1"),
    (["run", "--grad-accum", "-1"], "--grad-accum", "≥ 1"),
    (["run", "--precision", "fp8"], "--precision", "'fp32', 'fp16', 'bf16'"),
    (["run", "--optim", "nope"], "--optim", "adamw_torch"),
    (["run", "--attn", "flash"], "--attn", "sdpa"),
    (["run", "--batch-size", "four"], "--batch-size", "int"),
    (["run", "--seq-len", "1024"], "--seq-len", "≤ 512"),
    (["run", "--samples", "0"], "--samples", "≥ 1"),
    (["run", "--workers", "-1"], "--workers", "≥ 0"),
    (["run", "--epochs", "0"], "--epochs", "≥ 1"),
    (["run", "--max-steps", "0"], "--max-steps", "≥ 1"),
    (["run", "--precision", "fp16"], "--precision", "needs a CUDA GPU"),
    (["run", "--tf32"], "--tf32", "needs a CUDA GPU"),
    (["run", "--optim", "adamw_bnb_8bit"], "--optim", "needs a CUDA GPU"),
    (["sweep", "--precision", "bf16"], "--precision", "the sweep sets it per experiment"),
    (["sweep", "--only", "warp drive"], "--only", "vanilla"),
    (["run", "--memory-snapshot", "run.pickle"], "--memory-snapshot", "only on CUDA, and this run is on cpu"),
    (["history", "--limit", "0"], "--limit", "≥ 1"),
    (["history", "--format", "xml"], "--format", "table"),
])
def test_bad_input_is_one_line_exit_2_and_starts_nothing(args, flag, allowed, db_path):
    extra = TINY if args[0] in ("run", "sweep") and "--device" not in args else []
    completed = run_cli([*args, *extra], db_path, timeout_s=60)
    assert completed.returncode == 2, completed.stderr
    lines = completed.stderr.strip().splitlines()
    assert len(lines) == 1, completed.stderr
    assert flag in lines[0]
    assert allowed in lines[0]
    assert "Traceback" not in completed.stderr
    assert completed.stdout == ""
    if db_path.exists():
        with HistoryStore(db_path) as store:
            assert store.runs() == []


def test_cuda_requested_on_a_machine_without_it(db_path):
    completed = run_cli(["run", "--preset", "tiny", "--device", "cuda"], db_path, timeout_s=60)
    assert completed.returncode == 2
    assert completed.stderr.strip().startswith("gpuanat: error: --device: cuda is not available here")
    assert "--device cpu" in completed.stderr


def test_help_explains_every_flag():
    completed = run_cli(["run", "--help"], None, timeout_s=60)
    assert completed.returncode == 0
    for flag in ("--preset", "--grad-checkpointing", "--precision", "--optim", "--tf32", "--pin-memory", "--attn",
                 "--compile", "--seq-len", "--samples", "--max-steps", "--db", "--json", "--memory-snapshot"):
        assert flag in completed.stdout
