"""A `RunBackend` that replays a run recorded on an H100, for the launching dashboard's tests.

The run is bert-large bf16 batch 8, run 12 of benchmarks/results/h100 (`gpuanat run --trace-out`): the probe's events
(tests/data/h100_trace_run_steps.jsonl: its model, then its 60 steps), its training process's log
(benchmarks/results/h100/logs/run-12.log) and its recorded result (benchmarks/results/h100/trace_run.json). `run`
delivers them through the dashboard's `RunHooks` as `LocalRunBackend` does a live run's: the process's start, each
event in order on the worker's thread, then the result. Nothing is made up: a recording cannot be asked for another
configuration (`run` refuses one), stopped halfway into another result, or searched (fit and tune say so, as a
failing search does). The NVML samples of the same run are in `TRACE`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuanat.core.run.fit import FitResult
from gpuanat.core.run.tune.result import TuneResult, TuneTrial
from gpuanat.core.run.tune.search import Progress
from gpuanat.core.run.tune.space import SearchSpace
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.protocol import ModelInfo, Step, decode
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.tui.run_backend import RunHooks

REPO = Path(__file__).resolve().parent.parent
STEPS = REPO / "tests" / "data" / "h100_trace_run_steps.jsonl"
RESULT = REPO / "benchmarks" / "results" / "h100" / "trace_run.json"
LOG = REPO / "benchmarks" / "results" / "h100" / "logs" / "run-12.log"
TRACE = REPO / "tests" / "data" / "nvml_trace_h100.jsonl"
"""The NVML samples of the same run (`ReplaySource`)."""
CAPABILITIES = Capabilities(
    torch_version="2.11.0+cu130",
    cuda_available=True,
    cuda_device_name="NVIDIA H100 80GB HBM3",
    cuda_compute_capability=(9, 0),
    cuda_total_memory_bytes=85_520_809_984,
    bitsandbytes_version="0.50.2",
)
"""The H100 the run was recorded on, as the capability probe found it (benchmarks/results/h100/env.txt)."""


def recorded_config() -> RunConfig:
    """The recorded run's configuration."""
    return RunConfig.from_json(json.loads(STEPS.read_text().splitlines()[0])["config"])


class RecordedRunBackend:
    """Replays the recorded run for `run`; `step_pause_s` between events lets a test see the run in progress."""

    def __init__(self, *, step_pause_s: float = 0.0) -> None:
        meta_line, *event_lines = STEPS.read_text().splitlines()
        self.meta: dict[str, Any] = json.loads(meta_line)
        self.steps = [decode(line) for line in event_lines]
        assert all(isinstance(step, Step) for step in self.steps)
        self.result: dict[str, Any] = json.loads(RESULT.read_text())
        assert self.result["run_id"] == self.meta["run_id"] and self.result["config"] == self.meta["config"]
        self._step_pause_s = step_pause_s
        self.runs = 0
        """How many times the recording was replayed."""

    def probe_capabilities(self) -> Capabilities:
        return CAPABILITIES

    def run(self, config: RunConfig, hooks: RunHooks) -> RunResult:
        recorded = RunConfig.from_json(self.meta["config"])
        if config != recorded:
            summaries = recorded.techniques_summary(), config.techniques_summary()
            raise RuntimeError("the recording is of {}, not {}".format(*summaries))
        self.runs += 1
        hooks.on_start(self.meta["run_id"], self.meta["pid"], LOG, (0,))
        hooks.on_event(ModelInfo(**self.meta["model"]))
        pause = threading.Event()
        for step in self.steps:
            hooks.on_event(step)
            if self._step_pause_s:
                pause.wait(self._step_pause_s)
        return RunResult.from_json(self.result)

    def fit(
        self,
        config: RunConfig,
        hooks: RunHooks,
        *,
        start: int,
        trial_steps: int,
        max_batch: int,
        on_trial: Callable[[int, RunResult], None],
    ) -> FitResult:
        raise RuntimeError("a recorded run cannot be searched")

    def tune(
        self,
        config: RunConfig,
        space: SearchSpace,
        hooks: RunHooks,
        *,
        trial_steps: int,
        budget_s: float,
        on_trial: Callable[[TuneTrial, Progress], None],
    ) -> TuneResult:
        raise RuntimeError("a recorded run cannot be searched")

    def prepare(self, config: RunConfig) -> None:
        """Nothing to prepare: the recording is there."""

    def prepared_status(self) -> str | None:
        return None

    def start_note(self) -> str | None:
        return None

    def close(self) -> None:
        """Nothing is left behind."""
