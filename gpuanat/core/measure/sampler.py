"""The sampling thread: reads a source at a steady pace and hands each sample to its consumers.

A `Sampler` owns one background thread that reads a source every `interval_s` and hands each `Sample` to a
callback and to its listeners; it never touches the UI. It can record every sample to a JSON-lines trace that
`ReplaySource` plays back. The sources are `NvmlSource` (`nvml_source`), `HostOnlySource` (`process_tree`) and
`ReplaySource`/`ReplayGpuSource` (`replay`); `open_source()` (`nvml_source`) picks the best live one.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from gpuanat.core.heap import HeapTrimmer
from gpuanat.core.measure.samples import Sample, SampleSource
from gpuanat.core.thread_names import name_native_thread


class Sampler:
    """Reads a source every `interval_s` on a background thread and passes each sample to `on_sample`.

    `on_sample` runs on the sampler thread: it must hand the sample over (post a message, append
    to a buffer) and never touch the UI. An exception from the source or the callback is kept in
    `last_error` and sampling goes on; the thread ends by itself only when a replayed trace ends.
    The source is the caller's: `stop` does not close it.
    """

    def __init__(
        self,
        source: SampleSource,
        *,
        interval_s: float = 0.25,
        on_sample: Callable[[Sample], None],
        clock: Callable[[], float] = time.monotonic,
        trace_path: Path | None = None,
    ) -> None:
        """`clock` stamps live samples (`t_s`); the pacing of reads always uses real time.
        `trace_path`, when given, gets every sample appended as one JSON line, flushed per line:
        this is how traces are recorded on a GPU machine for `ReplaySource`."""
        if interval_s <= 0:
            raise ValueError(f"interval_s must be positive, got {interval_s}")
        self._source = source
        self._interval_s = interval_s
        self._on_sample = on_sample
        self._clock = clock
        self._trace_path = trace_path
        self._trace_file: TextIO | None = None
        self._pids: set[int] = set()
        self._pids_lock = threading.Lock()
        self._listeners: tuple[Callable[[Sample], None], ...] = ()
        # Serialises reads, trace writes and closing the trace between the thread and sample_once.
        self._read_lock = threading.Lock()
        self._stop_requested = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu_seconds = 0.0
        self._last_error: str | None = None
        self.heap_trimmer = HeapTrimmer()
        """Hands the process's freed heap back to the system every `heap.TRIM_EVERY_S` of sample time, so a monitor
        open for days keeps its RSS flat."""

    def track(self, pid: int) -> None:
        """Include `pid` and its descendants in host metrics from the next read on."""
        with self._pids_lock:
            self._pids.add(pid)

    def untrack(self, pid: int) -> None:
        with self._pids_lock:
            self._pids.discard(pid)

    def add_listener(self, listener: Callable[[Sample], None]) -> None:
        """Also hand each sample the thread takes to `listener` (after `on_sample`), until `remove_listener`: a
        second consumer, such as a run inside the dashboard, shares the reads instead of making its own."""
        with self._pids_lock:
            self._listeners = (*self._listeners, listener)

    def remove_listener(self, listener: Callable[[Sample], None]) -> None:
        with self._pids_lock:
            self._listeners = tuple(known for known in self._listeners if known != listener)

    def sample_once(self) -> Sample:
        """Read the source now, on the calling thread (recorded to the trace like any sample)."""
        with self._pids_lock:
            pids = frozenset(self._pids)
        with self._read_lock:
            sample = self._source.read(pids)
            if not self._source.keeps_recorded_time:
                sample = dataclasses.replace(sample, t_s=self._clock())
            if self._trace_path is not None:
                if self._trace_file is None:
                    self._trace_file = self._trace_path.open("a", encoding="utf-8")
                self._trace_file.write(json.dumps(sample.to_json(), separators=(",", ":")) + "\n")
                self._trace_file.flush()
        return sample

    def start(self) -> None:
        if self.running:
            raise RuntimeError("sampler is already running")
        self._stop_requested.clear()
        self._thread = threading.Thread(target=self._run, name="gpuanat-sampler", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread, wait for it, and close the trace file. Idempotent."""
        self._stop_requested.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()
            self._thread = None
        with self._read_lock:
            if self._trace_file is not None:
                self._trace_file.close()
                self._trace_file = None

    @property
    def running(self) -> bool:
        """True while the thread is alive: after `start`, until `stop` or the end of a replay."""
        return self._thread is not None and self._thread.is_alive()

    @property
    def cpu_seconds(self) -> float:
        """CPU time the sampler thread itself used (reads, trace writes, callbacks), all runs, and the thread its
        source reads NVML on (`NvmlSource.helper_cpu_seconds`)."""
        return self._cpu_seconds + getattr(self._source, "helper_cpu_seconds", 0.0)

    @property
    def last_error(self) -> str | None:
        """The most recent exception from the source or `on_sample`, as text; None if none yet."""
        return self._last_error

    def _run(self) -> None:
        name_native_thread()
        cpu_at_start_s = self._cpu_seconds
        thread_time_at_start_s = time.thread_time()
        next_read_s = time.monotonic()
        while not self._stop_requested.is_set():
            try:
                sample = self.sample_once()
                for consumer in (self._on_sample, *self._listeners):
                    try:
                        consumer(sample)
                    # The thread must outlive a failing callback, and the other consumers still get the sample.
                    except Exception as error:
                        self._last_error = f"{type(error).__name__}: {error}"
                self.heap_trimmer.after_sample(sample.t_s)
            except StopIteration:
                break
            # The thread must outlive a failing device; the app shows last_error.
            except Exception as error:
                self._last_error = f"{type(error).__name__}: {error}"
            self._cpu_seconds = cpu_at_start_s + time.thread_time() - thread_time_at_start_s
            next_read_s += self._interval_s
            now_s = time.monotonic()
            # After a read slower than the interval, skip the missed ticks instead of bursting.
            next_read_s = max(next_read_s, now_s)
            self._stop_requested.wait(next_read_s - now_s)
        self._cpu_seconds = cpu_at_start_s + time.thread_time() - thread_time_at_start_s
