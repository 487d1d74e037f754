"""Writes of a run in progress that wait for the history to accept them: a busy or full history never ends a run.

A run's recorder (`execute_run`, a watched or scripted run's `HistoryRecorder`) queues its step records, samples
and row updates here and flushes about once a second. A flush that the history refuses (`HistoryWriteError`:
locked by another process, disk full, failing I/O) keeps everything queued, in order, for the next flush; the
run goes on. The final write is retried with back-off until `FINAL_WRITE_DEADLINE_S`; if the history still
refuses it, `finish` says what was not saved, the caller reports it, and the run's row — left `running` with a
recorder that is gone — is finalised as interrupted from its saved steps by the next writable open.

A long run's rows stay bounded: after a flush, the steps and samples older than their recent part are thinned
(`sample_thinning`); a history that refuses the thinning leaves the rows as written, thinned at a later flush.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from contextlib import suppress
from typing import Any

from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.history_errors import HistoryError, HistoryWriteError, write_with_backoff
from gpuanat.core.store.sample_thinning import SAMPLE_THINNING, STEP_THINNING, RowThinner, Thinning

FINAL_WRITE_DEADLINE_ENV = "GPUANAT_FINAL_WRITE_DEADLINE_S"
FINAL_WRITE_DEADLINE_S = float(os.environ.get(FINAL_WRITE_DEADLINE_ENV) or 30.0)
"""How long the first and the last writes of a run are retried before the run ends without them (and says so);
GPUANAT_FINAL_WRITE_DEADLINE_S sets it."""


class PendingWrites:
    """Step records, samples and row updates of one run, written when the history takes them."""

    def __init__(
        self, store: HistoryStore, run_id: int, thinnings: tuple[Thinning, ...] = (STEP_THINNING, SAMPLE_THINNING)
    ) -> None:
        self.store = store
        self.run_id = run_id
        self._steps: list[dict[str, Any]] = []
        self._samples: list[dict[str, Any]] = []
        self._updates: list[Callable[[HistoryStore], None]] = []
        self.refusal: HistoryWriteError | None = None
        """Why the last flush could not write everything (None once one did)."""
        self.refusals = 0
        """Flushes the history refused, over the run."""
        self.thinners = {thinning.table: RowThinner(thinning) for thinning in thinnings}
        """What keeps the run's stored steps and samples bounded (`sample_thinning`)."""

    def add_steps(self, records: Iterable[Mapping[str, Any]]) -> None:
        self._steps.extend(dict(record) for record in records)

    def add_samples(self, samples: Iterable[Mapping[str, Any]]) -> None:
        self._samples.extend(dict(sample) for sample in samples)

    def update(self, write: Callable[[HistoryStore], None]) -> None:
        """Queue a change of the run's row (`write(store)`), kept in order with the others."""
        self._updates.append(write)

    @property
    def waiting(self) -> int:
        """Records and updates not yet written."""
        return len(self._steps) + len(self._samples) + len(self._updates)

    def flush(self, store: HistoryStore | None = None) -> bool:
        """Write what waits; False (everything kept) when the history refused. `store`: another connection to the
        same history, for a flush from another thread."""
        store = store or self.store
        try:
            while self._updates:
                self._updates[0](store)
                self._updates.pop(0)
            if self._steps:
                store.add_steps(self.run_id, self._steps)
                if "steps" in self.thinners:
                    self.thinners["steps"].written(self._steps)
                self._steps = []
            if self._samples:
                store.add_samples(self.run_id, self._samples)
                if "samples" in self.thinners:
                    self.thinners["samples"].written(self._samples)
                self._samples = []
        except HistoryWriteError as error:
            self.refusal = error
            self.refusals += 1
            return False
        self.refusal = None
        for thinner in self.thinners.values():
            # Thinning is housekeeping: a history that refuses it keeps the rows as written, thinned at a later flush.
            with suppress(HistoryError):
                thinner.thin(store, self.run_id)
        return True

    def finish(
        self,
        final_write: Callable[[HistoryStore], None],
        *,
        store: HistoryStore | None = None,
        deadline_s: float = FINAL_WRITE_DEADLINE_S,
    ) -> str | None:
        """Write what waits and then `final_write`, retrying with back-off for `deadline_s`. None when all was
        written; else one line saying what was not, and why."""
        store = store or self.store
        self.update(final_write)

        def write_all() -> None:
            if not self.flush(store):
                assert self.refusal is not None
                raise self.refusal

        try:
            write_with_backoff(write_all, deadline_s=deadline_s)
        except HistoryWriteError as error:
            return (
                f"run {self.run_id} could not be fully saved to the history {store.path} ({error}); "
                f"{self.waiting} records and its result were not written; its saved steps will be finalised "
                "as interrupted when the history is next opened"
            )
        return None
