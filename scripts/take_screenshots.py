"""Screenshots for the README, taken with the real app (headless, real NVML, a real run).

Starts the dashboard, runs one configuration, saves the dashboard mid-run, then after a second run
with other techniques saves the history pane and the compare view of the two runs.

    python scripts/take_screenshots.py --out-dir screenshots

The watch dashboard: `--watch-pid PID` watches a live process for `--mid-run-s` seconds and saves
watch.svg (on the GPU machine, a real bert-large run started outside gpuanat); `--watch-replay` saves
watch_replay.svg from the H100 recording in tests/data, replayed as a watched process (no GPU needed).
`--operations` saves operations.svg: the dashboard after `O`, with an H100 profile's operations anatomy (no GPU).
`--modules` saves out_of_memory.svg and modules.svg: the dashboard after the out-of-memory failure recorded on an H200
(tests/recorded_backend.py's replay), then memory by module (`b`) at that failure (no GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.watch.target import resolve_target
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.watch_app import WatchApp

COLUMNS, ROWS = 120, 40


async def run_until_mid_run(app: GpuAnatApp, pilot, mid_run_s: float) -> None:
    """Press r once the capabilities are known, and wait `mid_run_s` past the run's first step (or its end)."""
    while app.dashboard.capabilities is None:
        await pilot.pause(0.2)
    await pilot.press("r")
    while app.dashboard.run_in_progress is None or app.dashboard.run_in_progress.last_step is None:
        await pilot.pause(0.2)
    started = time.monotonic()
    while time.monotonic() - started < mid_run_s and app.dashboard.run_in_progress is not None:
        await pilot.pause(0.25)


async def take_live_lanes(
    out_dir: Path, config: RunConfig, mid_run_s: float, filename: str, other_sizes: list[tuple[int, int]]
) -> None:
    """The dashboard during a live run on several GPUs: one lane per GPU once every rank has measured a step; then
    the same moment at each of `other_sizes` (the terminal resized, as a user does), saved as STEM_COLSxROWS.svg."""
    db_path = Path(tempfile.mkdtemp(prefix="gpuanat-shots-")) / "history.sqlite"
    app = GpuAnatApp(config, db_path=db_path)
    async with app.run_test(size=(COLUMNS, ROWS)) as pilot:
        await run_until_mid_run(app, pilot, mid_run_s)
        app.save_screenshot(filename=filename, path=str(out_dir))
        stem, _, suffix = filename.rpartition(".")
        for columns, rows in other_sizes:
            await pilot.resize_terminal(columns, rows)
            await pilot.pause(1.0)
            app.save_screenshot(filename=f"{stem}_{columns}x{rows}.{suffix}", path=str(out_dir))
        await pilot.press("q")


async def take(out_dir: Path, first: RunConfig, second_keys: list[str], mid_run_s: float) -> None:
    db_path = Path(tempfile.mkdtemp(prefix="gpuanat-shots-")) / "history.sqlite"
    app = GpuAnatApp(first, db_path=db_path)
    async with app.run_test(size=(COLUMNS, ROWS)) as pilot:
        await run_until_mid_run(app, pilot, mid_run_s)
        app.save_screenshot(filename="dashboard.svg", path=str(out_dir))
        while app.dashboard.run_in_progress is not None:
            await pilot.pause(0.5)
        await pilot.press(*second_keys, "r")
        await pilot.pause(1.0)
        while app.dashboard.run_in_progress is not None:
            await pilot.pause(0.5)
        await pilot.pause(1.0)
        app.save_screenshot(filename="dashboard_after_run.svg", path=str(out_dir))
        await pilot.press("h")
        await pilot.pause(0.5)
        app.save_screenshot(filename="history.svg", path=str(out_dir))
        await pilot.press("up", "space", "space", "enter")
        await pilot.pause(1.0)
        app.save_screenshot(filename="compare.svg", path=str(out_dir))
        await pilot.press("escape")
        await pilot.press("q")


async def take_watch(out_dir: Path, pid: int, watch_s: float) -> None:
    db_path = Path(tempfile.mkdtemp(prefix="gpuanat-shots-")) / "history.sqlite"
    app = WatchApp(resolve_target(pid), db_path=db_path)
    async with app.run_test(size=(COLUMNS, ROWS)) as pilot:
        started = time.monotonic()
        while time.monotonic() - started < watch_s and not app.exited:
            await pilot.pause(0.25)
        app.save_screenshot(filename="watch.svg", path=str(out_dir))
        await pilot.press("q")


async def take_watch_replay(out_dir: Path) -> None:
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from watch_replay import make_watch_app, replay

    scratch = Path(tempfile.mkdtemp(prefix="gpuanat-shots-"))
    app = make_watch_app(scratch / "history.sqlite", scratch / "proc")
    async with app.run_test(size=(COLUMNS, ROWS)) as pilot:
        replay(app, until_elapsed_s=3.0)
        await pilot.pause(0.5)
        app.save_screenshot(filename="watch_replay.svg", path=str(out_dir))


async def take_dashboard_replay(out_dir: Path, size: tuple[int, int], filename: str) -> None:
    """The dashboard at `size` during the H100 run recorded in tests/data, replayed 3 s into training (no GPU)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_app_snapshots import h100_run_app, replayed

    app = h100_run_app(Path(tempfile.mkdtemp(prefix="gpuanat-shots-")) / "history.sqlite")
    async with app.run_test(size=size) as pilot:
        await replayed(app, pilot)
        app.save_screenshot(filename=filename, path=str(out_dir))


async def take_operations(out_dir: Path) -> None:
    """The dashboard after `O`, its operations panel holding the H100 bert-large bf16 profile of
    benchmarks/results/h100/operations (as tests/data/operations/h100_kernels.json keeps its kernels; no GPU)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_operations_tui import h100_operations_app, press_o

    app = h100_operations_app(Path(tempfile.mkdtemp(prefix="gpuanat-shots-")) / "history.sqlite")
    async with app.run_test(size=(COLUMNS, ROWS)) as pilot:
        await press_o(app, pilot)
        app.clear_notifications()
        await pilot.pause()
        app.save_screenshot(filename="operations.svg", path=str(out_dir))


async def take_modules(out_dir: Path) -> None:
    """The dashboard after the H200's recorded out-of-memory failure (an optimizer step), then `b`: memory by
    module at the failing allocation (tests/data and benchmarks/results/h200/oom; no GPU)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from test_app_snapshots import out_of_memory_replayed
    from test_failure_tui import oom_app

    app, _ = oom_app(Path(tempfile.mkdtemp(prefix="gpuanat-shots-")), hold=False)
    async with app.run_test(size=(COLUMNS, ROWS)) as pilot:
        await out_of_memory_replayed(app, pilot)
        app.save_screenshot(filename="out_of_memory.svg", path=str(out_dir))
        await pilot.press("b")
        await pilot.pause()
        app.save_screenshot(filename="modules.svg", path=str(out_dir))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--mid-run-s", type=float, default=12.0)
    parser.add_argument("--second-keys", default="g,p,p", help="keys pressed before the second run, comma-separated")
    parser.add_argument("--max-steps", type=int, default=None)
    parser.add_argument("--preset", default="bert-large")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--watch-pid", type=int, default=None, help="only the watch dashboard of this process")
    parser.add_argument("--watch-replay", action="store_true", help="only the watch dashboard, from the recording")
    parser.add_argument(
        "--dashboard-replay",
        action="store_true",
        help="only the dashboard at 80×24 from the H100 recording (dashboard_80x24.svg)",
    )
    parser.add_argument(
        "--operations",
        action="store_true",
        help="only the operations panel with the H100 bert-large bf16 profile (operations.svg)",
    )
    parser.add_argument(
        "--modules",
        action="store_true",
        help="only the H200's recorded out-of-memory failure and memory by module (out_of_memory.svg, modules.svg)",
    )
    parser.add_argument(
        "--gpus",
        default=None,
        help="only the dashboard during a run on these GPUs (--gpus of run; 1 with --distributed none for one GPU)",
    )
    parser.add_argument("--distributed", default="ddp", help="with --gpus: the distributed technique")
    parser.add_argument("--filename", default="dashboard_two_gpus.svg", help="with --gpus: the screenshot's name")
    parser.add_argument("--precision", default="fp32")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=512)
    parser.add_argument("--lora", type=int, default=0)
    parser.add_argument("--model", default=None, help="with --gpus: a checkpoint folder or config.json (run's --model)")
    parser.add_argument("--grad-checkpointing", action="store_true", help="with --gpus: train with checkpointing")
    parser.add_argument(
        "--also-sizes",
        default="",
        help="with --gpus: more terminal sizes of the same moment, COLSxROWS comma-separated (80x24,200x50)",
    )
    args = parser.parse_args()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    if args.watch_pid is not None:
        asyncio.run(take_watch(args.out_dir, args.watch_pid, args.mid_run_s))
        return
    if args.watch_replay:
        asyncio.run(take_watch_replay(args.out_dir))
        return
    if args.dashboard_replay:
        asyncio.run(take_dashboard_replay(args.out_dir, (80, 24), "dashboard_80x24.svg"))
        return
    if args.operations:
        asyncio.run(take_operations(args.out_dir))
        return
    if args.modules:
        asyncio.run(take_modules(args.out_dir))
        return
    if args.gpus is not None:
        config = RunConfig(
            preset=args.preset,
            device=args.device,
            max_steps=args.max_steps,
            samples=args.samples,
            gpus=args.gpus,
            distributed=args.distributed,
            precision=args.precision,
            batch_size=args.batch_size,
            seq_len=args.seq_len,
            lora=args.lora,
            model=args.model,
            grad_checkpointing=args.grad_checkpointing,
        )
        sizes = [tuple(int(part) for part in size.split("x")) for size in args.also_sizes.split(",") if size]
        asyncio.run(take_live_lanes(args.out_dir, config, args.mid_run_s, args.filename, sizes))
        return
    first = RunConfig(preset=args.preset, device=args.device, max_steps=args.max_steps, samples=args.samples)
    asyncio.run(take(args.out_dir, first, args.second_keys.split(","), args.mid_run_s))


if __name__ == "__main__":
    main()
