"""Every rank's anatomy as Prometheus metrics: one series per band, rank and GPU, read at each scrape.

gpuanat does not aggregate across nodes: each process that knows a run (gpuanat's own parent for `run`, `sweep`,
`tune`, the dashboard and `watch`; the probe inside a training process started without gpuanat) serves an
OpenMetrics/Prometheus endpoint with `prometheus-client`, and the Prometheus a cluster already runs scrapes them
all. The labels that name a GPU are DCGM exporter's (`gpu`, `UUID`, `Hostname`), so the series join with the GPU
metrics the cluster already has; `rank`, `job` and `run_id` say whose they are.

What is exported is a list of `RankSnapshot`s, built by whoever knows the run (`run_metrics`, the watch, the probe)
at the moment of the scrape. Plain Python: no torch, no UI.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuanat.core.vocabulary.protocol import Step

METRICS_VARIABLE = "GPUANAT_METRICS"
"""[HOST:]PORT: a probe in a training process serves its rank's metrics there (the port plus LOCAL_RANK)."""
METRICS_JOB_VARIABLE = "GPUANAT_METRICS_JOB"
"""The `job` label's value; default: SLURM_JOB_ID, else the run's name, else "gpuanat"."""
DEFAULT_HOST = "127.0.0.1"
PREFIX = "gpuanat"
STEP_PHASES = ("data", "forward", "backward", "optimizer", "gpu wait")


@dataclass(frozen=True)
class RankSnapshot:
    """What is known of one rank of one run at the moment of a scrape (None: not known now)."""

    rank: int
    run_id: str = ""
    status: str = "training"
    """training, ok, stopped, failed, oom."""
    gpu_index: int | None = None
    gpu_uuid: str | None = None
    gpu_name: str | None = None
    bands: Mapping[str, int | None] = field(default_factory=dict)
    """The bands of one moment (`BAND_NAMES` → bytes), as the dashboard's bar and the result's `bands`."""
    gradients_after_backward_bytes: int | None = None
    device_used_bytes: int | None = None
    device_total_bytes: int | None = None
    gpu_util_percent: float | None = None
    sm_active_percent: float | None = None
    """NVML GPM's readings of the rank's GPU over its last interval (`GpuSample`): SMs active, tensor pipes active,
    DRAM bandwidth used; None on a GPU without GPM."""
    tensor_active_percent: float | None = None
    dram_bandwidth_percent: float | None = None
    power_w: float | None = None
    energy_joules: float | None = None
    """NVML's energy counter of the rank's GPU: joules since the driver loaded."""
    sm_clock_mhz: int | None = None
    throttle_reasons: tuple[str, ...] | None = None
    """What slows the GPU's clocks now (`gpm.throttle_names`): () for nothing; None when not read."""
    joules_per_sample: float | None = None
    """Energy a training sample cost: the ended run's result's (its steady power over its steady rate)."""
    step: int | None = None
    total_steps: int | None = None
    samples_per_second: float | None = None
    tokens_per_second: float | None = None
    achieved_tflops: float | None = None
    mfu: float | None = None
    step_phase_seconds: Mapping[str, float] = field(default_factory=dict)
    """Mean seconds of the latest steps by phase (`STEP_PHASES`)."""
    loss: float | None = None
    """The latest loss the training loop logged (`Step.loss`); `learning_rate` and `grad_norm` logged with it."""
    learning_rate: float | None = None
    grad_norm: float | None = None
    predicted_peak_bytes: int | None = None
    model: str | None = None
    techniques: str | None = None


def tokens_per_second(samples_per_second: float | None, step: Step | None) -> float | None:
    """Tokens/s at `samples_per_second`, at the tokens a sample of the latest step (`protocol.Step`) held."""
    if samples_per_second is None or step is None or not step.samples:
        return None
    return samples_per_second * step.tokens / step.samples


def job_label(name: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    environ = os.environ if environ is None else environ
    return environ.get(METRICS_JOB_VARIABLE) or environ.get("SLURM_JOB_ID") or name or "gpuanat"


def parse_address(text: str) -> tuple[str, int]:
    """ "9400" → (127.0.0.1, 9400); "0.0.0.0:9400", "[::1]:9400" → as given; port 0: a free one. Raises ValueError
    with what is wrong."""
    host, _, port_text = text.rpartition(":")
    host = host.strip("[]") or DEFAULT_HOST
    if not port_text.isdigit() or not 0 <= int(port_text) < 65536:
        raise ValueError(
            f"{text!r}: give [HOST:]PORT, a port from 0 (any free one) to 65535 (e.g. 9400 or 0.0.0.0:9400)"
        )
    return host, int(port_text)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def beyond_loopback_warning(host: str, what: str) -> str | None:
    """A warning when `host` makes `what` reachable from other machines."""
    if is_loopback(host):
        return None
    return (
        f"warning: {what} is bound to {host}, reachable from other machines; anyone who can reach it reads it "
        "(use the default 127.0.0.1 with ssh -L, or a firewall)"
    )


def _gauge(name: str, documentation: str, labels: list[str], unit: str = "") -> Any:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(f"{PREFIX}_{name}", documentation, labels=labels, unit=unit)


LABELS = ["rank", "gpu", "UUID", "Hostname", "job", "run_id"]


def _counter(name: str, documentation: str, unit: str) -> Any:
    from prometheus_client.core import CounterMetricFamily

    return CounterMetricFamily(f"{PREFIX}_{name}", documentation, labels=LABELS, unit=unit)


def metric_families(snapshots: Iterable[RankSnapshot], *, hostname: str, job: str) -> list[Any]:
    """The metric families of `snapshots`: each a gauge with one sample per rank (per band, phase or status)."""
    families = {
        "bands": _gauge(
            "memory_band",
            "GPU memory of one band of the anatomy at one moment (the end of a forward "
            "pass), bytes; the used bands add up to the device's used memory",
            [*LABELS, "band"],
            "bytes",
        ),
        "gradients": _gauge(
            "gradients_after_backward", "The gradients' size after backward (not part of the stack)", LABELS, "bytes"
        ),
        "used": _gauge("gpu_memory_used", "Device memory used, as NVML reads it", LABELS, "bytes"),
        "total": _gauge("gpu_memory_total", "Device memory in all", LABELS, "bytes"),
        "util": _gauge("gpu_utilization_percent", "NVML's GPU utilization of the rank's GPU", LABELS),
        "sm_active": _gauge("sm_active_percent", "NVML GPM: share of time the GPU's SMs had a warp resident", LABELS),
        "tensor_active": _gauge(
            "tensor_active_percent", "NVML GPM: share of time the GPU's tensor pipes were active", LABELS
        ),
        "dram": _gauge("dram_bandwidth_percent", "NVML GPM: the GPU's DRAM bandwidth used, of its peak", LABELS),
        "power": _gauge("gpu_power", "NVML's power draw of the rank's GPU", LABELS, "watts"),
        "energy": _counter("gpu_energy", "NVML's energy counter of the rank's GPU, since the driver loaded", "joules"),
        "sm_clock": _gauge("sm_clock", "The GPU's SM clock now", LABELS, "hertz"),
        "throttled": _gauge(
            "clocks_throttled", "1 while something slows the GPU's clocks (power, heat), else 0", LABELS
        ),
        "throttle_reason": _gauge(
            "clocks_throttle_reason", "1 for each reason the GPU's clocks are slowed now", [*LABELS, "reason"]
        ),
        "joules_per_sample": _gauge(
            "energy_per_sample",
            "Energy a training sample cost: the ended run's steady power over its steady rate (its result's)",
            LABELS,
            "joules",
        ),
        "step": _gauge("step", "The latest optimizer step", LABELS),
        "total_steps": _gauge("total_steps", "Steps the run will train", LABELS),
        "samples": _gauge("samples_per_second", "Training samples per second, the latest steps", LABELS),
        "tokens": _gauge("tokens_per_second", "Training tokens per second, the latest steps", LABELS),
        "tflops": _gauge("achieved_tflops", "Model TFLOP/s achieved (6·params·tokens and attention)", LABELS),
        "mfu": _gauge("mfu_ratio", "Model FLOPs utilization: achieved over the GPUs' dense peak", LABELS),
        "phases": _gauge(
            "step_phase",
            "Mean seconds of the latest steps by phase, on the training loop's thread",
            [*LABELS, "phase"],
            "seconds",
        ),
        "loss": _gauge("loss", "The latest loss the training loop logged", LABELS),
        "learning_rate": _gauge("learning_rate", "The learning rate the training loop logged with its loss", LABELS),
        "grad_norm": _gauge("grad_norm", "The gradients' total norm the training loop logged with its loss", LABELS),
        "predicted": _gauge("predicted_peak", "gpuanat's predicted peak GPU memory for the run", LABELS, "bytes"),
        "status": _gauge(
            "run_status", "1 for the run's status now (training, ok, stopped, failed, oom)", [*LABELS, "status"]
        ),
        "info": _gauge(
            "run_info", "1, with the run's model and techniques as labels", [*LABELS, "model", "techniques"]
        ),
    }
    for snapshot in snapshots:
        labels = [
            str(snapshot.rank),
            "" if snapshot.gpu_index is None else str(snapshot.gpu_index),
            snapshot.gpu_uuid or "",
            hostname,
            job,
            snapshot.run_id,
        ]
        for band, band_bytes in snapshot.bands.items():
            if band_bytes is not None:
                families["bands"].add_metric([*labels, band.removesuffix("_bytes")], band_bytes)
        for key, value in (
            ("gradients", snapshot.gradients_after_backward_bytes),
            ("used", snapshot.device_used_bytes),
            ("total", snapshot.device_total_bytes),
            ("util", snapshot.gpu_util_percent),
            ("sm_active", snapshot.sm_active_percent),
            ("tensor_active", snapshot.tensor_active_percent),
            ("dram", snapshot.dram_bandwidth_percent),
            ("power", snapshot.power_w),
            ("energy", snapshot.energy_joules),
            ("sm_clock", None if snapshot.sm_clock_mhz is None else snapshot.sm_clock_mhz * 1e6),
            ("throttled", None if snapshot.throttle_reasons is None else int(bool(snapshot.throttle_reasons))),
            ("joules_per_sample", snapshot.joules_per_sample),
            ("step", snapshot.step),
            ("total_steps", snapshot.total_steps),
            ("samples", snapshot.samples_per_second),
            ("tokens", snapshot.tokens_per_second),
            ("tflops", snapshot.achieved_tflops),
            ("mfu", snapshot.mfu),
            ("loss", snapshot.loss),
            ("learning_rate", snapshot.learning_rate),
            ("grad_norm", snapshot.grad_norm),
            ("predicted", snapshot.predicted_peak_bytes),
        ):
            if value is not None:
                families[key].add_metric(labels, value)
        for reason in snapshot.throttle_reasons or ():
            families["throttle_reason"].add_metric([*labels, reason], 1)
        for phase, seconds in snapshot.step_phase_seconds.items():
            families["phases"].add_metric([*labels, phase], seconds)
        families["status"].add_metric([*labels, snapshot.status], 1)
        families["info"].add_metric([*labels, snapshot.model or "", snapshot.techniques or ""], 1)
    return list(families.values())


class MetricsServer:
    """An HTTP endpoint (`prometheus-client`'s) that asks `snapshots()` at every scrape."""

    def __init__(
        self,
        address: tuple[str, int],
        snapshots: Callable[[], list[RankSnapshot]],
        *,
        job: str,
        hostname: str | None = None,
    ) -> None:
        from prometheus_client import CollectorRegistry, start_http_server

        self.host, self.port = address
        self._snapshots = snapshots
        self.job, self.hostname = job, hostname or socket.gethostname()
        self._lock = threading.Lock()
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        self._server, self._thread = start_http_server(self.port, addr=self.host, registry=registry)
        self.port = self._server.server_port

    def collect(self) -> Iterable[Any]:
        with self._lock:  # one scrape at a time: the sources read live state
            try:
                snapshots = self._snapshots()
            except Exception:  # a scrape must never break the run it reads
                snapshots = []
            return metric_families(snapshots, hostname=self.hostname, job=self.job)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
