"""Differences between runs: % deltas against a baseline run."""

from __future__ import annotations


def percent_delta(value: float | None, baseline: float | None) -> float | None:
    """(value - baseline) / baseline in percent; None when either is missing or the baseline is 0."""
    if value is None or baseline is None or baseline == 0:
        return None
    return (value - baseline) / baseline * 100.0
