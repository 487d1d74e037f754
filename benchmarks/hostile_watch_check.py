"""Issue #28 on a GPU box: another user's process on the GPU named with escape sequences, watched for real.

Starts a process that takes 1 GiB of GPU memory and names itself `\\x1b]2;PWNED\\x07\\x1b[5m` with prctl (as any user
may) and carries more escapes and markup on its command line; beside it a plain one holding GPU memory (the process
a user watches). Then, each against the plain one:
  1. `gpuanat watch PID --json --duration 4`: NVML lists the hostile process among the other processes on the GPU; its
     name is in the JSON exactly as /proc has it.
  2. `gpuanat watch PID` (the dashboard) in a 160×50 pseudo-terminal for a few seconds, then `q`: every byte it wrote
     to the terminal is kept and searched: the hostile sequences must not be there raw (no title, clipboard or clear
     of the payload), and their escaped text must be (the name cell of "other processes on the GPU").
Writes one JSON summary (and the terminal bytes, for a second look) under --out; exits 1 when the payload went
through raw or its escaped text is missing. The `gpuanat` it runs is the one `python3 -m gpuanat` finds from the
working directory: run it from a copy of an older tree's `gpuanat/` to see that tree's behaviour.

    python benchmarks/hostile_watch_check.py --out $OUT/hostile
"""

from __future__ import annotations

import argparse
import json
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

NAME = "\x1b]2;PWNED\x07\x1b[5m"
ARGV = ["\x1b]0;PWNED\x07", "\x1b]52;c;cm0gLXJmIH4K\x07", "\x1b[2J\x1b[H", "[bold]B[/]", "[@click=app.quit]Q[/]"]
HOLD_GPU = (
    "import ctypes, sys, time, torch\n"
    "if len(sys.argv) > 1: ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0)\n"
    "x = torch.empty(1024**3, dtype=torch.uint8, device='cuda'); torch.cuda.synchronize()\n"
    "print('ready', flush=True)\n"
    "while True: time.sleep(0.1)\n"
)
RAW_PAYLOAD = ["\x1b]2;PWNED", "\x1b]0;PWNED", "\x1b]52;", "\x07\x1b[5m", "\x1b[2J\x1b[H"]
ESCAPED = ["\\x1b]2;PWNE"]


def start_holder(*argv: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", HOLD_GPU, *argv], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    assert process.stdout is not None and process.stdout.readline().strip() == "ready"
    return process


def dashboard_bytes(pid: int, seconds: float) -> bytes:
    """What `gpuanat watch PID` writes to a 160×50 terminal in `seconds`, then after `q`."""
    leader, follower = pty.openpty()
    ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "160", "LINES": "50"}
    process = subprocess.Popen(
        [sys.executable, "-m", "gpuanat", "watch", str(pid)],
        stdin=follower,
        stdout=follower,
        stderr=follower,
        env=env,
        start_new_session=True,
    )
    os.close(follower)
    output = bytearray()
    deadline = time.monotonic() + seconds
    quit_sent = False
    while True:
        if not quit_sent and time.monotonic() > deadline:
            os.write(leader, b"q")
            quit_sent = True
        ready, _, _ = select.select([leader], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            output += chunk
        if quit_sent and process.poll() is not None:
            break
        if time.monotonic() > deadline + 20:
            process.kill()
            break
    process.wait()
    os.close(leader)
    return bytes(output), process.returncode


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    hostile = start_holder(NAME, *ARGV)
    plain = start_holder()
    summary: dict[str, object] = {
        "hostile_pid": hostile.pid,
        "watched_pid": plain.pid,
        "hostile_comm": Path(f"/proc/{hostile.pid}/comm").read_bytes().decode().rstrip("\n"),
    }
    try:
        completed = subprocess.run(
            [sys.executable, "-m", "gpuanat", "watch", str(plain.pid), "--json", "--duration", "4"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        records = [json.loads(line) for line in completed.stdout.splitlines() if line.strip()]
        others = [other for record in records for other in record.get("other_gpu_processes") or []]
        summary["json_exit"] = completed.returncode
        summary["json_records"] = len(records)
        summary["json_stdout_ascii"] = completed.stdout.isascii()
        summary["other_gpu_process_names"] = sorted({other["name"] for other in others if other.get("name")})
        summary["hostile_named_exactly"] = NAME in summary["other_gpu_process_names"]
        terminal, exit_code = dashboard_bytes(plain.pid, args.seconds)
        (args.out / "dashboard_terminal.bin").write_bytes(terminal)
        text = terminal.decode("utf-8", "replace")
        summary["dashboard_exit"] = exit_code
        summary["dashboard_bytes"] = len(terminal)
        summary["raw_payload_found"] = [sequence for sequence in RAW_PAYLOAD if sequence in text]
        summary["escaped_found"] = [sequence for sequence in ESCAPED if sequence in text]
        summary["osc_sequences_in_output"] = sorted(
            {text[i : i + 6] for i in range(len(text)) if text.startswith("\x1b]", i)}
        )  # Textual's own
    finally:
        for process in (hostile, plain):
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    ok = (
        summary["hostile_named_exactly"]
        and not summary["raw_payload_found"]
        and summary["escaped_found"]
        and summary["dashboard_exit"] == 0
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
