"""What the dashboard costs over SSH: CPU of the TUI process and bytes written to the terminal while a run
streams, key-press latency, and time to the first sample on screen.

Runs the real `gpuanat` in a pseudo-terminal of the given size (as an SSH session would), presses keys
through it, and reads everything it writes. Targets (issue #3): ≤ 5% of one core and ≤ 50 KiB/s at
120×40 while a run streams at the default 4 Hz paint rate; a key press on screen within 100 ms; the
first sample on screen within 1 s of start.

    python benchmarks/tui_cost.py --out benchmarks/results/tui_cost_cpu.json -- --preset tiny --device cpu

Two more modes measure a fixed window (`--window-s`) of processes that only paint, CPU of one core over the
whole process tree (psutil; and per thread of the monitor's process, by OS name: gpuanat names its sampler thread
"gpuanat-sampler") and bytes written to the terminal:

- `--replay watch|dashboard`: the real apps fed at real time by NVML traces recorded on a GPU
  (benchmarks/tui_replay.py), on any machine;
- `--side-by-side`: on a GPU machine, the monitors of issue #18 on one training process, one after the other for
  the same window: nvitop at 0.25 s and at its default 2 s, `gpuanat watch PID` at 0.25 s, `gpuanat watch --json
  PID`, and nvidia-smi dmon. Give `--pid` of a training, or let it start `benchmarks/plain_trainer.py`
  (bert-large, bf16, batch 32) and stop it at the end. A monitor that is not installed is noted and skipped.

    python benchmarks/tui_cost.py --replay watch --out benchmarks/results/cpu/tui_cost_watch_replay.json
    python benchmarks/tui_cost.py --side-by-side --out benchmarks/results/h100/tui_cost_side_by_side.json
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import importlib.util
import json
import os
import platform
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import termios
import threading
import time
from pathlib import Path
from typing import Any

import psutil


class Terminal:
    """A pseudo-terminal running a command; collects (time, bytes) of everything it writes."""

    def __init__(self, command: list[str], columns: int, rows: int, env: dict[str, str]) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, columns, 0, 0))
        self.process = subprocess.Popen(
            command, stdin=slave, stdout=slave, stderr=slave, env=env, start_new_session=True
        )
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


def tree_cpu_seconds(process: psutil.Process) -> float:
    """User + system CPU seconds of `process` and its live children (a monitor may fork helpers)."""
    total = 0.0
    for one in [process, *process.children(recursive=True)]:
        try:
            times = one.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def thread_cpu_seconds(process: psutil.Process) -> dict[int, tuple[str, float]]:
    """Per thread of `process` (not its children): its OS name (the main thread's is "main") and CPU seconds."""
    threads: dict[int, tuple[str, float]] = {}
    with contextlib.suppress(psutil.Error):
        for thread in process.threads():
            try:
                with open(f"/proc/{process.pid}/task/{thread.id}/comm", encoding="utf-8") as comm:
                    name = comm.read().strip()
            except OSError:
                continue
            threads[thread.id] = ("main" if thread.id == process.pid else name, thread.user_time + thread.system_time)
    return threads


def cpu_percent_by_thread(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], window_s: float
) -> dict[str, float]:
    """% of one core each thread name used between two `thread_cpu_seconds` (threads of one name summed; a thread
    that started in the window counts from zero)."""
    by_name: dict[str, float] = {}
    for tid, (name, cpu_s) in after.items():
        by_name[name] = by_name.get(name, 0.0) + cpu_s - before.get(tid, (name, 0.0))[1]
    return {name: round(100.0 * cpu_s / window_s, 3) for name, cpu_s in sorted(by_name.items())}


def measure_window(
    command: list[str], *, columns: int, rows: int, env: dict[str, str], settle_s: float, window_s: float
) -> dict[str, Any]:
    """Run `command` in a `columns`×`rows` pseudo-terminal; after `settle_s`, its CPU (% of one core, process tree)
    and the bytes it wrote to the terminal per second over `window_s`; then end it (SIGINT, then SIGTERM, SIGKILL)."""
    terminal = Terminal(command, columns, rows, env)
    process = psutil.Process(terminal.process.pid)
    result: dict[str, Any] = {"command": command}
    time.sleep(settle_s)
    if terminal.process.poll() is not None:
        tail = b"".join(data for _, data in terminal.chunks)[-600:]
        result["error"] = f"ended before the window (exit {terminal.process.returncode}): " + tail.decode(
            "utf-8", "replace"
        )
        return result
    threads_start = thread_cpu_seconds(process)
    cpu_start, wall_start = tree_cpu_seconds(process), time.perf_counter()
    time.sleep(window_s)
    cpu_end, wall_end = tree_cpu_seconds(process), time.perf_counter()
    threads_end = thread_cpu_seconds(process)
    alive = terminal.process.poll() is None
    result.update(
        window_s=round(wall_end - wall_start, 3),
        cpu_percent_of_one_core=round(100.0 * (cpu_end - cpu_start) / (wall_end - wall_start), 3),
        cpu_percent_by_thread=cpu_percent_by_thread(threads_start, threads_end, wall_end - wall_start),
        terminal_bytes_per_s=round(terminal.bytes_between(wall_start, wall_end) / (wall_end - wall_start), 1),
    )
    if not alive:
        result["error"] = f"ended during the window (exit {terminal.process.returncode})"
    for sig, wait_s in ((signal.SIGINT, 5), (signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        if terminal.process.poll() is not None:
            break
        try:
            os.killpg(terminal.process.pid, sig)
        except ProcessLookupError:
            break
        try:
            terminal.process.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    return result


def pty_env(scratch: Path) -> dict[str, str]:
    return {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor", "GPUANAT_DB": str(scratch / "h.sqlite")}


def replay(args: argparse.Namespace) -> dict[str, Any]:
    """The real app of `args.replay` fed by a recorded trace at real time (benchmarks/tui_replay.py)."""
    script = Path(__file__).resolve().parent / "tui_replay.py"
    env = pty_env(Path(tempfile.mkdtemp(prefix="gpuanat-tui-cost-")))
    profile = ["--profile", str(args.profile.resolve())] if args.profile else []
    measured = measure_window(
        [sys.executable, str(script), args.replay, "--interval", str(args.interval), *profile],
        columns=args.columns,
        rows=args.rows,
        env=env,
        settle_s=args.settle_s,
        window_s=args.window_s,
    )
    return {"mode": f"replay {args.replay}", "interval_s": args.interval, **measured}


PLAIN_TRAINING = '{"precision": "bf16", "batch_size": 32, "samples": 100000}'
"""bert-large for much longer than the measurements take."""


def side_by_side(args: argparse.Namespace) -> dict[str, Any]:
    """Each monitor of issue #18 on one training process, one after the other, each for `args.window_s`."""
    scratch = Path(tempfile.mkdtemp(prefix="gpuanat-tui-cost-"))
    env = pty_env(scratch)
    trainer = None
    pid = args.pid
    result: dict[str, Any] = {"mode": "side by side", "interval_s": args.interval}
    if pid is None:
        log = (scratch / "trainer.log").open("w")
        trainer_command = [
            sys.executable,
            str(Path(__file__).resolve().parent / "plain_trainer.py"),
            "--config",
            args.trainer_config,
        ]
        trainer = subprocess.Popen(trainer_command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        pid = trainer.pid
        result["trainer"] = {"command": trainer_command, "log": str(scratch / "trainer.log")}
        time.sleep(args.trainer_warmup_s)  # model built, training under way
    result["pid"] = pid
    nvitop = (
        [sys.executable, "-m", "nvitop"]
        if importlib.util.find_spec("nvitop") is not None
        else [shutil.which("nvitop")]
        if shutil.which("nvitop")
        else None
    )
    gpuanat = [sys.executable, "-m", "gpuanat"]
    monitors: list[tuple[str, list[str] | None, str]] = [
        (
            "nvitop --interval 0.25",
            nvitop and [*nvitop, "--interval", str(args.interval)],
            "nvitop is not installed (pip install --no-index --find-links .whl nvitop)",
        ),
        ("nvitop (default interval, 2 s)", nvitop, "nvitop is not installed"),
        (
            f"gpuanat watch PID --interval {args.interval}",
            [*gpuanat, "watch", str(pid), "--interval", str(args.interval)],
            "",
        ),
        (
            f"gpuanat watch --json PID --interval {args.interval}",
            [*gpuanat, "watch", "--json", str(pid), "--interval", str(args.interval)],
            "",
        ),
        ("nvidia-smi dmon", shutil.which("nvidia-smi") and ["nvidia-smi", "dmon"], "nvidia-smi is not on PATH"),
    ]
    rows: list[dict[str, Any]] = []
    try:
        for name, command, missing in monitors:
            if trainer is not None and trainer.poll() is not None:
                rows.append({"monitor": name, "skipped": f"the training ended (exit {trainer.returncode})"})
                continue
            if not psutil.pid_exists(pid):
                rows.append({"monitor": name, "skipped": f"PID {pid} is gone"})
                continue
            if command is None:
                print(f"tui_cost: {name}: skipped, {missing}", file=sys.stderr)
                rows.append({"monitor": name, "skipped": missing})
                continue
            measured = measure_window(
                command, columns=args.columns, rows=args.rows, env=env, settle_s=args.settle_s, window_s=args.window_s
            )
            print(
                f"tui_cost: {name}: {measured.get('cpu_percent_of_one_core')}% of one core, "
                f"{measured.get('terminal_bytes_per_s')} B/s {measured.get('error', '')}",
                file=sys.stderr,
            )
            rows.append({"monitor": name, **measured})
    finally:
        if trainer is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(trainer.pid, signal.SIGTERM)
            try:
                trainer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(trainer.pid, signal.SIGKILL)
    result["monitors"] = rows
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--columns", type=int, default=120)
    parser.add_argument("--rows", type=int, default=40)
    parser.add_argument("--stream-s", type=float, default=20.0, help="how long to measure while the run streams")
    parser.add_argument(
        "--replay",
        choices=("watch", "dashboard"),
        help="measure the app fed by a recorded trace (no GPU needed) instead of a real run",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        help="--replay: write the terminal bytes per widget per second here (tui_replay.py --profile)",
    )
    parser.add_argument(
        "--side-by-side",
        action="store_true",
        help="measure nvitop, gpuanat watch, watch --json and nvidia-smi dmon on one training",
    )
    parser.add_argument("--pid", type=int, help="--side-by-side: the training to watch (default: start one)")
    parser.add_argument(
        "--trainer-config",
        default=PLAIN_TRAINING,
        help="--side-by-side without --pid: the RunConfig JSON of benchmarks/plain_trainer.py",
    )
    parser.add_argument(
        "--trainer-warmup-s",
        type=float,
        default=60.0,
        help="--side-by-side without --pid: wait this long for the training to start",
    )
    parser.add_argument("--interval", type=float, default=0.25, help="sampling interval of the monitors, seconds")
    parser.add_argument("--window-s", type=float, default=30.0, help="measured window of each monitor")
    parser.add_argument("--settle-s", type=float, default=5.0, help="wait before each window (start-up)")
    parser.add_argument("gpuanat_flags", nargs="*", help="technique flags for the run (after --)")
    args = parser.parse_args()
    if args.replay or args.side_by_side:
        result = replay(args) if args.replay else side_by_side(args)
        result.update(
            columns=args.columns,
            rows=args.rows,
            machine=platform.node(),
            python=platform.python_version(),
            cpu_count=os.cpu_count(),
        )
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        print(json.dumps(result, indent=2))
        return

    scratch = Path(tempfile.mkdtemp(prefix="gpuanat-tui-cost-"))
    env = {**os.environ, "TERM": "xterm-256color", "COLORTERM": "truecolor", "GPUANAT_DB": str(scratch / "h.sqlite")}
    terminal = Terminal([sys.executable, "-m", "gpuanat", *args.gpuanat_flags], args.columns, args.rows, env)
    tui = psutil.Process(terminal.process.pid)
    result: dict[str, object] = {
        "columns": args.columns,
        "rows": args.rows,
        "flags": args.gpuanat_flags,
        "machine": platform.node(),
        "python": platform.python_version(),
    }
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
        threads_start = thread_cpu_seconds(tui)
        cpu_start, wall_start = tui.cpu_times(), time.perf_counter()
        time.sleep(args.stream_s)
        cpu_end, wall_end = tui.cpu_times(), time.perf_counter()
        threads_end = thread_cpu_seconds(tui)
        cpu_s = (cpu_end.user + cpu_end.system) - (cpu_start.user + cpu_start.system)
        result["streaming_window_s"] = wall_end - wall_start
        result["tui_cpu_percent_of_one_core"] = 100.0 * cpu_s / (wall_end - wall_start)
        result["tui_cpu_percent_by_thread"] = cpu_percent_by_thread(threads_start, threads_end, wall_end - wall_start)
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
