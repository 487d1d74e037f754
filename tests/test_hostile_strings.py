"""Issue #28, the headless half: strings from outside — run names, model paths, process names and command lines,
errors that quote them — reach the output of every `gpuanat` command as data. `history` as a terminal table,
md and CSV, error lines, `--help` and `watch --json`, each run for real in a subprocess (a terminal where it
matters), fed every payload of `hostile.py`. JSON keeps the exact strings; everything else shows them escaped."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from conftest import REPO, cli_env, cli_in_terminal, run_cli
from hostile import (
    ALL_PAYLOADS,
    CONTROL_PAYLOADS,
    EVIL_NAME,
    LONG_NAME,
    MARKUP_PAYLOADS,
    TITLE,
    hostile_process,
    raw_in_terminal_output,
    raw_in_text,
)

from gpuanat.core.printable import printable, printable_keeping_colours
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.result import RunResult

STORABLE = {key: value for key, value in ALL_PAYLOADS.items() if key != "not_utf8"}
"""Names the history can hold as given (SQLite text is UTF-8; a name that is not is refused at the door)."""
HOSTILE_MODEL = "/models/" + CONTROL_PAYLOADS["osc2"] + MARKUP_PAYLOADS["bold"] + CONTROL_PAYLOADS["not_utf8"]


@pytest.mark.parametrize("payload", ALL_PAYLOADS.values(), ids=ALL_PAYLOADS.keys())
def test_printable_leaves_no_control_and_loses_no_character(payload):
    shown = printable(payload)
    assert not raw_in_text(shown)
    if payload.isprintable():  # plain text and markup: shown as given (markup is the views' to not parse)
        assert shown == payload
    else:  # nothing dropped: the printable characters in their order, each other one written out
        rest = iter(shown)
        assert all(character in rest for character in payload if character.isprintable())
        assert len(shown) > len(payload) and shown.count("\\") >= sum(not c.isprintable() for c in payload)


def test_printable_writes_escapes_as_python_and_ls_b_do():
    assert printable("bert-large-uncased") == "bert-large-uncased"
    assert printable("名前 ✓ émoji 🚀") == "名前 ✓ émoji 🚀"
    assert printable(TITLE) == "\\x1b]2;PWNED\\x07\\x1b[5m"
    assert printable("a\x00b\x7fc\x9bd") == "a\\x00b\\x7fc\\x9bd"
    assert printable("one\ntwo\tthree\r") == "one\\ntwo\\tthree\\r"
    assert printable("one\ntwo", keep="\n") == "one\ntwo"
    assert printable("abc\u202edcba") == "abc\\u202edcba"
    assert printable("name\udcff") == "name\\xff"  # a byte that was not UTF-8, as the byte
    assert printable(42) == "42"


def test_a_log_line_keeps_its_colours_and_nothing_else():
    line = "\x1b[31mred\x1b[0m " + CONTROL_PAYLOADS["osc52"] + CONTROL_PAYLOADS["clear"]
    shown = printable_keeping_colours(line)
    assert shown.startswith("\x1b[31mred\x1b[0m ")
    assert (
        "\\x1b]52;c;" in shown
        and "\\x1b[2J" in shown
        and not raw_in_text(shown.replace("\x1b[31m", "").replace("\x1b[0m", ""))
    )


@pytest.fixture
def hostile_history(tmp_path):
    """A history whose runs are named with every payload, a 10,000-character name and the issue's name, their
    model a hostile path."""
    db = tmp_path / "history.sqlite"
    names = [*STORABLE.values(), LONG_NAME, EVIL_NAME]
    with HistoryStore(db) as store:
        for name in names:
            run_id = store.create_run(
                {"preset": "tiny", "model": HOSTILE_MODEL, "batch_size": 4, "device": "cpu"}, name=name
            )
            store.update_result(
                run_id,
                RunResult.from_json(
                    {"status": "ok", "run_id": run_id, "device_name": "x86_64" + TITLE, "samples_per_second": 12.5}
                ),
                status="ok",
            )
    return db, names


@pytest.mark.parametrize("columns", [80, 200])
def test_the_history_table_in_a_terminal_shows_every_name_escaped(hostile_history, columns):
    db, _ = hostile_history
    returncode, terminal, stderr = cli_in_terminal(["history"], db, columns, lines=50, term="xterm-256color")
    assert returncode == 0, stderr
    assert not raw_in_terminal_output(terminal), raw_in_terminal_output(terminal)
    assert not raw_in_text(stderr)
    # the terminal got no title, link, clipboard write or clear, even from a cell cut short by its column's "…"
    for sequence in ("\x1b]", "\x07", "\x1b[2J", "\x1b[10A", "\x9b", "\u202e"):
        assert sequence not in terminal
    assert "evil\\x1b]" in terminal  # the 10,000-character name cuts the name column short: the start shows


def test_the_history_table_into_a_pipe_shows_every_name_whole_and_escaped(hostile_history):
    db, names = hostile_history
    completed = run_cli(["history"], db, timeout_s=60)
    assert completed.returncode == 0, completed.stderr
    assert not raw_in_text(completed.stdout), raw_in_text(completed.stdout)
    for name in names:  # markup shown as it was given: Rich parsed none of it
        if name != LONG_NAME:  # wider than a pipe's table (10,000 columns): md, CSV and JSON give it whole
            assert printable(name) in completed.stdout
    assert "/models/\\x1b]2;PWNED" in completed.stdout  # the model path, cut short beside the long name


@pytest.mark.parametrize("format_", ["md", "csv"])
def test_history_as_md_or_csv_shows_every_name_escaped(hostile_history, format_):
    db, names = hostile_history
    completed = run_cli(["history", "--format", format_], db, timeout_s=60)
    assert completed.returncode == 0, completed.stderr
    text = completed.stdout.replace("\r\n", "\n")  # CSV's own line ends
    assert not raw_in_text(text), raw_in_text(text)
    for name in names:
        assert (printable(name).replace("|", "\\|") if format_ == "md" else printable(name)) in text
    assert "evil\\x1b]0;PWNED\\x07\\x1b[2J[bold]B[/]" in text
    assert ("x" * 10_000 + "\\x1b]2;PWNED") in text  # a long name whole, its escape after it escaped too
    rows = text.splitlines()
    assert len(rows) == (2 if format_ == "md" else 1) + len(names)  # no name broke a row in two


def test_history_as_json_keeps_the_exact_strings(hostile_history):
    db, names = hostile_history
    completed = run_cli(["history", "--format", "json"], db, timeout_s=60)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.isascii()  # the encoder escaped every control: nothing raw on the way
    runs = json.loads(completed.stdout)
    assert [run["name"] for run in runs] == names
    assert runs[0]["config"]["model"] == HOSTILE_MODEL and runs[0]["result"]["device_name"] == "x86_64" + TITLE


def test_an_error_line_quoting_a_hostile_path_shows_it_escaped(tmp_path):
    completed = run_cli(["run", "--device", "cpu", "--model", HOSTILE_MODEL], tmp_path / "h.sqlite", timeout_s=60)
    assert completed.returncode == 2
    assert not raw_in_text(completed.stderr) and not raw_in_text(completed.stdout)
    assert "gpuanat: error:" in completed.stderr and printable(HOSTILE_MODEL) in completed.stderr
    assert len(completed.stderr.strip().splitlines()) == 1


def test_help_and_a_hostile_history_path_print_nothing_raw(tmp_path):
    hostile_dir = tmp_path / ("db" + CONTROL_PAYLOADS["osc2"] + "[bold]B[@click=app.quit]Q")  # no "/" in a name
    hostile_dir.mkdir()
    db = hostile_dir / "history.sqlite"
    for args in (["--help"], ["history", "--help"], ["watch", "--help"], ["history"]):
        completed = run_cli(args, db, timeout_s=60)
        assert completed.returncode == 0, completed.stderr
        assert not raw_in_text(completed.stdout) and not raw_in_text(completed.stderr), args
    # "No runs recorded yet … (history: PATH)"
    assert "db\\x1b]2;PWNED\\x07[bold]B[@click=app.quit]Q" in completed.stdout


def test_a_run_name_that_is_not_utf8_is_refused_in_one_line(tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "gpuanat", "watch", str(os.getpid()), "--json", "--save", b"name\xff\x1b]0;PWNED\x07"],
        cwd=REPO,
        env=cli_env(tmp_path / "h.sqlite"),
        capture_output=True,
        timeout=60,
    )
    stderr = completed.stderr.decode()
    assert completed.returncode == 2 and not completed.stdout
    assert len(stderr.strip().splitlines()) == 1 and "UTF-8" in stderr
    assert not raw_in_text(stderr) and "name\\xff\\x1b]0;PWNED\\x07" in stderr
    assert not (tmp_path / "h.sqlite").exists()


@pytest.mark.parametrize("process_name", [TITLE, "bad\udcff\udcfe\u202e"], ids=["escapes", "not_utf8"])
def test_watch_json_keeps_a_hostile_process_exact_and_history_shows_it_escaped(tmp_path, process_name):
    db = tmp_path / "h.sqlite"
    with hostile_process(process_name) as child:
        watcher = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gpuanat",
                "watch",
                str(child.pid),
                "--json",
                "--interval",
                "0.1",
                "--save",
                EVIL_NAME,
            ],
            cwd=REPO,
            env=cli_env(db),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            deadline = time.monotonic() + 60
            record = {}
            while not record.get("processes"):
                assert time.monotonic() < deadline, "no record with the process tree"
                line = watcher.stdout.readline()
                assert line, watcher.stderr.read()
                assert line.isascii()  # JSON: every control escaped by the encoder
                record = json.loads(line)
        finally:
            os.killpg(child.pid, 9)
        _, stderr = watcher.communicate(timeout=60)
    assert [process["name"] for process in record["processes"]] == [process_name]  # the exact bytes, as given
    assert not raw_in_text(stderr)
    completed = run_cli(["history", "--format", "md"], db, timeout_s=60)
    assert not raw_in_text(completed.stdout)
    assert printable(EVIL_NAME) in completed.stdout and "exited" in completed.stdout
    (run,) = json.loads(run_cli(["history", "--format", "json"], db, timeout_s=60).stdout)
    assert run["name"] == EVIL_NAME  # stored as given


def test_a_keymap_naming_a_hostile_key_is_refused_in_one_escaped_line(tmp_path):
    config = tmp_path / "config" / "gpuanat" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text('[keymap]\nrun = "\\u001b]0;PWNED\\u0007[bold]B[/]"\n')  # TOML's escapes: ESC and BEL
    completed = run_cli(
        [], tmp_path / "h.sqlite", timeout_s=120, extra_env={"XDG_CONFIG_HOME": str(tmp_path / "config")}
    )
    assert completed.returncode == 2 and completed.stdout == ""
    (line,) = completed.stderr.splitlines()
    assert not raw_in_text(line) and "\\x1b]0;PWNED\\x07[bold]B[/]" in line
