"""A relative difference in percent: how far a measurement lies from its prediction, a run from its baseline.

On the ground floor of `core/` because the result (predicted against measured) and the comparisons (run against run)
both speak in it.
"""

from __future__ import annotations


def percent_delta(value: float | None, baseline: float | None) -> float | None:
    """(value - baseline) / baseline in percent; None when either is missing or the baseline is 0."""
    if value is None or baseline is None or baseline == 0:
        return None
    return (value - baseline) / baseline * 100.0
