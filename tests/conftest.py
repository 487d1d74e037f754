"""Shared helpers: run the real `gpuanat` CLI in a subprocess against a throwaway history."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FAULT_INJECTION_DIR = Path(__file__).resolve().parent / "fault_injection"
TINY_CPU = ["--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "32", "--batch-size", "4"]
"""A tiny BERT on the CPU: a few seconds of real training after the imports."""


def cli_env(db: Path | None, fault: str | None = None, offline_hub: bool = False,
            extra_env: dict[str, str] | None = None) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("GPUANAT_")} | (extra_env or {})
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


def start_cli(args: list[str], db: Path | None, fault: str | None = None, offline_hub: bool = False,
              extra_env: dict[str, str] | None = None, **popen_kwargs) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gpuanat", *args], env=cli_env(db, fault, offline_hub, extra_env),
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen_kwargs)


def run_cli(
    args: list[str], db: Path | None, fault: str | None = None, timeout_s: float = 240,
    extra_env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    process = start_cli(args, db, fault, extra_env=extra_env)
    stdout, stderr = process.communicate(timeout=timeout_s)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def tiny_model_reference() -> dict[str, int]:
    """Exact sizes of the model tests/scripts/tiny_trainer.py builds, counted here independently."""
    from transformers import BertConfig, BertForSequenceClassification

    model = BertForSequenceClassification(BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2,
                                                     num_attention_heads=2, intermediate_size=128))
    parameters = list(model.parameters())
    return {
        "params": sum(p.numel() for p in parameters),
        "weights_bytes": sum(p.numel() * p.element_size() for p in (*parameters, *model.buffers())),
        "gradients_bytes": sum(p.numel() * p.element_size() for p in parameters),
        # AdamW: two fp32 moments per parameter and one 4-byte step counter per parameter tensor
        "optimizer_state_bytes": sum(2 * p.numel() * 4 + 4 for p in parameters),
    }


def last_json(stdout: str):
    return json.loads(stdout.strip().splitlines()[-1])


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "history.sqlite"
