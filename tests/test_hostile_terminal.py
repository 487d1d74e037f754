"""`gpuanat watch PID` of a hostile process, in a real terminal (tmux), as a person at a terminal meets it (#28).

A local user names their process with `prctl(PR_SET_NAME)` — here the issue's `\\x1b]2;PWNED\\x07\\x1b[5m` — and
puts a window title, a clipboard write, a screen clear and Rich markup on its command line. Watched, the dashboard
must show all of it as text: the pane's title stays, no tmux paste buffer appears (OSC 52 with `set-clipboard on`),
no bell rings, the screen is neither cleared nor moved, the markup reads literally, and `q` still quits cleanly.
A control step then writes the title and clipboard payloads and a bell raw into the same pane with `printf` and
sees tmux act on each of them, so the test proves that it could fail: this tmux honours what gpuanat must not let
through (and the checks were seen to fail, title PWNED and a paste buffer `rm -rf ~`, with `printable` undone)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import REPO, cli_env
from hostile import CONTROL_PAYLOADS, HOSTILE_ARGV, MARKUP_PAYLOADS, TITLE, hostile_process, raw_in_terminal_output

COLUMNS, ROWS = 120, 40
TITLE_BEFORE = "before-gpuanat"
PANE = "hostile:0.0"
TMUX_CONF = "\n".join(
    [
        "set -g default-terminal xterm-256color",
        "set -g status off",  # the pane is the whole 120x40 terminal
        "set -g set-clipboard on",  # an OSC 52 written into the pane becomes a tmux paste buffer: visible to the test
        "set -g monitor-bell on",
        "",
    ]
)


class Tmux:
    """One tmux server of its own (its own socket and configuration), killed at the end."""

    def __init__(self, socket: str, conf: Path, env: dict[str, str]) -> None:
        self.command = ["tmux", "-L", socket, "-f", str(conf)]
        self.env = env
        self.socket_path: Path | None = None

    def __call__(self, *args: str) -> str:
        completed = subprocess.run([*self.command, *args], env=self.env, capture_output=True, text=True, timeout=10)
        assert completed.returncode == 0, f"tmux {' '.join(args)}: {completed.stderr}"
        return completed.stdout

    def screen(self, escapes: bool = False) -> str:
        return self("capture-pane", "-p", *(["-e"] if escapes else []), "-t", PANE)

    def pane(self, format_: str) -> str:
        return self("display-message", "-p", "-t", PANE, format_).rstrip("\n")

    def type_line(self, line: str) -> None:
        self("send-keys", "-t", PANE, "-l", line)
        self("send-keys", "-t", PANE, "Enter")

    def wait_for(self, what: str, ready: Callable[[], bool], timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while not ready():
            assert time.monotonic() < deadline, f"{what} not within {timeout_s} s; the pane shows:\n{self.screen()}"
            time.sleep(0.05)

    def wait_for_screen(self, what: str, shows: Callable[[str], bool], timeout_s: float = 30) -> str:
        screens = [""]

        def ready() -> bool:
            screens[0] = self.screen()
            return shows(screens[0])

        self.wait_for(what, ready, timeout_s)
        return screens[0]

    def kill(self) -> None:
        subprocess.run([*self.command, "kill-server"], env=self.env, capture_output=True, timeout=10)
        if self.socket_path is not None:  # tmux leaves its socket file behind
            self.socket_path.unlink(missing_ok=True)


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    """A detached 120x40 terminal running `sh` in the repository, with gpuanat's environment (a throwaway history,
    no other GPUANAT_* variable) and a known pane title."""
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed")
    conf = tmp_path / "tmux.conf"
    conf.write_text(TMUX_CONF)
    env = {
        key: value for key, value in cli_env(tmp_path / "history.sqlite").items() if key not in ("TMUX", "TMUX_PANE")
    } | {"TERM": "xterm-256color", "PS1": "$ "}
    server = Tmux(f"gpuanat-test-{os.getpid()}-{uuid.uuid4().hex[:8]}", conf, env)
    try:
        server("new-session", "-d", "-s", "hostile", "-x", str(COLUMNS), "-y", str(ROWS), "-c", str(REPO), "sh")
        server.socket_path = Path(server.pane("#{socket_path}"))
        server("select-pane", "-t", PANE, "-T", TITLE_BEFORE)
        assert server.pane("#{pane_width}x#{pane_height} #{pane_title}") == f"{COLUMNS}x{ROWS} {TITLE_BEFORE}"
        yield server
    finally:
        server.kill()


def _tmux_state(tmux: Tmux) -> tuple[str, str, str]:
    """What a raw sequence in the pane would change: its title, the window's bell flag, tmux's paste buffers."""
    return tmux.pane("#{pane_title}"), tmux.pane("#{window_bell_flag}"), tmux("list-buffers")


def test_watching_a_hostile_process_in_a_real_terminal_shows_its_name_and_command_line_as_text(tmux):
    with hostile_process(TITLE) as child:
        # the kernel really holds the escape as the name, and the command line really carries the payloads
        assert Path(f"/proc/{child.pid}/comm").read_bytes() == TITLE.encode() + b"\n"
        assert Path(f"/proc/{child.pid}/cmdline").read_bytes().split(b"\0")[-len(HOSTILE_ARGV) - 1 : -1] == [
            argument.encode() for argument in HOSTILE_ARGV
        ]

        tmux.type_line(f"{shlex.quote(sys.executable)} -m gpuanat watch {child.pid}; echo EXIT=$?")
        # the process panel's row of it (whatever its name shows as: a regression fails below, with the evidence)
        row_of_the_process = re.compile(rf"^│ +{child.pid} ", re.MULTILINE)
        shown = tmux.wait_for_screen(
            "the process panel's row of the hostile process", lambda screen: bool(row_of_the_process.search(screen))
        )
        # two more repaints (the charts move on every sample): the dashboard lives on after painting the strings
        for repaint in range(2):
            shown = tmux.wait_for_screen(f"repaint {repaint + 1}", lambda screen, before=shown: screen != before)
        screen = tmux.screen()
        lines = screen.splitlines()

        assert _tmux_state(tmux) == (TITLE_BEFORE, "0", ""), f"a title, bell or clipboard write got through:\n{screen}"
        # the name, escaped as repr escapes it, in the status line (whole) and in the process row (cut to its column)
        assert lines[0].startswith(" gpuanat watching PID") and r"\x1b]2;PWNED\x07\x1b[5m" in lines[0], lines[0]
        assert re.search(rf"^│ +{child.pid} \\x1b\]2;PWNE ", screen, re.MULTILINE), screen
        # every token of the command line shows, escaped or (markup) literally, as it was given
        for shown_as in (
            r"\x1b]0;PWNED\x07",
            r"\x1b]52;c;cm0gLXJmIH4K\x07",
            r"\x1b[2J\x1b[H",
            MARKUP_PAYLOADS["bold"],
            MARKUP_PAYLOADS["click"],
            r"abc\u202edcba\u2066x\u2069",
        ):
            assert shown_as in screen, f"{shown_as!r} not on the screen:\n{screen}"
        assert CONTROL_PAYLOADS["bidi"] not in screen and "\x1b" not in screen and "\x07" not in screen
        # neither cleared nor moved: the status line on the first row, the key bar on the last, the panel between
        assert len(lines) == ROWS and "q Quit" in lines[-1], screen
        assert lines[1].startswith("╭─ watched process "), screen
        # what tmux would send an outer terminal: colours only, no title, clipboard write, bell or other control
        with_escapes = tmux.screen(escapes=True)
        assert "\x1b]" not in with_escapes and "\x07" not in with_escapes
        assert not raw_in_terminal_output(with_escapes), raw_in_terminal_output(with_escapes)

        tmux("send-keys", "-t", PANE, "q")
        after = tmux.wait_for_screen("gpuanat's exit after q", lambda text: re.search(r"^EXIT=\d+$", text, re.M))
        assert re.search(r"^EXIT=0$", after, re.MULTILINE), f"gpuanat did not exit cleanly:\n{after}"
        assert child.poll() is None  # watching did not disturb the watched process
        assert _tmux_state(tmux) == (TITLE_BEFORE, "0", "")

    # the control: the same payloads written raw into the same pane do reach tmux, so each check above could fail
    tmux.type_line(
        f"printf '{CONTROL_PAYLOADS['osc2']}{CONTROL_PAYLOADS['osc52']}\\a'".replace("\x1b", r"\033").replace(
            "\x07", r"\007"
        )
    )
    tmux.wait_for(
        "tmux acting on the raw title, clipboard write and bell",
        lambda: _tmux_state(tmux)[:2] == ("PWNED", "1") and "rm -rf ~" in tmux("list-buffers"),
    )
