"""A watched (or scripted) run recorded into the history while it goes on, as a run of its session's kind.

`HistoryRecorder` writes the samples and steps kept before the save began, then every new one, about once a
second through `PendingWrites`, and at the end the run's config, environment, result and status. The records
and the result it writes come from `WatchRecords`.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.history_errors import write_with_backoff
from gpuanat.core.store.recording import FINAL_WRITE_DEADLINE_S, PendingWrites
from gpuanat.core.vocabulary.protocol import Step
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.watch.records import WatchRecords

HISTORY_FLUSH_INTERVAL_S = 1.0


class HistoryRecorder:
    """Writes a watched session into the history while it goes on (samples and steps, once a second), through
    `PendingWrites`: a busy or full history delays the writes, never the watch.

    SQLite connections belong to the thread that opened them: the last writes, from another thread (a
    dashboard quitting), go through a connection of their own."""

    def __init__(
        self,
        store: HistoryStore,
        records: WatchRecords,
        samples: Iterable[Mapping[str, Any]],
        name: str | None,
        run_id: int | None,
    ) -> None:
        """`samples` are those kept before the save began; `records` gives the config and environment."""
        self.store = store
        self.finished = False
        self.history_error: str | None = None
        """What the last writes could not save, when the history refused them until the end."""
        self._thread = threading.get_ident()
        self.name = name or f"watch {records.target.pid} {records.target.name}"
        self.run_id = (
            run_id
            if run_id is not None
            else write_with_backoff(
                lambda: store.create_run(records.config(), kind=records.kind, name=self.name),
                deadline_s=FINAL_WRITE_DEADLINE_S,
            )
        )
        self._records = records
        self._pending = PendingWrites(store, self.run_id)
        environment = self._environment()
        self._pending.update(lambda history: history.set_environment(self.run_id, environment))
        self._pending.add_samples(samples)
        self._pending.add_steps(records.observed.steps)
        self._flushed_at_s = -1e9
        self._flush()

    def _environment(self) -> dict[str, Any]:
        records = self._records
        hello = records.observed.run.hello
        nvml_pids = sorted(records.mapping.nvml_pids_of([records.target.pid, *records.observed_pids()]))
        return {
            "pid": nvml_pids[0] if len(nvml_pids) == 1 else records.target.pid,
            "nvml_pids": nvml_pids,
            "watched_pid": records.target.pid,
            "command": records.target.command,
            "username": records.target.username,
            "versions": hello.versions if hello else {},
            "device": hello.device if hello else None,
            "nvml": dataclasses.asdict(records.nvml),
        }

    def add(self, sample_json: Mapping[str, Any] | None, steps: Iterable[Step]) -> None:
        if sample_json is not None:
            self._pending.add_samples([sample_json])
        self._pending.add_steps(dataclasses.asdict(step) for step in steps)
        if time.monotonic() - self._flushed_at_s >= HISTORY_FLUSH_INTERVAL_S:
            self._flush()

    def _flush(self) -> None:
        self._pending.flush()
        self._flushed_at_s = time.monotonic()

    def finish(self, result: RunResult) -> None:
        store = self.store if threading.get_ident() == self._thread else HistoryStore(self.store.path)
        config, environment = self._records.config(), self._environment()

        def final_write(history: HistoryStore) -> None:
            history.set_config(self.run_id, config)
            history.set_environment(self.run_id, environment)
            history.update_result(self.run_id, dataclasses.replace(result, run_id=self.run_id), status=result.status)

        self.history_error = self._pending.finish(final_write, store=store)
        store.close()
        self.finished = True
