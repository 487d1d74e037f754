"""A `RunBackend` that replays a run recorded on an H100, for the launching dashboard's tests.

The run is bert-large bf16 batch 8, run 12 of benchmarks/results/h100 (`gpuanat run --trace-out`): the probe's events
(tests/data/h100_trace_run_steps.jsonl: its model, then its 60 steps), its training process's log
(benchmarks/results/h100/logs/run-12.log) and its recorded result (benchmarks/results/h100/trace_run.json). `run`
delivers them through the dashboard's `RunHooks` as `LocalRunBackend` does a live run's: the process's start, each
event in order on the worker's thread, then the result. Nothing is made up: a recording cannot be asked for another
configuration (`run` refuses one), stopped halfway into another result, or searched (fit and tune say so, as a
failing search does). The NVML samples of the same run are in `TRACE`.

`RecordedOomBackend` replays a GPU running out of memory the same way: the probe's events of
benchmarks/oom/optimizer_step.py on an H200 (benchmarks/results/h200/oom/optimizer_events.jsonl: its model, then
the error at the failing allocation in its first optimizer step), and the result gpuanat makes of them.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpuanat.core.measure.result import RankRecord, build_result
from gpuanat.core.measure.samples import NvmlStatus
from gpuanat.core.run.fit import FitResult
from gpuanat.core.run.tune.result import TuneResult, TuneTrial
from gpuanat.core.run.tune.search import Progress
from gpuanat.core.run.tune.space import SearchSpace
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.protocol import Error, ModelInfo, Step, decode
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
OOM_EVENTS = REPO / "benchmarks" / "results" / "h200" / "oom" / "optimizer_events.jsonl"
OOM_MODEL = Path("tests") / "data" / "optimizer_step_gpt2_config.json"
"""The model of benchmarks/oom/optimizer_step.py, `GPT2Config(n_layer=24, n_embd=2048, n_head=16).to_json_file`
(relative to the repository, where the tests run: the techniques panel shows the path)."""


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
        on_round: Callable[[TuneTrial, str], None] | None = None,
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


def oom_config() -> RunConfig:
    """The recorded failure's run as a configuration of the dashboard: optimizer_step.py's model (1.3B parameters),
    its batch of 4 sequences of 512 tokens, fp32, 3 steps and AdamW without the fused kernel (`foreach=False`)."""
    return RunConfig(model=str(OOM_MODEL), batch_size=4, seq_len=512, max_steps=3, optim="adamw_torch")


class RecordedOomBackend(RecordedRunBackend):
    """Replays the H200's out-of-memory failure for `run`: its events through the dashboard's `RunHooks`, then the
    result that gpuanat's recording makes of them (`build_result` over a `RankRecord` that took the same events).
    Until `release` is set the run holds its result back, so that a test sees the run in progress after its failure;
    made with `hold=False` it is released at once. The recording names no PID: this process's stands for it. Like
    the other recording, it cannot be searched (`fit`, `tune`) and prepares nothing."""

    def __init__(self, log_dir: Path, *, hold: bool = False) -> None:  # (not the other recording's)
        self.events = [decode(line) for line in OOM_EVENTS.read_text().splitlines()]
        self.failure = next(event for event in self.events if isinstance(event, Error)).out_of_memory
        assert self.failure is not None
        self.release = threading.Event()
        if not hold:
            self.release.set()
        self._log = log_dir / "run-1.log"
        self.nvml = NvmlStatus(
            available=True,
            reason=None,
            driver_version="580.159.04",
            cuda_driver_version=13000,
            gpu_names=("NVIDIA H200",),
        )
        """NVML on the H200 it was recorded on (benchmarks/results/h200/oom/env.txt)."""

    def probe_capabilities(self) -> Capabilities:
        return Capabilities(
            torch_version="2.11.0+cu130",
            cuda_available=True,
            cuda_device_name="NVIDIA H200",
            cuda_compute_capability=(9, 0),
            cuda_total_memory_bytes=self.failure.device_total_bytes,
        )

    def run(self, config: RunConfig, hooks: RunHooks) -> RunResult:
        if config != oom_config():
            summaries = oom_config().techniques_summary(), config.techniques_summary()
            raise RuntimeError("the recording is of {}, not {}".format(*summaries))
        self._log.write_text("")
        hooks.on_start(1, os.getpid(), self._log, (0,))
        record = RankRecord()
        for event in self.events:
            hooks.on_event(event)
            record.observe(event)
        self.release.wait(60)
        return build_result(1, config, record, self.nvml, self._log)
