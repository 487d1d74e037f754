"""Giving the memory a long-lived monitor freed back to the system, so days of watching keep its RSS flat.

The dashboard, `watch` and `serve` free as much as they allocate once their bounded buffers are full, but glibc's
malloc keeps freed pages inside its heap (it returns only a free stretch at the heap's top): over a 72-hour replay
the watch's RSS grew 19 MiB while the objects Python held stayed flat (docs/long_runs.md; most of it was the history's
thinning parsing thousands of rows at once, now streamed). `malloc_trim(0)` hands every free page of glibc's heap
back (madvise), wherever it lies. `HeapTrimmer` calls it at most once per `TRIM_EVERY_S` of sample time, from the
sampler's thread. Elsewhere than glibc (macOS, musl) there is no malloc_trim and it does nothing.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any

TRIM_EVERY_S = 60.0
"""How often (seconds of sample time) the freed heap is handed back: a trim of the watch's 100 MiB takes 0.7 ms
(12 ms the first time), a millisecond a minute."""


def _glibc() -> Any:
    """glibc with its malloc_trim, or None where there is none."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return libc


def trim_heap() -> bool:
    """Hand the heap's free pages back to the system now; False where malloc_trim does not exist."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


class HeapTrimmer:
    """Trims the heap once every `every_s` of sample time (`due_at` the samples' `t_s`)."""

    def __init__(self, every_s: float = TRIM_EVERY_S) -> None:
        self.every_s = every_s
        self._libc = _glibc()
        self._last_t_s: float | None = None
        self.trims = 0
        """How many times it trimmed."""

    def after_sample(self, t_s: float) -> None:
        """Note a sample at `t_s`; trim when `every_s` has passed since the last trim (or the first sample)."""
        if self._libc is None:
            return
        if self._last_t_s is None or t_s < self._last_t_s:  # the first sample, or a clock that went back (a replay)
            self._last_t_s = t_s
            return
        if t_s - self._last_t_s >= self.every_s:
            self._last_t_s = t_s
            self._libc.malloc_trim(0)
            self.trims += 1
