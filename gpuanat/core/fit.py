"""The largest batch that trains: start from the prediction, confirm with short real runs.

The search doubles up from a batch that trains until one runs out of memory (or down from the start
when that one already does), then bisects between the largest that trained and the smallest that did
not. Each trial is a real run of a few steps, recorded in the history like any other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Trial:
    batch_size: int
    trained: bool
    """False when the run ran out of memory."""


def find_largest_batch(trains: Callable[[int], bool], start: int, limit: int) -> tuple[int, list[Trial]]:
    """The largest batch in [1, limit] for which `trains` is true (0 if none), and the trials made.

    Assumes memory grows with the batch: if a batch runs out of memory, every larger one does too.
    """
    trials: list[Trial] = []

    def attempt(batch_size: int) -> bool:
        trained = trains(batch_size)
        trials.append(Trial(batch_size, trained))
        return trained

    start = min(max(1, start), limit)
    if attempt(start):
        largest_ok, smallest_failed = start, None
        while smallest_failed is None and largest_ok < limit:
            candidate = min(largest_ok * 2, limit)
            if attempt(candidate):
                largest_ok = candidate
            else:
                smallest_failed = candidate
        if smallest_failed is None:
            return largest_ok, trials
    else:
        largest_ok, smallest_failed = 0, start
    while smallest_failed - largest_ok > 1:
        middle = (largest_ok + smallest_failed) // 2
        if attempt(middle):
            largest_ok = middle
        else:
            smallest_failed = middle
    return largest_ok, trials
