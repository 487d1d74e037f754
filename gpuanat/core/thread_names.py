"""Threads named for the OS too, so that `top -H` and benchmarks/tui_cost.py tell their CPU apart."""

from __future__ import annotations

import contextlib
import threading


def name_native_thread(name: str | None = None) -> None:
    """Give the calling thread `name` (default: its Python name) as the OS sees it too (Linux: `top -H`,
    /proc/PID/task/TID/comm); at most 15 bytes are kept. Best effort: elsewhere, nothing."""
    name = name or threading.current_thread().name
    with (
        contextlib.suppress(OSError),
        open(f"/proc/self/task/{threading.get_native_id()}/comm", "w", encoding="ascii", errors="replace") as comm,
    ):
        comm.write(name[:15])
