"""The H100 recording replayed as a process someone else started, for the watch dashboard's snapshots and the
README screenshot (`scripts/take_screenshots.py --watch-replay`).

The NVML trace (tests/data/nvml_trace_h100.jsonl) plays through the real sampler; the probe's step events of
that same run (tests/data/h100_trace_run_steps.jsonl) reach the real `WatchSession` as a publishing process's
events would. The trace's host metrics were summed over the training process's tree; here they stand for that
one process (PID 2348). The Hello event is rebuilt from the recorded run's config.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import ClassVar

from gpuanat.core.measure.pid_namespace import PidNamespaceResolver
from gpuanat.core.measure.replay import ReplaySource
from gpuanat.core.measure.samples import HostProcess, NvmlStatus, Sample
from gpuanat.core.vocabulary.protocol import Hello, ModelInfo, Step, decode
from gpuanat.core.watch.session import WatchSession
from gpuanat.core.watch.target import WatchTarget
from gpuanat.tui.watch_app import WatchApp

DATA = Path(__file__).resolve().parent / "data"
TRACE = DATA / "nvml_trace_h100.jsonl"
STEPS = DATA / "h100_trace_run_steps.jsonl"
PID = 2348
TARGET = WatchTarget(
    pid=PID,
    name="python3",
    command="python3 train.py --model bert-large-uncased --bf16 --batch 8",
    create_time_s=0.0,
    username=None,
)
NVML = NvmlStatus(
    available=True,
    reason=None,
    driver_version="580.159.04",
    cuda_driver_version=13000,
    gpu_names=("NVIDIA H100 80GB HBM3",),
)
FIRST_T_S = json.loads(TRACE.read_text().splitlines()[0])["t_s"] if TRACE.exists() else 0.0


class RecordedTreeSource:
    """The trace, with its host metrics as the one process of the tree."""

    keeps_recorded_time: ClassVar[bool] = True

    def __init__(self) -> None:
        self._replay = ReplaySource(TRACE)

    def read(self, pids: Iterable[int]) -> Sample:
        sample = self._replay.read(pids)
        host = sample.host
        process = HostProcess(
            pid=PID, parent_pid=1, name="python3", cpu_percent=host.cpu_percent or 0.0, rss_bytes=host.rss_bytes or 0
        )
        return dataclasses.replace(sample, host=dataclasses.replace(host, processes=(process,)))

    def close(self) -> None:
        self._replay.close()


def replayed_session(
    target: WatchTarget, nvml: NvmlStatus, proc_root: Path, clock: Callable[[], float] | None = None
) -> WatchSession:
    """The watch's session of `target`, whose PID has a directory in the /proc at `proc_root`: no publications, the
    process alive, the samples given to it by the test."""
    (proc_root / str(target.pid)).mkdir(parents=True, exist_ok=True)
    return WatchSession(
        target,
        nvml,
        **({"clock": clock} if clock is not None else {}),
        publication_dirs_for=lambda pid: [],
        process_alive=lambda: True,
        resolver=PidNamespaceResolver(proc_root, check_visible_pids=False),
    )


def replayed_watch_app(
    db_path: Path,
    proc_root: Path,
    target: WatchTarget,
    source: Callable[[], object],
    nvml: NvmlStatus,
    clock: Callable[[], float],
) -> WatchApp:
    """A watch dashboard of `target` fed `source()`'s samples through the real sampler, painted when the test says."""
    return WatchApp(
        target,
        db_path=db_path,
        sampler_factory=lambda: (source(), nvml),
        session_factory=lambda target, nvml: replayed_session(target, nvml, proc_root, clock),
        clock=clock,
        interval_s=None,
        paint_interval_s=3600,
    )


def make_watch_app(db_path: Path, proc_root: Path, clock: Callable[[], float] = lambda: FIRST_T_S) -> WatchApp:
    """A watch dashboard on the recording; `proc_root` gets a /proc in which PID 2348 exists."""
    return replayed_watch_app(db_path, proc_root, TARGET, RecordedTreeSource, NVML, clock)


def replay(app: WatchApp, until_elapsed_s: float, *, published: bool = True) -> None:
    """Feed the samples (and, when `published`, the probe's events) up to `until_elapsed_s` into training."""
    meta_line, *step_lines = STEPS.read_text().splitlines()
    meta = json.loads(meta_line)
    steps = [event for event in map(decode, step_lines) if isinstance(event, Step)]
    session = app.dashboard.session
    assert session is not None
    sent = 0
    for index, elapsed_s in enumerate(meta["elapsed_at_sample"]):
        if elapsed_s > until_elapsed_s:
            break
        if published and index == 0:
            config = {
                key: meta["config"][key]
                for key in (
                    "batch_size",
                    "grad_accum",
                    "grad_checkpointing",
                    "precision",
                    "tf32",
                    "optim",
                    "attn",
                    "compile",
                )
            }
            session.add_events(
                PID,
                [
                    Hello(
                        pid=PID,
                        versions={},
                        device="cuda",
                        device_name=NVML.gpu_names[0],
                        config={"model": "bert-large-uncased", **config},
                    ),
                    ModelInfo(**meta["model"]),
                ],
            )
        if published:
            due = [step for step in steps[sent:] if step.elapsed_s <= elapsed_s]
            session.add_events(PID, due)
            sent += len(due)
        app.dashboard.sample_now()
    app.dashboard.paint()
