"""Runs named from the command line (`run --name`, also with `--script`), listed and filtered by name
(`history --name`), renamed headless (`history --rename`) and in the dashboard's history (`n`). Names are data: shown
escaped, never parsed as markup, kept exactly in JSON and in the history.

The CLI is the real `gpuanat` in a subprocess (one tiny-BERT run on the CPU); the dashboard is the real app headless
(Pilot) on a real history, renaming through its real worker thread."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import last_json, run_cli
from hostile import EVIL_NAME, raw_in_terminal_output, raw_in_text
from textual.app import App
from textual.widgets import Input

from gpuanat.core.measure.process_tree import HostOnlySource
from gpuanat.core.measure.samples import NvmlStatus
from gpuanat.core.printable import printable
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.run_backend import LocalRunBackend
from gpuanat.tui.screens.history import HistoryScreen
from gpuanat.tui.screens.rename import RenameScreen
from gpuanat.tui.textual_internals import screen_compositor

MARKUP_NAME = "[red]x[/]"
TINY_RUN = ["--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "16", "--batch-size", "8"]
NO_NVML = NvmlStatus(
    available=False, reason="no NVML in this test", driver_version=None, cuda_driver_version=None, gpu_names=()
)
CPU = Capabilities(torch_version="2.13.0+cpu", cuda_available=False, reason="CPU-only build")


def history_files(db: Path) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in db.parent.glob(db.name + "*")}


def fill_history(db: Path) -> None:
    """Three finished runs: no name, a plain one, a hostile one (a title, a screen clear and markup)."""
    with HistoryStore(db) as store:
        for index, name in enumerate([None, "Sweep bf16", EVIL_NAME]):
            run_id = store.create_run(
                {"preset": "tiny", "batch_size": 4, "device": "cpu"}, name=name, created_at=1_795_294_194.0 + 60 * index
            )
            store.update_result(
                run_id,
                RunResult.from_json({"status": "ok", "run_id": run_id, "name": name, "samples_per_second": 10.0}),
                status="ok",
            )


def test_run_name_is_recorded_and_in_the_json_exactly(db_path):
    completed = run_cli(["run", *TINY_RUN, "--name", EVIL_NAME, "--json"], db_path)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert not raw_in_text(completed.stdout), raw_in_text(completed.stdout)  # JSON escapes the controls
    result = last_json(completed.stdout)
    assert result["status"] == "ok" and result["name"] == EVIL_NAME
    with HistoryStore(db_path, read_only=True) as store:
        (run,) = store.runs()
    assert run.id == result["run_id"] and run.name == EVIL_NAME


def test_a_script_run_takes_its_name_and_the_summary_shows_it_escaped(db_path, tmp_path):
    script = tmp_path / "quick.py"
    script.write_text("print('a script that trains nothing')\n")
    completed = run_cli(["run", "--script", str(script), "--name", MARKUP_NAME + "\x1b[2J"], db_path, timeout_s=120)
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert completed.stdout.splitlines()[0] == "Name: [red]x[/]\\x1b[2J"
    assert not raw_in_text(completed.stdout)
    without_name = run_cli(["run", "--script", str(script), "--json"], db_path, timeout_s=120)
    assert last_json(without_name.stdout)["name"] == "script quick.py"
    with HistoryStore(db_path, read_only=True) as store:
        assert [run.name for run in store.runs()] == [MARKUP_NAME + "\x1b[2J", "script quick.py"]


def test_history_shows_names_escaped_filters_them_and_never_writes(db_path):
    fill_history(db_path)
    before = history_files(db_path)
    table = run_cli(["history"], db_path, timeout_s=60)
    assert table.returncode == 0, table.stderr
    assert printable(EVIL_NAME) in table.stdout and "Sweep bf16" in table.stdout
    assert not raw_in_terminal_output(table.stdout)
    listed = json.loads(run_cli(["history", "--json"], db_path, timeout_s=60).stdout)
    assert [run["name"] for run in listed] == [None, "Sweep bf16", EVIL_NAME]
    for text, expected in (("bf16", [2]), ("SWEEP", [2]), ("[BOLD]b", [3]), ("\x1b]0;", [3]), ("nothing", [])):
        filtered = json.loads(run_cli(["history", "--json", "--name", text], db_path, timeout_s=60).stdout)
        assert [run["id"] for run in filtered] == expected, text
    both = run_cli(["history", "--format", "csv", "--name", "e", "--limit", "1"], db_path, timeout_s=60)
    assert [line.split(",")[0] for line in both.stdout.splitlines()] == ["id", "3"]  # the last 1 of the 2 matching
    none = run_cli(["history", "--name", "nothing"], db_path, timeout_s=60)
    assert none.returncode == 0 and none.stdout.startswith("No run's name contains “nothing”")
    assert history_files(db_path) == before


def test_history_rename_saves_the_name_as_given_and_shows_it_escaped(db_path):
    fill_history(db_path)
    renamed = run_cli(["history", "--rename", "2", EVIL_NAME], db_path, timeout_s=60)
    assert renamed.returncode == 0, renamed.stderr
    assert renamed.stdout == f"Run 2 is named “{printable(EVIL_NAME)}” now.\n"
    listed = json.loads(run_cli(["history", "--json"], db_path, timeout_s=60).stdout)
    assert listed[1]["name"] == EVIL_NAME and listed[1]["result"]["name"] == EVIL_NAME  # the stored result agrees
    cleared = run_cli(["history", "--rename", "3", ""], db_path, timeout_s=60)
    assert cleared.returncode == 0 and cleared.stdout == "Run 3 has no name now.\n"
    with HistoryStore(db_path, read_only=True) as store:
        assert [run.name for run in store.runs()] == [None, EVIL_NAME, None]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--rename", "99", "x"], "there is no run 99 in history"),
        (["--rename", "two", "x"], "RUN_ID must be a run's number"),
        (["--rename", "0", "x"], "RUN_ID must be a run's number ≥ 1"),
        (["--rename", "1"], "expected 2 arguments"),
        (["--rename", "1", "x", "--json"], "--json shapes a listing"),
        (["--rename", "1", "x", "--name", "y"], "--name shapes a listing"),
        (["--rename", "1", "name\udcff"], "is not UTF-8 text"),
        (["--name", "name\udcff"], "is not UTF-8 text"),
    ],
)
def test_every_bad_rename_or_filter_is_one_line_and_exit_2(db_path, args, expected):
    fill_history(db_path)
    before = history_files(db_path)
    completed = run_cli(["history", *args], db_path, timeout_s=60)
    assert completed.returncode == 2 and completed.stdout == ""
    assert len(completed.stderr.splitlines()) == 1 and expected in completed.stderr, completed.stderr
    assert history_files(db_path) == before


def test_renaming_in_a_history_that_does_not_exist_creates_none(tmp_path):
    db = tmp_path / "none" / "history.sqlite"
    completed = run_cli(["history", "--rename", "1", "x"], db, timeout_s=60)
    assert completed.returncode == 2 and f"the folder {db.parent} does not exist" in completed.stderr
    assert not db.parent.exists()
    completed = run_cli(["history", "--rename", "1", "x"], tmp_path / "history.sqlite", timeout_s=60)
    assert completed.returncode == 2 and "there is no run 1" in completed.stderr
    assert list(tmp_path.iterdir()) == []  # in an existing folder: no run to rename, and no history made


def cpu_dashboard(db_path: Path) -> GpuAnatApp:
    return GpuAnatApp(
        RunConfig(preset="tiny", device="cpu"),
        db_path=db_path,
        sampler_factory=lambda: (HostOnlySource(), NO_NVML),
        backend=LocalRunBackend(db_path, capabilities_probe=lambda: CPU),
        sample_interval_s=None,
        paint_interval_s=3600,
        clock=lambda: 1_000.0,
    )


def frame(app: App) -> str:
    """The screen's text, after checking that a full repaint sends the terminal nothing raw."""
    compositor = screen_compositor(app.screen)
    sent = compositor.render_full_update().render_segments(app.console)
    assert not raw_in_terminal_output(sent), raw_in_terminal_output(sent)
    return "\n".join("".join(segment.text for segment in strip) for strip in compositor.render_strips())


def stored_names(db_path: Path) -> list[str | None]:
    with HistoryStore(db_path, read_only=True) as store:
        return [run.name for run in store.runs()]


@pytest.mark.asyncio
async def test_the_dashboard_renames_the_highlighted_run(db_path):
    fill_history(db_path)
    app = cpu_dashboard(db_path)
    async with app.run_test(size=(160, 40), notifications=True) as pilot:
        await pilot.press("h")
        screen = app.screen
        assert isinstance(screen, HistoryScreen)
        assert "Rename" in frame(app)  # in the footer

        await pilot.press("up", "up", "n")  # run 1, no name yet
        assert isinstance(app.screen, RenameScreen)
        await pilot.press(*MARKUP_NAME, "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert app.screen is screen and stored_names(db_path) == [MARKUP_NAME, "Sweep bf16", EVIL_NAME]
        assert MARKUP_NAME in frame(app)  # literally, brackets and all
        await pilot.press("slash", *"RED", "enter")  # the filter finds the new name
        assert screen.shown_run_ids == [1]
        await pilot.press("escape")

        await pilot.press("down", "down", "n")  # run 3: its hostile name is not put in the box, but shown escaped
        assert app.screen.query_one(Input).value == ""
        assert f"Name of run 3 (now “{printable(EVIL_NAME)}”)" in frame(app)
        await pilot.press(*"cancelled", "escape")
        await app.workers.wait_for_complete()
        assert app.screen is screen and stored_names(db_path) == [MARKUP_NAME, "Sweep bf16", EVIL_NAME]

        await pilot.press("up", "n")  # run 2: the box holds its name; emptied, the run has no name
        assert app.screen.query_one(Input).value == "Sweep bf16"
        await pilot.press("ctrl+u", "enter")
        await app.workers.wait_for_complete()
        await pilot.pause()
        assert stored_names(db_path) == [MARKUP_NAME, None, EVIL_NAME]
        assert "Sweep bf16" not in frame(app)
        assert app.is_running and app.return_code is None
