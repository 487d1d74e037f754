"""Keeping a long run's rows in the history bounded: full rate for the recent part, min and max per bucket before it.

A run watched for days at 4 Hz would store a million samples (and a step record per step): hundreds of megabytes.
The recorder (`recording.PendingWrites`) hands what it wrote to a `RowThinner`, one for the samples (by time) and
one for the steps (by step number). Rows newer than `full_rate` before the latest stay as written; older ones are
thinned per bucket of the run's axis: a bucket keeps its first and last row and the rows that hold each reading's
minimum and maximum (each GPU's memory used, the GPUs' utilization, the host's RSS and CPU; a step's loss and
memory), so a peak survives thinning and a chart of the stored run still spans the whole run. When the thinned
part holds more than `max_buckets` buckets, the bucket width doubles and the thinned part is thinned again (the
extremes of two buckets are among their kept rows), so the rows stay bounded however long the run: at most
`max_buckets` buckets of a few rows, plus the recent part at full rate.

Thinning only deletes rows of the tables as they are: a stored run reads as before, with fewer rows. The last
step of a run (what `interrupted.result_from_steps` rebuilds an interrupted run from) is always in the recent part.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuanat.core.store.history import HistoryStore

Readings = Callable[[Mapping[str, Any]], Iterable[tuple[str, float | None]]]


def sample_readings(sample: Mapping[str, Any]) -> Iterable[tuple[str, float | None]]:
    """What a bucket of samples keeps the extremes of: each GPU's memory used, the GPUs' utilization (one reading,
    any GPU: a bucket of eight GPUs keeps two rows for it, not sixteen), the host's RSS and CPU."""
    for gpu in sample.get("gpus") or ():
        yield f"used {gpu.get('index')}", gpu.get("used_bytes")
        yield "gpu util", gpu.get("gpu_util_percent")
    host = sample.get("host") or {}
    yield "rss", host.get("rss_bytes")
    yield "cpu", host.get("cpu_percent")


def step_readings(step: Mapping[str, Any]) -> Iterable[tuple[str, float | None]]:
    """What a bucket of step records keeps the extremes of, per rank: the loss and the allocator's peaks."""
    rank = step.get("rank")
    for field in ("loss", "peak_allocated_bytes", "allocated_bytes", "reserved_bytes"):
        yield f"{field} {rank}", step.get(field)


@dataclass(frozen=True)
class Thinning:
    """How one table of a run is thinned."""

    table: str
    """`samples` or `steps`."""
    key: str
    """The field of a row that orders it: `t_s` or `step`."""
    readings: Readings
    full_rate: float
    """How far back from the latest row (in `key`'s unit) rows stay at full rate."""
    first_bucket: float
    """The width of a bucket (in `key`'s unit) until the thinned part outgrows `max_buckets`."""
    max_buckets: int


SAMPLE_THINNING = Thinning("samples", "t_s", sample_readings, full_rate=600.0, first_bucket=30.0, max_buckets=512)
"""Samples: the last 10 minutes at full rate (2,400 at 4 Hz); 30 s buckets before, doubling past 512 buckets (a
72-hour run: 270 buckets of 16 minutes)."""
STEP_THINNING = Thinning("steps", "step", step_readings, full_rate=5000, first_bucket=20, max_buckets=512)
"""Steps: the last 5,000 steps at full rate; buckets of 20 steps before, doubling past 512 buckets."""


class RowThinner:
    """Thins one table of one run as its rows are written (`written`), keeping the rows bounded: at most
    `max_buckets` + 1 buckets of a few rows each, and the rows of the last `full_rate` + `first_bucket`."""

    def __init__(self, thinning: Thinning) -> None:
        self.thinning = thinning
        self.bucket_width = thinning.first_bucket
        self._origin: float | None = None
        self._latest: float | None = None
        self._thinned_to: float | None = None
        """Rows before this key are thinned; None: none is yet."""
        self.deleted = 0
        """Rows this thinner deleted, over the run."""

    def written(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Note the rows just written (in order)."""
        key = self.thinning.key
        for record in records:
            value = record.get(key)
            if isinstance(value, (int, float)):
                self._origin = value if self._origin is None else min(self._origin, value)
                self._latest = value if self._latest is None else max(self._latest, value)

    def due(self) -> bool:
        """Whether a whole bucket before the recent part is not thinned yet."""
        return self._cut() > (self._thinned_to if self._thinned_to is not None else -math.inf)

    def _cut(self) -> float:
        if self._origin is None or self._latest is None:
            return -math.inf
        # Cut at the first bucket's granularity, not the bucket's: the part at full rate stays as short however wide
        # the buckets grow; the bucket the cut falls in is thinned again, whole, at the next cut.
        steps = math.floor((self._latest - self.thinning.full_rate - self._origin) / self.thinning.first_bucket)
        return self._origin + steps * self.thinning.first_bucket if steps > 0 else -math.inf

    def thin(self, store: HistoryStore, run_id: int) -> None:
        """Thin the rows before the recent part not thinned yet; when they would make more than `max_buckets`
        buckets, double the width and thin the whole thinned part again. Raises what the store raises (nothing is
        deleted then, and the next call tries again)."""
        if not self.due() or self._origin is None:
            return
        cut = self._cut()
        thinned_to = self._thinned_to if self._thinned_to is not None else self._origin
        while (cut - self._origin) / self.bucket_width > self.thinning.max_buckets:
            self.bucket_width *= 2
            thinned_to = self._origin
        # From the start of the bucket the last cut fell in: that bucket's kept rows and its new ones, thinned whole.
        start = self._origin + math.floor((thinned_to - self._origin) / self.bucket_width) * self.bucket_width
        rows = store.recorded_rows(self.thinning.table, run_id, start, cut)
        dropped = self._dropped(rows)
        if dropped:
            store.delete_recorded_rows(self.thinning.table, run_id, dropped)
            self.deleted += len(dropped)
        self._thinned_to = cut

    def _dropped(self, rows: Iterable[tuple[int, str]]) -> list[int]:
        """The rowids of `rows` that their buckets do not keep. Each row is parsed, measured and let go before the
        next: what is held is a bucket's rowids and its extremes, never the parsed rows (a re-thinning after the
        buckets widen reads thousands of rows, and parsed all at once they left the heap fragmented for hours)."""
        assert self._origin is not None
        buckets: dict[int, _Bucket] = {}
        for rowid, text in rows:
            try:
                record = json.loads(text)
                position = float(record[self.thinning.key])
            except (ValueError, KeyError, TypeError):
                continue  # a row it cannot read is kept: thinning never loses what it does not understand
            index = math.floor((position - self._origin) / self.bucket_width)
            bucket = buckets.get(index)
            if bucket is None:
                bucket = buckets[index] = _Bucket()
            bucket.add(rowid, self.thinning.readings(record))
        dropped: list[int] = []
        for bucket in buckets.values():
            kept = bucket.kept()
            dropped.extend(rowid for rowid in bucket.rowids if rowid not in kept)
        return dropped


class _Bucket:
    """One bucket's rows as thinning reads them: their rowids in order and, per reading, its lowest and highest
    value with the row holding each."""

    def __init__(self) -> None:
        self.rowids: list[int] = []
        self.extremes: dict[str, tuple[float, int, float, int]] = {}

    def add(self, rowid: int, readings: Iterable[tuple[str, float | None]]) -> None:
        self.rowids.append(rowid)
        for name, value in readings:
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
                continue
            low, low_row, high, high_row = self.extremes.get(name, (value, rowid, value, rowid))
            if value < low:
                low, low_row = value, rowid
            if value > high:
                high, high_row = value, rowid
            self.extremes[name] = (low, low_row, high, high_row)

    def kept(self) -> set[int]:
        """The first and last rows and those holding an extreme."""
        kept = {self.rowids[0], self.rowids[-1]}
        for _, low_row, _, high_row in self.extremes.values():
            kept.update((low_row, high_row))
        return kept
