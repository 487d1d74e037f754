"""Key remapping from the user's config file: checked against Textual's own key names and the apps' real
bindings, applied to the real app, and refused through the real CLI (a subprocess, and one in a real
pseudo-terminal) with one line and exit 2."""

from __future__ import annotations

import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from fcntl import ioctl
from pathlib import Path

import pytest
from conftest import REPO, cli_env, run_cli

from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.watch.target import resolve_target
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.keymap import KeymapError, gpuanat_apps, load_keymap
from gpuanat.tui.watch_app import WatchApp

APPS = gpuanat_apps()


def write_config(directory: Path, content: str | bytes) -> Path:
    path = directory / "gpuanat" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    return path


def refusal(path: Path) -> str:
    with pytest.raises(KeymapError) as raised:
        load_keymap(path, APPS)
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{path}: ")
    return message


def test_missing_file_means_no_remapping(tmp_path):
    assert load_keymap(tmp_path / "config.toml", APPS) == {}


def test_keys_come_back_in_textuals_names(tmp_path):
    path = write_config(tmp_path, '[keymap]\nrun = "f5"\nbatch_up = "j, +"\nhelp = "?"\nsave_watched = "ctrl+s"\n')
    assert load_keymap(path, APPS) == {
        "run": "f5",
        "batch_up": "j,plus",
        "help": "question_mark",
        "save_watched": "ctrl+s",
    }


@pytest.mark.asyncio
@pytest.mark.parametrize("name", ["dashboard", "watch dashboard"])
async def test_the_bindings_checked_are_every_binding_in_force_in_the_running_app(tmp_path, name):
    """Whatever has the focus, each key the running app answers (its own, Textual's, the screen's, the
    focused widget's) is among the bindings the keymap is checked against."""
    if name == "dashboard":
        app = GpuAnatApp(
            RunConfig(preset="tiny", device="cpu"),
            db_path=tmp_path / "h.sqlite",
            sampler_factory=lambda: open_source(prefer_nvml=False),
        )
    else:
        app = WatchApp(resolve_target(os.getpid()), db_path=tmp_path / "h.sqlite", interval_s=None)
    checked = {(binding.key, binding.action) for binding in APPS[name]}
    async with app.run_test() as pilot:
        focusable = [node for node in app.screen.walk_children() if node.can_focus]
        in_force = set()
        for widget in [None, *focusable]:
            app.set_focus(widget)
            await pilot.pause()
            in_force |= {(key, active.binding.action) for key, active in app.screen.active_bindings.items()}
    assert {("r", "run"), ("ctrl+q", "quit"), ("tab", "app.focus_next")} & in_force
    assert in_force <= checked


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ("enterr", "Textual has no key named 'enterr' (did you mean 'enter'?)"),
        ("F5", "did you mean 'f5'?"),
        ("ctrll+r", "'ctrll' is not a modifier"),
        ("shift+ctrl+up", "write 'ctrl+shift+up'"),
        ("ctrl+ctrl+r", "once each"),
        ("shift+a", "write 'A'"),
        ("ctrl+A", "write 'ctrl+shift+a'"),
        ("ctrl++", "write '+' as 'plus'"),
        ("u,,v", "a key name is empty"),
        ("", "a key name is empty"),
        ("hyphen_minus", "Textual names that key 'minus'"),
        ("latin_small_letter_u", "Textual names that key 'u'"),
        ("\\u0007", "not a printable character"),  # a TOML escape: the file holds no control character
    ],
)
def test_a_key_textual_never_reports_is_refused(tmp_path, keys, words):
    path = write_config(tmp_path, f'[keymap]\nbatch_up = "{keys}"\n')
    message = refusal(path)
    assert "batch_up" in message and words in message


@pytest.mark.parametrize(
    ("keys", "textual_name"),
    [
        ("f5", "f5"),
        ("ctrl+up", "ctrl+up"),
        ("ctrl+shift+up", "ctrl+shift+up"),
        ("shift+pageup", "shift+pageup"),
        ("U", "U"),
        ("+", "plus"),
        ("plus", "plus"),
        ("!", "exclamation_mark"),
        ("alt+?", "alt+question_mark"),
        ("comma", "comma"),
        ("€", "euro_sign"),
        ("insert", "insert"),
        ("ctrl+f12", "ctrl+f12"),
        ("shift+space", "shift+space"),
        ("alt+ctrl+u", "alt+ctrl+u"),
    ],
)
@pytest.mark.asyncio
async def test_a_key_textual_reports_is_accepted_and_drives_the_action(tmp_path, keys, textual_name):
    path = write_config(tmp_path, f'[keymap]\nbatch_up = "{keys}"\n')
    keymap = load_keymap(path, APPS)
    assert keymap == {"batch_up": textual_name}
    app = GpuAnatApp(
        RunConfig(preset="tiny", device="cpu"),
        db_path=tmp_path / "h.sqlite",
        sampler_factory=lambda: open_source(prefer_nvml=False),
        keymap=keymap,
    )
    async with app.run_test() as pilot:
        await pilot.press(textual_name)
        assert app.dashboard.config.batch_size == 8
        await pilot.press("plus")  # the default key no longer applies, unless it is the one remapped to
        assert (app.dashboard.config.batch_size > 8) == (textual_name == "plus")


@pytest.mark.parametrize(
    ("config", "key", "first", "second", "app"),
    [
        ('run = "q"', "q", "run", "quit", "dashboard"),  # the tester's: `q` started a run
        ('run = "s"', "s", "run", "stop", "dashboard"),  # and `r` no longer ran
        ('run = "f5"\nstop = "f5"', "f5", "stop", "run", "dashboard"),
        ('batch_up = "j,="\nbatch_down = "="', "equals_sign", "batch_down", "batch_up", "dashboard"),
        ('run = "ctrl+q"', "ctrl+q", "run", "quit", "dashboard"),  # Textual's own quit
        ('run = "tab"', "tab", "run", "app.focus_next", "dashboard"),  # the screen's focus key
        ('save_watched = "h"', "h", "save_watched", "history", "watch dashboard"),
        ('modules = "M"', "M", "modules", "preset", "dashboard"),  # the model key; the watch has none
        ('modules = "s"', "s", "modules", "stop", "dashboard"),
        ('run = "up"', "up", "run", "scroll_up", "dashboard"),  # the log pane, focused, scrolls with it
    ],
)
def test_two_actions_on_one_key_are_refused_naming_both(tmp_path, config, key, first, second, app):
    path = write_config(tmp_path, f"[keymap]\n{config}\n")
    message = refusal(path)
    assert f"key {key!r}" in message
    assert {first, second} <= set(message.replace("'", " ").split())
    assert f"in the {app};" in message


@pytest.mark.parametrize(
    "config",
    [
        'run = "s"\nstop = "r"',  # swapped: each key keeps one action
        'quit = "ctrl+q"',  # the same action as Textual's own ctrl+q
        'run = "r"',  # its own default
        'save_watched = "r"',  # `r` is the dashboard's, and save_watched is only the watch dashboard's
        'modules = "B"',  # a key of neither dashboard: memory by module in both
    ],
)
def test_keys_that_keep_one_action_each_are_accepted(tmp_path, config):
    path = write_config(tmp_path, f"[keymap]\n{config}\n")
    assert set(load_keymap(path, APPS)) == {line.split(" = ")[0] for line in config.splitlines()}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (b'[keymap]\nrun = "f5"\nstop = "\xff"\n', "not UTF-8 text (byte 0xff on line 3)"),
        (b"\xef\xbb\xbf[keymap\n", "not valid TOML"),
        (b'[keymap]\nrun = "f5\n', "not valid TOML"),
        (b'[keymap]\nrnu = "f5"\n', "unknown binding id 'rnu'"),
        (b"[keymap]\nrun = 5\n", "must map binding ids to key strings"),
        (b"keymap = 3\n", "must map binding ids to key strings"),
    ],
)
def test_a_file_that_cannot_be_read_says_where_and_why_in_one_line(tmp_path, content, words):
    assert words in refusal(write_config(tmp_path, content))


def test_a_directory_in_place_of_the_file_is_one_line(tmp_path):
    path = tmp_path / "gpuanat" / "config.toml"
    path.mkdir(parents=True)
    assert "cannot read the file" in refusal(path)


# --- through the real CLI -------------------------------------------------------------------------------

CLI_FAULTS = [
    (b'[keymap]\nrun = "enterr"\n', "Textual has no key named 'enterr'"),
    (b'[keymap]\nrun = "q"\n', "key 'q' would run both 'run' and 'quit'"),
    (b'[keymap]\nrun = "\xfe"\n', "not UTF-8 text"),
    (b"[keymap\n", "not valid TOML"),
]


@pytest.mark.parametrize(("content", "words"), CLI_FAULTS)
@pytest.mark.parametrize("command", ["dashboard", "watch"])
def test_the_cli_refuses_a_bad_keymap_with_one_line_and_exit_2(tmp_path, content, words, command):
    path = write_config(tmp_path / "config", content)
    args = [] if command == "dashboard" else ["watch", str(os.getpid())]
    completed = run_cli(
        args, tmp_path / "h.sqlite", timeout_s=120, extra_env={"XDG_CONFIG_HOME": str(tmp_path / "config")}
    )
    assert completed.returncode == 2, completed.stderr
    (line,) = completed.stderr.splitlines()
    assert line.startswith(f"gpuanat: error: {path}: ") and words in line
    assert completed.stdout == ""


def start_in_terminal(
    args: list[str], env: dict[str, str], *, stderr_to_terminal: bool
) -> tuple[subprocess.Popen[bytes], int]:
    """The real CLI with a pseudo-terminal as stdin and stdout, and as stderr when `stderr_to_terminal` (Textual
    draws on stderr), else stderr is a pipe, to be read whole."""
    controller, terminal = pty.openpty()
    ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 120, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuanat", *args],
        env={**env, "TERM": "xterm-256color"},
        cwd=REPO,
        stdin=terminal,
        stdout=terminal,
        stderr=terminal if stderr_to_terminal else subprocess.PIPE,
        start_new_session=True,
    )
    os.close(terminal)
    return process, controller


def drain(controller: int, seconds: float) -> bytes:
    """What the app wrote to its terminal within `seconds` (it blocks when nobody reads)."""
    output = b""
    deadline_s = time.monotonic() + seconds
    while time.monotonic() < deadline_s:
        ready, _, _ = select.select([controller], [], [], 0.1)
        if ready:
            try:
                output += os.read(controller, 1 << 16)
            except OSError:  # the app exited and closed the terminal
                break
    return output


def test_in_a_terminal_a_bad_keymap_stops_the_dashboard_before_it_starts(tmp_path):
    write_config(tmp_path / "config", b'[keymap]\nrun = "q"\n')
    env = cli_env(tmp_path / "h.sqlite", extra_env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    process, controller = start_in_terminal([], env, stderr_to_terminal=False)
    try:
        drain(controller, 0.5)
        _, stderr = process.communicate(timeout=120)
    finally:
        os.close(controller)
    assert process.returncode == 2
    (line,) = stderr.decode().splitlines()
    assert "key 'q' would run both 'run' and 'quit' in the dashboard" in line


def test_in_a_terminal_a_remapped_key_quits_the_dashboard(tmp_path):
    """A good keymap lets the dashboard start in a real terminal; `q` is then no key, and F10 quits."""
    write_config(tmp_path / "config", b'[keymap]\nquit = "f10"\n')
    env = cli_env(tmp_path / "h.sqlite", extra_env={"XDG_CONFIG_HOME": str(tmp_path / "config")})
    process, controller = start_in_terminal(["--preset", "tiny", "--device", "cpu"], env, stderr_to_terminal=True)
    try:
        screen = b""
        deadline_s = time.monotonic() + 60
        while b"Run" not in screen and time.monotonic() < deadline_s:
            screen += drain(controller, 0.5)
        assert b"Run" in screen, "the dashboard did not draw its footer"
        os.write(controller, b"q")
        drain(controller, 2.0)
        assert process.poll() is None, "q still quit"
        os.write(controller, b"\x1b[21~")  # F10, as xterm sends it
        deadline_s = time.monotonic() + 60
        while process.poll() is None and time.monotonic() < deadline_s:
            drain(controller, 0.5)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        os.close(controller)
    assert process.returncode == 0
