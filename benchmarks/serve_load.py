"""`gpuanat serve` under load (issue #53, item 4), as tabs meet it: one real `gpuanat serve --debug` serving the
dashboard (a tiny BERT training on the CPU), and aiohttp's websocket client speaking textual-serve's protocol as its
page does (`tests/serve_clients.py`).

1. 20 tabs at once, of four sizes: the seconds until each is drawn the dashboard, and the farthest cell a ctrl+l
   repaint reached in each (the smallest tab's size: the dashboard fits whole in every tab).
2. A run started from one tab; then 50 tabs opened one by one, each drawn a whole screen, then dropped without a
   closing handshake (`transport.abort()`). The server's and its process tree's resident memory every 10 tabs, the
   processes before and after (psutil), the connections the server still holds, and the run's steps.
3. A tab whose client reads 4 KiB a second and one that reads nothing, beside a watching tab, for `--slow-s`
   seconds, while the watching tab presses ctrl+l 10 times a second (a whole screen each: far more output than the
   slow tabs can take): the bytes and frames per second the watching tab is drawn and the run's steps recorded,
   every 5 s, the server's memory, and what the server logged about the slow tabs (skipped ahead, cut off).

    PYTHONPATH=$PWD python3 benchmarks/serve_load.py --out benchmarks/results/cpu/serve_load/result.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from conftest import cli_env, max_step
from serve_clients import (
    StalledTab,
    Tab,
    open_connections,
    start_server,
    stop,
    tree,
    tree_rss_bytes,
)

TINY_CPU_RUN = ("--preset", "tiny", "--device", "cpu", "--seq-len", "32", "--samples", "400000", "--batch-size", "4")
SIZES = [(120, 40), (100, 30), (160, 48), (90, 28)]
MIB = 1 << 20


def server_rss_bytes(pid: int) -> int:
    return tree(pid)[0].memory_info().rss


async def drawn_during(tab: Tab, seconds: float, history: Path) -> dict[str, float]:
    """The bytes and frames per second `tab` was drawn over `seconds`, and the run's steps recorded meanwhile."""
    mark, frames, steps = len(tab.drawn), len(tab.frames), max_step(history)
    await asyncio.sleep(seconds)
    return {
        "bytes_per_s": round((len(tab.drawn) - mark) / seconds),
        "frames_per_s": round((len(tab.frames) - frames) / seconds, 1),
        "steps_recorded": max_step(history) - steps,
    }


async def redraw_storm(tab: Tab, per_s: float, stop_at: float) -> None:
    while time.monotonic() < stop_at:
        await tab.press("\x0c")
        await asyncio.sleep(1 / per_s)


async def slow_reader(tab: Tab, bytes_per_s: int, stop_at: float) -> None:
    """A client on a slow link: it takes `bytes_per_s` from its socket (aiohttp stops reading the socket when its
    own buffer is full, so the server's writes back up)."""
    tab._reader.cancel()
    while time.monotonic() < stop_at and not tab.socket.closed:
        try:
            message = await asyncio.wait_for(tab.socket.receive(), 1)
        except TimeoutError:
            continue
        if message.type.name in ("CLOSE", "CLOSED", "ERROR"):
            break
        await asyncio.sleep(len(message.data or b"") / bytes_per_s)


async def measure(args: argparse.Namespace, folder: Path) -> dict:
    history = folder / "history.sqlite"
    server, url = start_server(cli_env(history), "--", *TINY_CPU_RUN, extra=("--debug",), logs=folder)
    port = int(url.split(":")[2].split("/")[0])
    result: dict = {"tabs_at_once": args.tabs, "tabs_vanished": args.vanish}
    try:
        result["rss_idle_mib"] = {
            "server": server_rss_bytes(server.pid) / MIB,
            "tree": tree_rss_bytes(server.pid) / MIB,
        }
        started = time.monotonic()
        tabs = await asyncio.gather(*(Tab(url, *SIZES[i % len(SIZES)]).open() for i in range(args.tabs)))
        drawn_s = []
        for tab in tabs:
            await tab.wait_for_text("gpuanat", "batch size", timeout_s=120)
            drawn_s.append(time.monotonic() - started)
        await asyncio.sleep(1)
        marks = [len(tab.drawn) for tab in tabs]
        await tabs[0].press("\x0c")
        await asyncio.sleep(2)
        farthest = [tab.farthest_cell(mark) for tab, mark in zip(tabs, marks, strict=True)]
        result["twenty_tabs"] = {
            "all_drawn_within_s": round(max(drawn_s), 2),
            "farthest_cell_of_the_repaint": sorted(set(farthest)),
            "smallest_tab": [min(w for w, _ in SIZES), min(h for _, h in SIZES)],
            "rss_mib": {"server": server_rss_bytes(server.pid) / MIB, "tree": tree_rss_bytes(server.pid) / MIB},
            "pongs": sum(tab.pongs for tab in tabs),
        }
        for tab in tabs[1:]:
            await tab.close()
        watching = tabs[0]
        await watching.resize(120, 40)

        await watching.press("r")
        await watching.wait_for_text("run 1: step", timeout_s=180)
        await asyncio.sleep(3)
        processes = sorted(process.pid for process in tree(server.pid))
        connections = open_connections(server.pid, port)
        steps = max_step(history)
        rss = [(0, server_rss_bytes(server.pid), tree_rss_bytes(server.pid))]
        for index in range(1, args.vanish + 1):
            tab = await Tab(url).open()
            await tab.wait_for_text("run 1: step", timeout_s=60)
            await tab.vanish()
            if index % 10 == 0:
                await asyncio.sleep(1)
                rss.append((index, server_rss_bytes(server.pid), tree_rss_bytes(server.pid)))
        await asyncio.sleep(3)
        result["tabs_closed_mid_run"] = {
            "rss_mib_every_10_tabs": [
                {"tabs": n, "server": round(s / MIB, 1), "tree": round(t / MIB, 1)} for n, s, t in rss
            ],
            "server_rss_growth_mib": round((rss[-1][1] - rss[0][1]) / MIB, 1),
            "tree_rss_growth_mib": round((rss[-1][2] - rss[0][2]) / MIB, 1),
            "processes_before": len(processes),
            "processes_after": len(tree(server.pid)),
            "same_processes": processes == sorted(process.pid for process in tree(server.pid)),
            "connections_before": connections,
            "connections_after": open_connections(server.pid, port),
            "steps_during": max_step(history) - steps,
        }

        before = await drawn_during(watching, 5, history)
        log_before_slow = len((folder / "stdout.log").read_text())
        rss_before = server_rss_bytes(server.pid)
        stalled = StalledTab(url).open()
        slow = await Tab(url).open()
        stop_at = time.monotonic() + args.slow_s
        reading = asyncio.create_task(slow_reader(slow, 4096, stop_at))
        storm = asyncio.create_task(redraw_storm(watching, 10, stop_at))
        during: list[dict[str, float]] = []
        peak_rss = rss_before
        while time.monotonic() < stop_at:
            during.append(await drawn_during(watching, 5, history))
            peak_rss = max(peak_rss, server_rss_bytes(server.pid))
        await reading
        await storm
        connections_after_slow = open_connections(server.pid, port)
        stalled.close()
        await slow.close()
        log = (folder / "stdout.log").read_text()
        result["slow_clients"] = {
            "seconds": args.slow_s,
            "watching_tab_before": before,
            "watching_tab_during_each_5_s": during,
            "connections_at_the_end_watching_tab_included": connections_after_slow,
            "server_rss_mib_before": round(rss_before / MIB, 1),
            "server_rss_mib_peak": round(peak_rss / MIB, 1),
            "skipped_ahead_logged": log[log_before_slow:].count("skipped ahead"),
            "cut_off_logged": log[log_before_slow:].count("cut off"),
            "log_lines_of_the_slow_phase": [
                " ".join(line.split())
                for line in log[log_before_slow:].splitlines()
                if line.startswith(("INFO     tab", "WARNING", "ERROR")) and "opened" not in line
            ],
            "steps_total": max_step(history),
        }
        await watching.close()
    finally:
        stop(server)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tabs", type=int, default=20)
    parser.add_argument("--vanish", type=int, default=50)
    parser.add_argument("--slow-s", type=float, default=40)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        result = asyncio.run(measure(args, Path(folder)))
    result["machine"] = {"python": platform.python_version(), "cpus": __import__("os").cpu_count()}
    result["command"] = "PYTHONPATH=$PWD python3 benchmarks/serve_load.py " + " ".join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
