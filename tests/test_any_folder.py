"""gpuanat started from any folder (issue #48, item 1): a folder holding a `gpuanat/` package of its own — a checkout of
another version, or anything named so — is where the user stands, and every child gpuanat starts (the served
dashboard, the capabilities probe, the worker, the rank launcher and torchrun's ranks, a script's launcher, the warm
worker) still imports the installed gpuanat, never that folder's (`python -P -m`, gpuanat/core/run/python_command.py).
The folder's package raises on import, so a child that imported it fails. gpuanat itself is started as its console
script starts it, from its own folder (`python -P -m gpuanat` here), not from the current one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, TINY_CPU, cli_env, last_json
from test_warm_worker import READY_TIMEOUT_S, TINY, environment, wait_until

from gpuanat.cli.serve import served_command
from gpuanat.core.run.session import execute_run
from gpuanat.core.run.warm import WarmWorkers
from gpuanat.core.store.history import HistoryStore

SHADOW_MESSAGE = "the gpuanat/ of the folder gpuanat was started in was imported"


@pytest.fixture
def shadowing_folder(tmp_path: Path) -> Path:
    """A folder with a `gpuanat/` package whose import fails, and a `torch/` one as well (torchrun's own module)."""
    folder = tmp_path / "elsewhere"
    for package in ("gpuanat", "torch"):
        (folder / package).mkdir(parents=True)
        (folder / package / "__init__.py").write_text(f"raise ImportError({SHADOW_MESSAGE!r})\n")
    return folder


def gpuanat_in(folder: Path, args: list[str], db: Path, timeout_s: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-P", "-m", "gpuanat", *args],
        cwd=folder,
        env=cli_env(db, offline_hub=True),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
    )


def test_the_served_dashboard_imports_the_installed_gpuanat_from_any_folder(shadowing_folder, tmp_path):
    command = served_command(["--", "--db", str(tmp_path / "history.sqlite")])
    served = subprocess.run(
        [*command, "--help"],
        cwd=shadowing_folder,
        env=cli_env(None),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert served.returncode == 0, served.stderr
    assert SHADOW_MESSAGE not in served.stderr and "usage: gpuanat" in served.stdout


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_run_from_a_folder_holding_a_gpuanat_package_trains(shadowing_folder, tmp_path, ranks):
    """The capabilities probe and the worker; with 2 ranks the launcher, torchrun and both ranks."""
    completed = gpuanat_in(shadowing_folder, ["run", *TINY_CPU, "--nproc", str(ranks), "--json"], tmp_path / "h.sqlite")
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert SHADOW_MESSAGE not in completed.stderr
    result = last_json(completed.stdout)
    assert result["status"] == "ok" and result["samples"] == 32 and result["config"]["nproc"] == ranks


def test_a_script_run_from_such_a_folder_imports_the_script_s_own_folder(shadowing_folder, tmp_path):
    """`run --script`: the launcher is the installed gpuanat's, and the script still imports its neighbours
    (tiny_plain_loop.py imports tiny_loop_common.py from its own folder) as `python SCRIPT` would."""
    script = REPO / "tests" / "scripts" / "tiny_plain_loop.py"
    completed = gpuanat_in(
        shadowing_folder, ["run", "--script", str(script), "--json", "--", "--probe"], tmp_path / "h.sqlite"
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert SHADOW_MESSAGE not in completed.stderr
    result = last_json(completed.stdout)
    assert result["status"] == "ok" and result["steps"] > 0 and result["config"]["loop"] == "plain"


def test_a_warm_worker_prepared_in_such_a_folder_takes_the_run(shadowing_folder, tmp_path, monkeypatch):
    monkeypatch.chdir(shadowing_folder)
    workers = WarmWorkers(enabled=True)
    try:
        workers.prepare(environment())
        wait_until(lambda: workers.status() == "ready", READY_TIMEOUT_S, "the prepared worker")
        with HistoryStore(tmp_path / "history.sqlite") as store:
            result = execute_run(TINY, store=store, log_dir=tmp_path / "logs", warm_workers=workers, env=environment())
    finally:
        workers.close()
    assert result.status == "ok" and result.start["warm"] is True
