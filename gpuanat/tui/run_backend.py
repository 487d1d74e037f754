"""What trains and records the launching dashboard's runs: a `RunBackend`, given to the app as its sampler is.

The dashboard asks its backend, from a worker thread, to run one configuration, or a search of short real runs (fit,
tune), handing it `RunHooks`: where each decoded event goes, whom to tell when the training process starts, and the
event that stops it. `LocalRunBackend` is the real one: child processes through `execute_run`, recorded in the
history (SQLite), the next training process kept prepared (`WarmWorkers`). Tests pass it, or a backend that replays
a run recorded on a GPU.
"""

from __future__ import annotations

import dataclasses
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from gpuanat.core.export.run_metrics import RunMetrics
from gpuanat.core.run.fit import FitResult, run_fit
from gpuanat.core.run.runner import probe_capabilities
from gpuanat.core.run.session import SharedSampler, execute_run, run_environment
from gpuanat.core.run.tune.moves import tune_profiled_steps
from gpuanat.core.run.tune.result import TuneResult, TuneTrial
from gpuanat.core.run.tune.search import Progress, run_tune
from gpuanat.core.run.tune.space import SearchSpace
from gpuanat.core.run.warm import WarmWorkers
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.searches import start_search
from gpuanat.core.vocabulary.config import PROFILE_OPS_VARIABLE, Capabilities, RunConfig
from gpuanat.core.vocabulary.protocol import Event
from gpuanat.core.vocabulary.result import RunResult


@dataclass
class RunHooks:
    """What the dashboard gives each run (or search) it asks its backend for."""

    on_event: Callable[[Event], None]
    """Each event the training process sends, decoded, on the backend's thread."""
    on_start: Callable[[int, int, Path, tuple[int, ...]], None]
    """(run id, pid, log path, NVML index of each rank's GPU) once a training process runs (one per trial)."""
    stop_requested: threading.Event
    """Set from any thread: the run (or search) stops, keeping what it recorded."""
    requested_monotonic_s: float | None = None
    """When the user asked for the run (`time.monotonic`), for its start-up breakdown."""
    shared_sampler: SharedSampler | None = None
    """The dashboard's sampler while it runs: the run listens to it instead of reading NVML again."""
    profile_ops_steps: int = 0
    """Steps each run profiles for the operations anatomy; 0: none."""
    data_longest_row: int | None = None
    """--data's longest row in tokens, which sizes the prediction stored with each run (`core.memory.data_length`)."""


class RunBackend(Protocol):
    """The calls the launching dashboard makes to run, search and prepare; the run calls block (a worker thread's)."""

    def probe_capabilities(self) -> Capabilities:
        """What this machine can train (RuntimeError saying why when it cannot tell)."""
        ...

    def run(self, config: RunConfig, hooks: RunHooks) -> RunResult:
        """Train and record `config`; its recorded result."""
        ...

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
        """The largest batch of `config` that trains, by trial runs of `trial_steps` steps from batch `start`."""
        ...

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
        """The fastest set of techniques in `space` that trains, by trial runs within `budget_s`; `on_round` is told
        each round's center and why its moves come in their order (`core.run.tune.moves`)."""
        ...

    def prepare(self, config: RunConfig) -> None:
        """Have the next training process prepared for `config`, where the backend can (blocks: a worker's call)."""
        ...

    def prepared_status(self) -> str | None:
        """The prepared training process: "preparing", "ready", or None (none prepared, or none preparable)."""
        ...

    def start_note(self) -> str | None:
        """How the last run's process started (warm or cold, and why), where the backend prepares them."""
        ...

    def close(self) -> None:
        """The dashboard ends: nothing prepared is left behind."""
        ...


class LocalRunBackend:
    """Runs as child processes of this machine, recorded in the history at `db_path` (logs beside it)."""

    def __init__(
        self,
        db_path: Path,
        *,
        capabilities_probe: Callable[[], Capabilities] = probe_capabilities,
        run_env: dict[str, str] | None = None,
        warm_workers: WarmWorkers | None = None,
        metrics: RunMetrics | None = None,
    ) -> None:
        """`run_env` is every run's environment (default: this process's); with `warm_workers` the next training
        process is kept prepared (gpuanat.core.run.warm); `metrics` is told about every run (--metrics)."""
        self.db_path = db_path
        self._capabilities_probe = capabilities_probe
        self._run_env = run_env
        self.warm_workers = warm_workers
        self._metrics = metrics

    def probe_capabilities(self) -> Capabilities:
        return self._capabilities_probe()

    def _options(self, hooks: RunHooks) -> dict[str, Any]:
        """What every run is given besides its config: the environment (asking the probe to profile its operations
        after `O`), the dashboard's sampler, the prepared worker, the metrics endpoint and --data's longest row."""
        env = self._run_env
        if hooks.profile_ops_steps:
            env = {**(os.environ if env is None else env), PROFILE_OPS_VARIABLE: str(hooks.profile_ops_steps)}
        options: dict[str, Any] = {
            "env": env,
            "shared_sampler": hooks.shared_sampler,
            "on_event": hooks.on_event,
            "on_start": hooks.on_start,
            "stop_requested": hooks.stop_requested,
            "log_dir": self.db_path.parent / "logs",
            "data_longest_row": hooks.data_longest_row,
        }
        if self.warm_workers is not None:
            options["warm_workers"] = self.warm_workers
        if self._metrics is not None:
            options["metrics"] = self._metrics
        return options

    def run(self, config: RunConfig, hooks: RunHooks) -> RunResult:
        with HistoryStore(self.db_path) as store:
            return execute_run(
                config, store=store, requested_monotonic_s=hooks.requested_monotonic_s, **self._options(hooks)
            )

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
        with HistoryStore(self.db_path) as store:
            return run_fit(
                config,
                store=store,
                start=start,
                trial_steps=trial_steps,
                max_batch=max_batch,
                on_trial=on_trial,
                search_id=start_search(store, "fit", config),
                **self._options(hooks),
            )

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
        # every trial profiled (as `gpuanat tune`'s), so that its anatomy orders the next round's moves
        profiled = hooks.profile_ops_steps or tune_profiled_steps(None, trial_steps)
        hooks = dataclasses.replace(hooks, profile_ops_steps=profiled)
        with HistoryStore(self.db_path) as store:
            return run_tune(
                config,
                space,
                store=store,
                trial_steps=trial_steps,
                budget_s=budget_s,
                stop=hooks.stop_requested,
                on_trial=on_trial,
                on_round=on_round,
                search_id=start_search(store, "tune", config),
                **self._options(hooks),
            )

    def prepare(self, config: RunConfig) -> None:
        if self.warm_workers is None or not self.warm_workers.enabled:
            return
        try:
            _, environment = run_environment(config, os.environ if self._run_env is None else self._run_env)
            self.warm_workers.prepare(environment)
        except Exception:  # GPUs that cannot be had are said at `r`; a failure here costs the warm start only
            pass

    def prepared_status(self) -> str | None:
        return self.warm_workers.status() if self.warm_workers is not None else None

    def start_note(self) -> str | None:
        start = self.warm_workers.last_start if self.warm_workers is not None else None
        return start.describe() if start is not None else None

    def close(self) -> None:
        if self.warm_workers is not None:
            self.warm_workers.close()
