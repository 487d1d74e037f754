"""What the probe costs, and that it never costs the training its run: each of the probe's methods and hooks is
timed into its `probe_time_s`, split into `PROBE_TIME_PARTS`, and an unexpected error in one turns the probe off
with one warning instead of reaching the training loop (`never_raises`).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

PROBE_TIME_PARTS = ("setup", "measured steps", "other steps", "synchronize", "profiling")
"""Once per run (`begin`, `end`), the steps measured exactly, the other steps, the waits of the two CUDA
synchronisations, and the operations profiler's work when it was asked for (starting, stepping and reading the
profile: not the probe's cost, a measurement of its own)."""
SET_APART_PARTS = ("synchronize", "profiling")
"""Parts timed inside a method and set apart from its step's part."""


def never_raises(method: Callable[..., Any]) -> Callable[..., Any]:
    """Run a probe's method or hook (on a `core.Probe`), adding its wall time to `probe_time_s`; on an unexpected
    error turn the probe off (one warning) and return None, which Trainer and torch both read as "no change"."""

    @functools.wraps(method)
    def guarded(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self.disabled_reason is not None:
            return None
        started_s = time.perf_counter()
        measuring_before = getattr(self, "_measuring", False)
        set_apart_before_s = sum(self.probe_time_by_part_s[part] for part in SET_APART_PARTS)
        try:
            return method(self, *args, **kwargs)
        except Exception as error:
            self._disable(f"{type(error).__name__}: {error}")
            return None
        finally:
            elapsed_s = time.perf_counter() - started_s
            waited_s = sum(self.probe_time_by_part_s[part] for part in SET_APART_PARTS) - set_apart_before_s
            if method.__name__ in ("begin", "end"):
                part = "setup"
            else:
                part = "measured steps" if measuring_before or getattr(self, "_measuring", False) else "other steps"
            self.probe_time_by_part_s[part] += elapsed_s - waited_s
            self.probe_time_s += elapsed_s

    return guarded
