"""A big history timed in a real terminal, as a person meets it (issue #53): tmux, a 200×50 pane, polled every 10 ms.

    PYTHONPATH=$PWD python3 benchmarks/history_tmux.py --history /tmp/big.sqlite --out result.json

With a history of 10,000 runs (`history_scale.make_history`, made if the file is absent):
- `gpuanat history --db H` typed at a shell prompt: from Enter to the prompt's marker after the last row;
- `gpuanat --db H --preset tiny --device cpu`: the dashboard drawn, then `h`: from the key to the history's first
  rows on screen (a run's name, `exp-`, in the pane); then `/` and `exp-42`: from the last key to the pane showing
  only matching rows.
Each three times; the report keeps every time and the median.
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from history_scale import make_history, seed_run

SESSION = "gpuanat-history-tmux"
REPEATS = 3


def tmux(*arguments: str) -> str:
    return subprocess.run(["tmux", *arguments], capture_output=True, text=True, check=True).stdout


def pane() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION)


def wait_for(condition, timeout_s: float = 60.0) -> float:
    began = time.perf_counter()
    while time.perf_counter() - began < timeout_s:
        if condition(pane()):
            return time.perf_counter()
        time.sleep(0.01)
    raise TimeoutError(pane()[-800:])


def timed_listing(db: Path) -> float:
    marker = f"DONE-{time.monotonic_ns()}"
    tmux("send-keys", "-t", SESSION, "clear", "Enter")
    time.sleep(0.3)
    tmux("send-keys", "-t", SESSION, f"{sys.executable} -m gpuanat history --db {shlex.quote(str(db))}; echo {marker}")
    began = time.perf_counter()
    tmux("send-keys", "-t", SESSION, "Enter")
    return wait_for(lambda text: f"\n{marker}" in text) - began


def timed_dashboard(db: Path) -> tuple[float, float]:
    """One dashboard in a fresh tmux session: (h to the first rows, the filter's last key to the filtered rows)."""
    new_session()
    command = f"{sys.executable} -m gpuanat --db {shlex.quote(str(db))} --preset tiny --device cpu"
    tmux("send-keys", "-t", SESSION, command, "Enter")
    wait_for(lambda text: "Techniques" in text)
    time.sleep(2)
    began = time.perf_counter()
    tmux("send-keys", "-t", SESSION, "h")
    opened = wait_for(lambda text: "exp-" in text) - began
    time.sleep(1)
    tmux("send-keys", "-t", SESSION, "/")
    time.sleep(1)
    tmux("send-keys", "-t", SESSION, "-l", "exp-4")
    time.sleep(1.5)
    began = time.perf_counter()
    tmux("send-keys", "-t", SESSION, "-l", "2")
    names = lambda text: [word for word in text.split() if word.startswith("exp-")]  # noqa: E731
    filtered = wait_for(lambda text: bool(names(text)) and all(n.startswith("exp-42") for n in names(text))) - began
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)  # SIGHUP: the dashboard ends
    time.sleep(2)
    return opened, filtered


def new_session() -> None:
    subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    tmux("new-session", "-d", "-s", SESSION, "-x", "200", "-y", "50", "bash --norc")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--history", type=Path, required=True, help="reuse (or make, if absent) this history")
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not args.history.exists():
        with tempfile.TemporaryDirectory() as folder:
            make_history(seed_run(Path(folder)), args.history, args.runs)
    new_session()
    try:
        listings = [round(timed_listing(args.history), 3) for _ in range(REPEATS)]
        dashboards = [timed_dashboard(args.history) for _ in range(REPEATS)]
    finally:
        subprocess.run(["tmux", "kill-session", "-t", SESSION], capture_output=True)
    result = {
        "runs": args.runs,
        "history_bytes": args.history.stat().st_size,
        "history_in_tmux_s": listings,
        "history_in_tmux_median_s": sorted(listings)[1],
        "dashboard_h_to_rows_s": [round(opened, 3) for opened, _ in dashboards],
        "dashboard_filter_key_to_rows_s": [round(filtered, 3) for _, filtered in dashboards],
        "pane": "200x50",
    }
    print(json.dumps(result, indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
