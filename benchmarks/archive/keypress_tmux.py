"""Key press to screen through tmux, as a person at a terminal meets it (issue #17).

Starts the real `gpuanat` in a detached tmux session of the given size, waits for the dashboard, then presses `o`
(the optimizer key) with `tmux send-keys` and polls `tmux capture-pane` until the panel shows the optimizer that key
selects; the time between is one reading (tmux's own relay and a poll of at most `POLL_S` included). Quits with `q`.

    python benchmarks/archive/keypress_tmux.py --size 80x24 --presses 20 --out benchmarks/results/cpu/keypress_tmux.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

POLL_S = 0.002
OPTIMIZER_CYCLE = ("adafactor", "adamw_bnb_8bit", "sgd", "adamw_torch ", "adamw_torch_fused")
"""What `o` shows in turn, from the default adamw_torch_fused."""


def tmux(*args: str) -> str:
    return subprocess.run(["tmux", *args], capture_output=True, text=True, check=True).stdout


def screen(session: str) -> str:
    return tmux("capture-pane", "-p", "-t", session)


def wait_for(session: str, needle: str, timeout_s: float) -> float:
    started = time.perf_counter()
    while needle not in screen(session):
        if time.perf_counter() - started > timeout_s:
            raise TimeoutError(f"{needle!r} did not show within {timeout_s} s:\n{screen(session)}")
        time.sleep(POLL_S)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size", default="80x24")
    parser.add_argument("--presses", type=int, default=20)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("gpuanat_args", nargs="*", default=["--preset", "tiny", "--device", "cpu"])
    args = parser.parse_args()
    if shutil.which("tmux") is None:
        sys.exit("tmux is not installed")
    columns, rows = (int(part) for part in args.size.split("x"))
    session = f"gpuanat-keys-{uuid.uuid4().hex[:8]}"
    command = " ".join([sys.executable, "-m", "gpuanat", *args.gpuanat_args])
    tmux("new-session", "-d", "-s", session, "-x", str(columns), "-y", str(rows), command)
    try:
        started_s = wait_for(session, "optimizer", timeout_s=120)
        time.sleep(3)  # past start-up: the capability probe and the first paints
        latencies = []
        for press in range(args.presses):
            expected = OPTIMIZER_CYCLE[press % len(OPTIMIZER_CYCLE)]
            sent = time.perf_counter()
            tmux("send-keys", "-t", session, "o")
            wait_for(session, expected, timeout_s=5)
            latencies.append(time.perf_counter() - sent)
        tmux("send-keys", "-t", session, "q")
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], capture_output=True, check=False)
    milliseconds = [1000 * value for value in latencies]
    result = {
        "what": "gpuanat key press to screen through tmux (send-keys, then capture-pane until the new value shows)",
        "size": args.size,
        "presses": args.presses,
        "gpuanat_args": args.gpuanat_args,
        "dashboard_shown_after_s": round(started_s, 2),
        "key_to_screen_ms": [round(value, 1) for value in milliseconds],
        "median_ms": round(statistics.median(milliseconds), 1),
        "max_ms": round(max(milliseconds), 1),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "tmux": tmux("-V").strip()},
    }
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
