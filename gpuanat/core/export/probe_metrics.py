"""A training process's own rank, served to Prometheus by its probe when `GPUANAT_METRICS=[HOST:]PORT` is set.

For jobs gpuanat did not start (`torchrun train.py` on every node of a cluster): each rank's probe serves its own
series on PORT + LOCAL_RANK, so the ranks of one node do not collide and the cluster's Prometheus scrapes each one.
The probe's events are reduced as gpuanat reduces them everywhere else (`RankEvents`); its bands are those of one
moment — the probe's tensors and the allocator's and NVML's readings the training process took together at a step —
assembled as the result's are. Plain Python: no torch (the probe hands in its GPU's identity). A port that cannot be
had costs the metrics, never the training: one warning, and the probe goes on.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from gpuanat.core.export.metrics import (
    METRICS_VARIABLE,
    MetricsServer,
    RankSnapshot,
    beyond_loopback_warning,
    job_label,
    parse_address,
    tokens_per_second,
)
from gpuanat.core.measure.anatomy import assemble_bands, gradients_after_backward_bytes
from gpuanat.core.measure.run_state import RankEvents, rank_status
from gpuanat.core.vocabulary.protocol import Done, Event

THROUGHPUT_WINDOW_S = 5.0


class ProbeMetrics:
    """One rank's events, as a `RankSnapshot`."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._lock = threading.Lock()
        self._state = RankEvents()
        self._gpu: tuple[int | None, str | None, str | None, int | None] = (None, None, None, None)

    def set_gpu(self, index: int | None, uuid: str | None, name: str | None, total_bytes: int | None) -> None:
        with self._lock:
            self._gpu = (index, uuid, name, total_bytes)

    def observe(self, event: Event) -> None:
        with self._lock:
            self._state.observe(event)

    def snapshots(self) -> list[RankSnapshot]:
        with self._lock:
            state = self._state
            index, uuid, name, total = self._gpu
            step, hello = state.last_step, state.hello
            if hello is None and step is None:
                return []
            on_gpu = hello is not None and hello.device == "cuda"
            bands = assemble_bands(
                state.probe_bands,
                reserved_bytes=step.reserved_bytes if step else None,
                device_used_bytes=step.nvml_device_used_bytes if step else None,
                device_total_bytes=total,
                process_used_bytes=step.nvml_process_used_bytes if step else None,
                no_gpu_reason=None if on_gpu else "CPU run: it uses no GPU memory",
            )
            rate = state.samples_per_second(THROUGHPUT_WINDOW_S)
            if isinstance(state.done, Done) and state.done.steady_samples_per_second is not None:
                rate = state.done.steady_samples_per_second
            status = "training" if state.error is None and state.done is None else rank_status(state)
            return [
                RankSnapshot(
                    rank=self.rank,
                    status=status,
                    gpu_index=index,
                    gpu_uuid=uuid,
                    gpu_name=name or (hello.device_name if hello else None),
                    bands=bands.values(),
                    gradients_after_backward_bytes=gradients_after_backward_bytes(state.probe_bands),
                    device_used_bytes=step.nvml_device_used_bytes if step else None,
                    device_total_bytes=total,
                    step=step.step if step else None,
                    total_steps=state.model.total_steps if state.model else None,
                    samples_per_second=rate,
                    tokens_per_second=tokens_per_second(rate, step),
                    step_phase_seconds=dict(step.phases_s) if step and step.phases_s else {},
                    loss=state.loss.loss,
                    learning_rate=state.loss.learning_rate,
                    grad_norm=state.loss.grad_norm,
                )
            ]


_served: ProbeMetrics | None = None
_server: MetricsServer | None = None
_failed = False


def exported(emit: Callable[[Event], None], environ: Mapping[str, str] | None = None) -> Callable[[Event], None]:
    """`emit`, also feeding this process's rank metrics when `GPUANAT_METRICS` asks for them (served once a process,
    on PORT + LOCAL_RANK); `emit` itself when it does not, or when the port cannot be had."""
    global _served, _server, _failed
    environ = os.environ if environ is None else environ
    asked = environ.get(METRICS_VARIABLE)
    if not asked or _failed:
        return emit
    if _served is None:
        try:
            host, port = parse_address(asked)
            local_rank = int(environ.get("LOCAL_RANK", "0") or 0)
            served = ProbeMetrics(int(environ.get("RANK", "0") or 0))
            _server = MetricsServer(
                (host, port + local_rank if port else 0), served.snapshots, job=job_label(None, environ)
            )
            _served = served
        except (ValueError, OSError) as error:
            _failed = True
            print(f"gpuanat: {METRICS_VARIABLE}={asked}: metrics not served ({error})", file=sys.stderr, flush=True)
            return emit
        warning = beyond_loopback_warning(_server.host, METRICS_VARIABLE)
        if warning:
            print(f"gpuanat: {warning}", file=sys.stderr, flush=True)
        print(f"gpuanat: rank {_served.rank} metrics at {_server.url}", file=sys.stderr, flush=True)
    served = _served

    def emit_and_export(event: Event) -> None:
        served.observe(event)
        emit(event)

    return emit_and_export


def served_metrics() -> ProbeMetrics | None:
    """This process's rank metrics, when served (the probe tells it its GPU)."""
    return _served


def gpu_identity(nvml: Any, handle: Any) -> tuple[int | None, str | None, str | None, int | None]:
    """(NVML index, UUID, name, total bytes) of a GPU, from NVML; what NVML refuses is None."""
    values: list[Any] = []
    reads: tuple[Callable[[], Any], ...] = (
        lambda: nvml.nvmlDeviceGetIndex(handle),
        lambda: nvml.nvmlDeviceGetUUID(handle),
        lambda: nvml.nvmlDeviceGetName(handle),
        lambda: nvml.nvmlDeviceGetMemoryInfo(handle).total,
    )
    for read in reads:
        try:
            value = read()
            values.append(value.decode() if isinstance(value, bytes) else value)
        except Exception:
            values.append(None)
    return values[0], values[1], values[2], values[3]
