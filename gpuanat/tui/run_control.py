"""The dashboard's runs off the event loop: the thread that runs and records one, and the capability probe's.

A run trains in a child process that a thread of the dashboard starts, waits for and records; a search (`searches`:
fit, tune) runs its trials on that thread the same way. The threads never touch a widget: they append the run's
events to the app's inbox (`on_event`), which the paint tick drains, and post messages (`gpuanat.tui.messages`)
that the app's handlers paint. A run stops when its `LiveRun.stop_requested` is set.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from textual.message import Message

from gpuanat.core.export.run_metrics import RunMetrics
from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.measure.startup import REQUESTED
from gpuanat.core.run.session import SharedSampler, execute_run, run_environment
from gpuanat.core.run.warm import WarmWorkers
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.thread_names import name_native_thread
from gpuanat.core.vocabulary.config import PROFILE_OPS_VARIABLE, Capabilities, RunConfig
from gpuanat.core.vocabulary.protocol import Event
from gpuanat.tui.messages import CapabilitiesFound, RunFinished, RunStarted


class RunControl:
    """The thread of the dashboard's run or search (one at a time), and what every run it starts is given."""

    def __init__(
        self,
        db_path: Path,
        *,
        post: Callable[[Message], None],
        on_event: Callable[[Event], None],
        run_env: dict[str, str] | None,
        shared_sampler: Callable[[], SharedSampler | None],
        warm_workers: WarmWorkers | None = None,
        metrics: RunMetrics | None = None,
    ) -> None:
        """`post` hands a message to the app (from any thread), `on_event` a run's event to its inbox;
        `shared_sampler` is the dashboard's sampler while it runs, asked for when a run starts; `warm_workers` keeps
        the next training process prepared (gpuanat.core.run.warm); `metrics` is told about every run (--metrics)."""
        self.db_path = db_path
        self.post = post
        self.on_event = on_event
        self._run_env = run_env
        self._shared_sampler = shared_sampler
        self._thread: threading.Thread | None = None
        self.warm_workers = warm_workers
        self._metrics = metrics
        self.profile_ops_steps = 0
        """Steps each run profiles for the operations anatomy (`O`); 0: none."""

    def probe_capabilities(self, probe: Callable[[], Capabilities]) -> None:
        """What the machine can train, asked on a thread of its own; the answer comes as `CapabilitiesFound`."""
        threading.Thread(
            target=self._probe_capabilities, args=(probe,), name="gpuanat-capabilities", daemon=True
        ).start()

    def _probe_capabilities(self, probe: Callable[[], Capabilities]) -> None:
        try:
            self.post(CapabilitiesFound(probe(), None))
        except RuntimeError as error:
            self.post(CapabilitiesFound(None, str(error)))

    def start_run(self, live: LiveRun) -> None:
        """Run and record `live.config` on a thread of its own; its end comes as `RunFinished`."""
        self._start(self._execute, "gpuanat-run", live)

    def start_search(self, search: Callable[..., None], thread_name: str, live: LiveRun, *args: Any) -> None:
        """A search of real trial runs (fit, tune) on a thread of its own: `search(self, live, *args)`."""
        self._start(search, thread_name, self, live, *args)

    def _start(self, work: Callable[..., None], thread_name: str, *args: Any) -> None:
        self._thread = threading.Thread(target=work, args=args, name=thread_name, daemon=True)
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        """Block until the run or search in progress has been recorded, at most `timeout_s`."""
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)

    def run_options(self) -> dict[str, Any]:
        """What every run the dashboard starts is given besides its config: the environment (asking the probe to
        profile its operations after `O`), the dashboard's sampler while it runs (the run listens to its
        samples instead of reading NVML and the process tree again), and the prepared worker."""
        env = self._run_env
        if self.profile_ops_steps:
            env = {**(os.environ if env is None else env), PROFILE_OPS_VARIABLE: str(self.profile_ops_steps)}
        options: dict[str, Any] = {"env": env, "shared_sampler": self._shared_sampler()}
        if self.warm_workers is not None:
            options["warm_workers"] = self.warm_workers
        if self._metrics is not None:
            options["metrics"] = self._metrics
        return options

    def prepare_worker(self, config: RunConfig) -> None:
        """Have the next training process prepared for `config` (on a thread: choosing its GPUs reads NVML)."""
        if self.warm_workers is None or not self.warm_workers.enabled:
            return
        threading.Thread(target=self._prepare_worker, args=(config,), name="gpuanat-prepare", daemon=True).start()

    def _prepare_worker(self, config: RunConfig) -> None:
        assert self.warm_workers is not None
        try:
            _, environment = run_environment(config, os.environ if self._run_env is None else self._run_env)
            self.warm_workers.prepare(environment)
        except Exception:  # GPUs that cannot be had are said at `r`; a failure here costs the warm start only
            pass

    def started(self, run_id: int, pid: int, log_path: Path, gpus: tuple[int, ...]) -> None:
        """A run's training process runs: tell the app, with how it started."""
        start = self.warm_workers.last_start if self.warm_workers is not None else None
        self.post(RunStarted(run_id, pid, log_path, gpus, start.describe() if start is not None else None))

    def _execute(self, live: LiveRun) -> None:
        name_native_thread()
        try:
            with HistoryStore(self.db_path) as store:
                result = execute_run(
                    live.config,
                    store=store,
                    log_dir=self.db_path.parent / "logs",
                    on_event=self.on_event,
                    **self.run_options(),
                    stop_requested=live.stop_requested,
                    requested_monotonic_s=live.parent_points.get(REQUESTED),
                    on_start=self.started,
                )
        except Exception as error:  # the dashboard must survive any failure of a run
            self.post(RunFinished(None, f"{type(error).__name__}: {error}"))
        else:
            self.post(RunFinished(result))
