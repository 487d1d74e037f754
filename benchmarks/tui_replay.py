"""The real dashboards, fed at real time by NVML traces recorded on a GPU, for measuring what they cost without one.

    python benchmarks/tui_replay.py watch       # `gpuanat watch PID` of the H200 recording (a bert-large run
                                                # started outside gpuanat), sampled every 0.25 s, looped
    python benchmarks/tui_replay.py dashboard   # `gpuanat` during the H100 run recorded in tests/data: its NVML
                                                # samples and the probe's steps, looped

The apps, the sampler thread, the watch session and the paint tick are the real code; only the source is a
recording (the sampler stamps each replayed sample with the clock, as a live source's) and the step events come
from a thread at the times they were recorded, as the run's thread delivers them. `benchmarks/tui_cost.py --replay`
runs this in a pseudo-terminal and measures it.

`--profile OUT.json` also counts the bytes of Textual's partial updates (escape sequences included) by the widget at
the start of each updated span and writes them, per
second of the run, when the app ends.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import dataclasses
import json
import tempfile
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from gpuanat.core.measure.samples import Sample

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"
WATCH_TRACE = DATA / "nvml_trace_watch_h200.jsonl"
RUN_TRACE = DATA / "nvml_trace_h100.jsonl"
RUN_STEPS = DATA / "h100_trace_run_steps.jsonl"


class LoopedSource:
    """A recorded trace, read from its `first` sample on and started again after its last, for ever."""

    keeps_recorded_time: ClassVar[bool] = False

    def __init__(self, path: Path, first: int = 0) -> None:
        from gpuanat.core.measure.replay import ReplaySource

        replay = ReplaySource(path)
        self._samples = [replay.read([]) for _ in range(len(replay))][first:]
        self._next = 0

    def read(self, pids: Iterable[int]) -> Sample:
        sample = self._samples[self._next % len(self._samples)]
        self._next += 1
        return sample

    def close(self) -> None:
        pass


def profile_widgets(app: Any, out: Path) -> None:
    """Count the terminal bytes of each widget's updated spans while `app` runs; write them to `out` at its end."""
    from rich.console import Console
    from textual._compositor import ChopsUpdate

    from gpuanat.tui.textual_internals import screen_compositor

    bytes_by_widget: collections.Counter[str] = collections.Counter()
    started_s = time.monotonic()
    original = ChopsUpdate.render_segments

    def render_segments(update: ChopsUpdate, console: Console) -> str:
        compositor = screen_compositor(app.screen)
        for y, x1, x2 in update.spans:  # each span alone, as the installed method sends it
            try:
                widget, _ = compositor.get_widget_at(x1, y)
                name = f"{type(widget).__name__}#{widget.id}" if widget.id else type(widget).__name__
            except Exception:
                name = "?"
            alone = ChopsUpdate(update.chops, [(y, x1, x2)], update.chop_ends)
            bytes_by_widget[name] += len(original(alone, console).encode())
        return original(update, console)

    ChopsUpdate.render_segments = render_segments  # type: ignore[method-assign]

    def write() -> None:
        elapsed_s = time.monotonic() - started_s
        out.write_text(
            json.dumps(
                {
                    "elapsed_s": round(elapsed_s, 1),
                    "bytes_per_s": {name: round(count / elapsed_s, 1) for name, count in bytes_by_widget.most_common()},
                },
                indent=2,
            )
        )

    atexit.register(write)


def run_watch(interval_s: float, profile: Path | None) -> None:
    from gpuanat.core.measure.pid_namespace import PidNamespaceResolver
    from gpuanat.core.measure.samples import NvmlStatus
    from gpuanat.core.watch.session import WatchSession
    from gpuanat.core.watch.target import WatchTarget
    from gpuanat.tui.watch_app import WatchApp

    source = LoopedSource(WATCH_TRACE)
    pid = next(sample.host.processes[0].pid for sample in source._samples if sample.host.processes)
    proc_root = Path(tempfile.mkdtemp(prefix="gpuanat-replay-proc-"))
    (proc_root / str(pid)).mkdir()
    nvml = NvmlStatus(
        available=True, reason=None, driver_version="580.159.04", cuda_driver_version=13000, gpu_names=("NVIDIA H200",)
    )
    target = WatchTarget(
        pid=pid,
        name="python3",
        command="python3 plain_trainer.py (bert-large, recorded on an H200)",
        create_time_s=0.0,
        username=None,
    )

    def session(target: WatchTarget, nvml: NvmlStatus) -> WatchSession:
        return WatchSession(
            target,
            nvml,
            publication_dirs_for=lambda pid: [],
            process_alive=lambda: True,
            resolver=PidNamespaceResolver(proc_root, check_visible_pids=False),
        )

    app = WatchApp(
        target,
        db_path=proc_root / "h.sqlite",
        sampler_factory=lambda: (source, nvml),
        session_factory=session,
        interval_s=interval_s,
        paint_interval_s=interval_s,
    )
    if profile is not None:
        profile_widgets(app, profile)
    app.run()


def run_dashboard(interval_s: float, profile: Path | None) -> None:
    from gpuanat.core.measure.live_run import LiveRun
    from gpuanat.core.measure.samples import NvmlStatus
    from gpuanat.core.vocabulary.config import Capabilities, RunConfig
    from gpuanat.core.vocabulary.protocol import ModelInfo, Step, decode
    from gpuanat.tui.app import GpuAnatApp
    from gpuanat.tui.run_backend import LocalRunBackend

    meta_line, *step_lines = RUN_STEPS.read_text().splitlines()
    meta = json.loads(meta_line)
    steps = [event for event in map(decode, step_lines) if isinstance(event, Step)]
    first_training_sample = next(index for index, elapsed_s in enumerate(meta["elapsed_at_sample"]) if elapsed_s >= 0)
    config = RunConfig.from_json(meta["config"])
    capabilities = Capabilities(
        torch_version="2.11.0+cu130",
        cuda_available=True,
        cuda_device_name="NVIDIA H100 80GB HBM3",
        cuda_compute_capability=(9, 0),
        cuda_total_memory_bytes=85_520_809_984,
        bitsandbytes_version="0.50.2",
    )
    nvml = NvmlStatus(
        available=True,
        reason=None,
        driver_version="580.159.04",
        cuda_driver_version=13000,
        gpu_names=("NVIDIA H100 80GB HBM3",),
    )
    scratch = Path(tempfile.mkdtemp(prefix="gpuanat-replay-"))
    app = GpuAnatApp(
        config,
        db_path=scratch / "h.sqlite",
        sampler_factory=lambda: (LoopedSource(RUN_TRACE, first_training_sample), nvml),
        backend=LocalRunBackend(scratch / "h.sqlite", capabilities_probe=lambda: capabilities),
        sample_interval_s=interval_s,
        paint_interval_s=interval_s,
    )

    def feed_steps() -> None:
        """The recorded steps at their recorded pace, again and again, numbered on as one long run."""
        time.sleep(1.0)
        app.dashboard.follow_run(LiveRun(config=config, stop_requested=threading.Event(), run_id=1, pid=meta["pid"]))
        app.dashboard.receive_event(ModelInfo(**{**meta["model"], "total_steps": 1_000 * len(steps)}))
        period_s = steps[-1].elapsed_s + steps[0].step_time_s
        started_s = time.monotonic()
        for lap in range(1_000):
            for step in steps:
                elapsed_s = lap * period_s + step.elapsed_s
                time.sleep(max(0.0, started_s + elapsed_s - time.monotonic()))
                app.dashboard.receive_event(
                    dataclasses.replace(
                        step,
                        step=lap * len(steps) + step.step,
                        samples=lap * steps[-1].samples + step.samples,
                        elapsed_s=elapsed_s,
                        monotonic_s=time.monotonic(),
                    )
                )

    threading.Thread(target=feed_steps, name="replay-steps", daemon=True).start()
    if profile is not None:
        profile_widgets(app, profile)
    app.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("app", choices=("watch", "dashboard"))
    parser.add_argument("--interval", type=float, default=0.25, help="sample and paint interval, seconds")
    parser.add_argument("--profile", type=Path, help="write the terminal bytes per widget per second here at exit")
    args = parser.parse_args()
    (run_watch if args.app == "watch" else run_dashboard)(args.interval, args.profile)


if __name__ == "__main__":
    main()
