"""What the dashboard costs over SSH: CPU of the TUI process and bytes written to the terminal while a run
streams, key-press latency, and time to the first sample on screen.

Runs the real `gpuanat` in a pseudo-terminal of the given size (as an SSH session would), presses keys
through it, and reads everything it writes. Targets (issue #3): ≤ 5% of one core and ≤ 50 KiB/s at
120×40 while a run streams at the default 4 Hz paint rate; a key press on screen within 100 ms; the
first sample on screen within 1 s of start.

    python benchmarks/tui_cost.py --out benchmarks/results/tui_cost_cpu.json -- --preset tiny --device cpu
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path

import psutil


class Terminal:
    """A pseudo-terminal running a command; collects (time, bytes) of everything it writes."""

    def __init__(self, command: list[str], columns: int, rows: int, env: dict[str, str]) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.process = subprocess.Popen(command, stdin=slave, stdout=slave, stderr=slave, env=env,
                                        start_new_session=True)
        os.close(slave)
        self._master = master
        self.chunks: list[tuple[float, bytes]] = []
        self._lock = threading.Lock()
        self.started_s = time.perf_counter()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data = os.read(self._master, 65536)
            except OSError:
                return
            if not data:
                return
            with self._lock:
                self.chunks.append((time.perf_counter(), data))

    def press(self, keys: str) -> float:
        sent_s = time.perf_counter()
        os.write(self._master, keys.encode())
        return sent_s

    def wait_for(self, needle: bytes, after_s: float, timeout_s: float) -> float | None:
        """When `needle` first appeared in output written after `after_s` (None on timeout)."""
        deadline = time.perf_counter() + timeout_s
        while time.perf_counter() < deadline:
            with self._lock:
                output = b"".join(data for t, data in self.chunks if t >= after_s)
                times = [t for t, data in self.chunks if t >= after_s]
            if needle in output:
                position, total = output.index(needle), 0
                with self._lock:
                    for t, data in self.chunks:
                        if t < after_s:
                            continue
                        total += len(data)
                        if total > position:
                            return t
                return times[-1]
            time.sleep(0.005)
        return None

    def bytes_between(self, start_s: float, end_s: float) -> int:
        with self._lock:
            return sum(len(data) for t, data in self.chunks if start_s <= t < end_s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--columns", type=int, default=120)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--stream-s", type=float, default=20.0, help="how long to measure while the run streams")
    parser.add_argument("gpuanat_flags", nargs="*", help="technique flags for the run (after --)")
    args = parser.parse_args()

    scratch = Path(tempfile.mkdtemp(prefix="gpuanat-tui-cost-"))
    env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor", "GPUANAT_DB": str(scratch / "h.sqlite")}
    terminal = Terminal([sys.executable, "-m", "gpuanat", *args.gpuanat_flags], args.columns, args.rows, env)
    tui = psutil.Process(terminal.process.pid)
    result: dict[str, object] = {"columns": args.columns, "rows": args.rows, "flags": args.gpuanat_flags,
                                 "machine": platform.node(), "python": platform.python_version()}
    first_frame = terminal.wait_for(b"Techniques", terminal.started_s, timeout_s=30)
    result["first_frame_s"] = None if first_frame is None else first_frame - terminal.started_s
    # The first NVML sample puts a GiB figure on screen (the memory chart's legend and the memory bar);
    # without a GPU there is none, and this stays None.
    first_value = terminal.wait_for(b"GiB", terminal.started_s, timeout_s=10)
    result["first_sample_on_screen_s"] = None if first_value is None else first_value - terminal.started_s
    time.sleep(3)  # let the capability probe answer
    latencies = []
    for key, needle in (("o", b"adafactor"), ("o", b"adamw_bnb_8bit"), ("o", b"sgd"), ("o", b"adamw_torch ")):
        sent = terminal.press(key)
        shown = terminal.wait_for(needle, sent, timeout_s=5)
        latencies.append(None if shown is None else shown - sent)
        time.sleep(0.3)
    result["key_to_screen_s"] = latencies
    terminal.press("r")
    streaming = terminal.wait_for(b"step ", time.perf_counter(), timeout_s=300)
    if streaming is None:
        result["error"] = "the run never reported a step"
    else:
        time.sleep(2)
        cpu_start, wall_start = tui.cpu_times(), time.perf_counter()
        time.sleep(args.stream_s)
        cpu_end, wall_end = tui.cpu_times(), time.perf_counter()
        cpu_s = (cpu_end.user + cpu_end.system) - (cpu_start.user + cpu_start.system)
        result["streaming_window_s"] = wall_end - wall_start
        result["tui_cpu_percent_of_one_core"] = 100.0 * cpu_s / (wall_end - wall_start)
        result["terminal_bytes_per_s"] = terminal.bytes_between(wall_start, wall_end) / (wall_end - wall_start)
    terminal.press("q")
    time.sleep(0.5)
    terminal.press("y")
    try:
        terminal.process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        terminal.process.kill()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
