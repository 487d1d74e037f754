"""The launching dashboard's work off the event loop, as Textual workers: its run or search, the capability probe, and
the preparing of the next training process, each through the dashboard's `RunBackend`.

One run or search at a time, in the worker group "run" (exclusive); a search (`searches`: fit, tune) runs its trials
in that worker the same way. The workers never touch a widget: a run's events go to the dashboard's inbox
(`on_event`), which its paint tick drains, and what happened comes as messages (`gpuanat.tui.messages`) posted to the
dashboard, whose handlers paint it. A run stops when its `LiveRun.stop_requested` is set.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

from textual.dom import DOMNode
from textual.message import Message

from gpuanat.core.measure.live_run import LiveRun
from gpuanat.core.measure.startup import REQUESTED
from gpuanat.core.run.session import SharedSampler
from gpuanat.core.thread_names import name_native_thread
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.protocol import Event
from gpuanat.tui.data_lengths import DataLengths
from gpuanat.tui.messages import CapabilitiesFound, RunFinished, RunStarted
from gpuanat.tui.run_backend import RunBackend, RunHooks


class RunControl:
    """The dashboard's workers, and what every run it starts is given (`hooks`)."""

    def __init__(
        self,
        node: DOMNode,
        backend: RunBackend,
        *,
        on_event: Callable[[Event], None],
        shared_sampler: Callable[[], SharedSampler | None],
    ) -> None:
        """The workers run on `node` (the dashboard screen), and post their messages to it; `on_event` takes a run's
        event into its inbox; `shared_sampler` is the dashboard's sampler while it runs, asked for when a run
        starts."""
        self._node = node
        self.backend = backend
        self.on_event = on_event
        self._shared_sampler = shared_sampler
        self._idle = threading.Event()
        self._idle.set()
        self.profile_ops_steps = 0
        """Steps each run profiles for the operations anatomy (`O`); 0: none."""
        self.data_lengths = DataLengths(
            self.post, lambda work: self._start_worker(work, "gpuanat-data-lengths", "data-lengths")
        )
        """--data's longest row, which sizes the configured run's prediction and each run's."""

    def post(self, message: Message) -> None:
        """Hand a message to the dashboard (from any thread)."""
        self._node.post_message(message)

    def _start_worker(self, work: Callable[[], None], name: str, group: str, exclusive: bool = False) -> None:
        def named() -> None:
            name_native_thread(name)  # the OS sees the worker's thread by its job (`top -H`)
            work()

        self._node.run_worker(named, name=name, group=group, thread=True, exclusive=exclusive, exit_on_error=False)

    def probe_capabilities(self) -> None:
        """What the machine can train, asked in a worker; the answer comes as `CapabilitiesFound`."""
        self._start_worker(self._probe_capabilities, "gpuanat-capabilities", "capabilities")

    def _probe_capabilities(self) -> None:
        try:
            self.post(CapabilitiesFound(self.backend.probe_capabilities(), None))
        except RuntimeError as error:
            self.post(CapabilitiesFound(None, str(error)))

    def start_run(self, live: LiveRun) -> None:
        """Run and record `live.config` in the run worker; its end comes as `RunFinished`."""
        self._start_run_worker(partial(self._execute, live), "gpuanat-run")

    def start_search(self, search: Callable[..., None], name: str, live: LiveRun, *args: Any) -> None:
        """A search of real trial runs (fit, tune) in the run worker: `search(self, live, *args)`."""
        self._start_run_worker(partial(search, self, live, *args), name)

    def _start_run_worker(self, work: Callable[[], None], name: str) -> None:
        self._idle.clear()

        def recorded() -> None:
            try:
                work()
            finally:
                self._idle.set()

        self._start_worker(recorded, name, "run", exclusive=True)

    def join(self, timeout_s: float) -> None:
        """Block until the run or search in progress has been recorded, at most `timeout_s` (from any thread: the
        worker posts its messages, it never waits for the event loop)."""
        self._idle.wait(timeout_s)

    def hooks(self, live: LiveRun) -> RunHooks:
        """What the run of `live` is given: its events' way to the inbox, its start, its stop, the dashboard's
        sampler while it runs, the operations profiling chosen with `O`, and its --data's longest row (read here if
        it was not yet: called in the run's worker)."""
        return RunHooks(
            on_event=self.on_event,
            on_start=self.started,
            stop_requested=live.stop_requested,
            requested_monotonic_s=live.parent_points.get(REQUESTED),
            shared_sampler=self._shared_sampler(),
            profile_ops_steps=self.profile_ops_steps,
            data_longest_row=self.data_lengths.read(live.config),
        )

    def prepare_worker(self, config: RunConfig) -> None:
        """Have the next training process prepared for `config`, in a worker (choosing its GPUs reads NVML)."""
        self._start_worker(partial(self.backend.prepare, config), "gpuanat-prepare", "prepare")

    def started(self, run_id: int, pid: int, log_path: Path, gpus: tuple[int, ...]) -> None:
        """A run's training process runs: tell the dashboard, with how it started."""
        self.post(RunStarted(run_id, pid, log_path, gpus, self.backend.start_note()))

    def _execute(self, live: LiveRun) -> None:
        try:
            result = self.backend.run(live.config, self.hooks(live))
        except Exception as error:  # the dashboard must survive any failure of a run
            self.post(RunFinished(None, f"{type(error).__name__}: {error}"))
        else:
            self.post(RunFinished(result))
