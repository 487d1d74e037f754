"""A bounded store of (time, value) samples covering a whole run, for charts that show the run from its start.

Memory stays bounded however long the run: once `capacity` points are stored, neighbouring points are merged
pairwise and from then on every stored point stands for twice as many raw samples (the *stride*). Every stored
point therefore covers the same number of raw samples, so resolution is uniform over the run: after n samples
the store keeps between capacity/2 and capacity points, each covering a stride of raw samples (a power of two).

Merging keeps the point's start time and reduces the values with the series' `reduce` rule:
- "max" (default) keeps peaks: right for memory, where the peak is what makes a run fail;
- "mean" keeps the average: right for noisy rates such as samples/s, where the max would flatter.
The raw maximum and the last value are tracked exactly, whatever the rule, and each stored point also keeps the
minimum of the raw samples it stands for: `envelope()` draws a whole run as each column's min..max, so neither a
peak nor a dip is averaged away.

The latest `recent_capacity` raw samples are also kept as they came (a ring): a chart of the recent minutes
(`bucket` over a span they cover) draws them at full rate however long the run has been.

Plain Python on purpose: the sampler side may fill it, the TUI reads it from the event loop.
"""

from __future__ import annotations

import bisect
import collections
from collections.abc import Sequence
from typing import Literal

Reduce = Literal["max", "mean"]

RECENT_SAMPLES = 2400
"""Raw samples kept as they came: 10 minutes at 4 Hz, twice the dashboards' recent view (`chart_span`)."""


class TimeSeries:
    """Samples `(t_s, value)` with non-decreasing `t_s`, downsampled to at most `capacity` stored points."""

    def __init__(self, capacity: int = 2048, reduce: Reduce = "max", recent_capacity: int = RECENT_SAMPLES) -> None:
        if capacity < 2 or capacity % 2:
            raise ValueError(f"capacity must be an even number >= 2, got {capacity}")
        if reduce not in ("max", "mean"):
            raise ValueError(f"reduce must be 'max' or 'mean', got {reduce!r}")
        self.capacity = capacity
        self.reduce: Reduce = reduce
        self.recent_capacity = recent_capacity
        self.version = 0
        """Incremented by every change; lets a chart skip redrawing when nothing arrived."""
        self._reset()

    def _reset(self) -> None:
        self._times_s: list[float] = []
        self._values: list[float] = []
        self._mins: list[float] = []
        """The smallest raw sample each stored point stands for."""
        self._recent_times_s: collections.deque[float] = collections.deque(maxlen=self.recent_capacity)
        self._recent_values: collections.deque[float] = collections.deque(maxlen=self.recent_capacity)
        self._stride = 1
        """Raw samples per stored (committed) point."""
        self._pending_t_s = 0.0
        self._pending_accumulator = 0.0
        """Max or sum of the raw samples not yet making up a whole stride."""
        self._pending_count = 0
        self._pending_min = 0.0
        self._first_t_s: float | None = None
        self._last_t_s: float | None = None
        self._last: float | None = None
        self._max: float | None = None
        self._sample_count = 0

    def append(self, t_s: float, value: float) -> None:
        if self._last_t_s is not None and t_s < self._last_t_s:
            raise ValueError(f"time went backwards: {t_s} after {self._last_t_s}")
        if self._first_t_s is None:
            self._first_t_s = t_s
        self._last_t_s = t_s
        self._last = value
        self._max = value if self._max is None else max(self._max, value)
        self._sample_count += 1
        self.version += 1
        self._recent_times_s.append(t_s)
        self._recent_values.append(value)
        if self._pending_count == 0:
            self._pending_t_s = t_s
            self._pending_accumulator = self._pending_min = value
        else:
            self._pending_min = min(self._pending_min, value)
            if self.reduce == "max":
                self._pending_accumulator = max(self._pending_accumulator, value)
            else:
                self._pending_accumulator += value
        self._pending_count += 1
        if self._pending_count == self._stride:
            self._times_s.append(self._pending_t_s)
            self._values.append(self._pending_value())
            self._mins.append(self._pending_min)
            self._pending_count = 0
            if len(self._times_s) >= self.capacity:
                self._halve()

    def _pending_value(self) -> float:
        if self.reduce == "max":
            return self._pending_accumulator
        return self._pending_accumulator / self._pending_count

    def _halve(self) -> None:
        values = self._values
        if self.reduce == "max":
            self._values = [max(values[i], values[i + 1]) for i in range(0, len(values), 2)]
        else:
            self._values = [(values[i] + values[i + 1]) / 2 for i in range(0, len(values), 2)]
        mins = self._mins
        self._mins = [min(mins[i], mins[i + 1]) for i in range(0, len(mins), 2)]
        self._times_s = self._times_s[0::2]
        self._stride *= 2

    def clear(self) -> None:
        self._reset()
        self.version += 1

    def copy(self) -> TimeSeries:
        """An independent snapshot (a paused chart keeps drawing one while the original grows)."""
        twin = TimeSeries(self.capacity, self.reduce)
        twin.__dict__.update(self.__dict__)
        twin._times_s = list(self._times_s)
        twin._values = list(self._values)
        twin._mins = list(self._mins)
        twin._recent_times_s = collections.deque(self._recent_times_s, maxlen=self.recent_capacity)
        twin._recent_values = collections.deque(self._recent_values, maxlen=self.recent_capacity)
        return twin

    def points(self) -> list[tuple[float, float]]:
        """The stored points, oldest first; the last may stand for fewer raw samples than the stride."""
        points = list(zip(self._times_s, self._values, strict=True))
        if self._pending_count:
            points.append((self._pending_t_s, self._pending_value()))
        return points

    def bucket(self, width: int, t_start_s: float | None = None, t_end_s: float | None = None) -> list[float | None]:
        """Values for `width` equal columns spanning `t_start_s`..`t_end_s` (default: this series' first..last time).

        Each column reduces the points that start inside it (max or sample-weighted mean). A column with no point
        between this series' first and last sample holds the previous column's value, as a sampled signal does;
        columns before its first or after its last sample are None, so series of different lengths can share
        one time axis.
        """
        if width <= 0:
            return []
        columns: list[float | None] = [None] * width
        if self._first_t_s is None or self._last_t_s is None:
            return columns
        start_s = self._first_t_s if t_start_s is None else t_start_s
        end_s = self._last_t_s if t_end_s is None else t_end_s
        span_s = end_s - start_s
        times_s, values = self._times_s, self._values
        if span_s <= 0:
            # One instant: the whole chart shows the value known at that instant.
            inside = [(value, self._stride) for t_s, value in zip(times_s, values, strict=True) if t_s == start_s]
            if self._pending_count and self._pending_t_s == start_s:
                inside.append((self._pending_value(), self._pending_count))
            return [self._reduce_weighted(inside)] * width if inside else columns
        if self._first_t_s > end_s or self._last_t_s < start_s:
            return columns

        if self._stride > 1 and self._recent_times_s and self._recent_times_s[0] <= start_s:
            return self._bucket_recent(width, start_s, span_s)

        # Stored times are sorted, so each column is one slice, found by bisection: a chart repaints this at
        # its paint tick for every series, so it must stay cheap (C-level max/sum over slices).
        points_per_column = [0] * width
        low = bisect.bisect_left(times_s, start_s)
        end_index = bisect.bisect_right(times_s, end_s)
        for column in range(width):
            if column == width - 1:
                high = end_index
            else:
                high = bisect.bisect_left(times_s, start_s + span_s * (column + 1) / width, low, end_index)
            if high > low:
                chunk = values[low:high]
                columns[column] = max(chunk) if self.reduce == "max" else sum(chunk) / len(chunk)
                points_per_column[column] = len(chunk)
            low = high
        if self._pending_count and start_s <= self._pending_t_s <= end_s:
            self._merge_pending(columns, points_per_column, self._column(self._pending_t_s, start_s, span_s, width))

        last_column = self._column(min(self._last_t_s, end_s), start_s, span_s, width)
        held: float | None = None
        for column in range(last_column + 1):
            if columns[column] is None:
                columns[column] = held
            held = columns[column]
        return columns

    def _bucket_recent(self, width: int, start_s: float, span_s: float) -> list[float | None]:
        """`bucket` from the raw samples of the recent ring, which cover the span from its start: full rate."""
        times_s, values = list(self._recent_times_s), list(self._recent_values)
        columns: list[float | None] = [None] * width
        low = bisect.bisect_left(times_s, start_s)
        end_index = bisect.bisect_right(times_s, start_s + span_s)
        for column in range(width):
            high = (
                end_index
                if column == width - 1
                else bisect.bisect_left(times_s, start_s + span_s * (column + 1) / width, low, end_index)
            )
            if high > low:
                chunk = values[low:high]
                columns[column] = max(chunk) if self.reduce == "max" else sum(chunk) / len(chunk)
            low = high
        assert self._last_t_s is not None
        held: float | None = None
        for column in range(self._column(min(self._last_t_s, start_s + span_s), start_s, span_s, width) + 1):
            if columns[column] is None:
                columns[column] = held
            held = columns[column]
        return columns

    def envelope(self, width: int, t_start_s: float, t_end_s: float) -> list[float | None]:
        """The run from `t_start_s` to `t_end_s` as `width` values, two a cell of `width // 2` columns: each cell's
        largest then smallest stored value (the points' max, or mean for a "mean" series, and the min of their raw
        samples), so a line through them
        draws each cell's whole range and a peak of any length stays in sight. A cell with no point between two with
        points holds the level before it; cells before the first point or after the last are None."""
        cells = width // 2
        values: list[float | None] = [None] * width
        span_s = t_end_s - t_start_s
        if cells <= 0 or span_s <= 0 or self._first_t_s is None:
            return values
        times_s, highs, lows = list(self._times_s), list(self._values), list(self._mins)
        if self._pending_count:
            times_s.append(self._pending_t_s)
            highs.append(self._pending_accumulator if self.reduce == "max" else self._pending_value())
            lows.append(self._pending_min)
        low = bisect.bisect_left(times_s, t_start_s)
        end_index = bisect.bisect_right(times_s, t_end_s)
        for cell in range(cells):
            high = bisect.bisect_left(times_s, t_start_s + span_s * (cell + 1) / cells, low, end_index)
            if cell == cells - 1:
                high = end_index
            if high > low:
                values[2 * cell] = max(highs[low:high])
                values[2 * cell + 1] = min(lows[low:high])
            low = high
        filled = [cell for cell in range(cells) if values[2 * cell] is not None]
        for cell in range(filled[0] + 1, filled[-1]) if filled else ():
            if values[2 * cell] is None:  # fewer points than cells: a sampled signal holds its level between them
                values[2 * cell] = values[2 * cell + 1] = values[2 * cell - 1]
        return values

    def _merge_pending(self, columns: list[float | None], points_per_column: list[int], column: int) -> None:
        """Fold the partial group into its column; in a mean it weighs its raw samples, not a whole stride."""
        pending, existing = self._pending_value(), columns[column]
        if existing is None:
            columns[column] = pending
        elif self.reduce == "max":
            columns[column] = max(existing, pending)
        else:
            committed_samples = points_per_column[column] * self._stride
            columns[column] = (existing * committed_samples + pending * self._pending_count) / (
                committed_samples + self._pending_count
            )

    @staticmethod
    def _column(t_s: float, start_s: float, span_s: float, width: int) -> int:
        return min(width - 1, max(0, int((t_s - start_s) / span_s * width)))

    def _reduce_weighted(self, values: Sequence[tuple[float, float]]) -> float | None:
        if not values:
            return None
        if self.reduce == "max":
            return max(value for value, _ in values)
        return sum(value * weight for value, weight in values) / sum(weight for _, weight in values)

    @property
    def last(self) -> float | None:
        """The most recent raw value."""
        return self._last

    @property
    def max(self) -> float | None:
        """The largest raw value ever appended (exact, not affected by downsampling)."""
        return self._max

    @property
    def first_t_s(self) -> float | None:
        return self._first_t_s

    @property
    def last_t_s(self) -> float | None:
        return self._last_t_s

    @property
    def stride(self) -> int:
        """Raw samples per stored point."""
        return self._stride

    @property
    def recent_count(self) -> int:
        """Raw samples in the recent ring (never more than `recent_capacity`)."""
        return len(self._recent_values)

    @property
    def sample_count(self) -> int:
        """Raw samples appended since creation or the last `clear()`."""
        return self._sample_count

    def __len__(self) -> int:
        """Stored points (never more than `capacity`)."""
        return len(self._times_s) + (1 if self._pending_count else 0)

    def __bool__(self) -> bool:
        return self._sample_count > 0
