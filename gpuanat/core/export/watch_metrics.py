"""The metrics of a watched process tree (`gpuanat watch PID --metrics`): its latest record, rank by rank, with the
activity, power, energy, clock and throttle readings of each rank's GPU.

Each publishing process (each rank of a torchrun job) gives one rank's series, with the bands the record computed for
it; a tree that publishes nothing gives its GPU memory and utilization alone. Plain Python: no torch, no UI.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from gpuanat.core.export.metrics import RankSnapshot


class WatchMetrics:
    """The latest watch record, as `RankSnapshot`s; `uuids` maps NVML indices to GPU UUIDs."""

    def __init__(self, uuids: Mapping[int, str] | None = None) -> None:
        self._lock = threading.Lock()
        self._record: dict[str, Any] | None = None
        self._uuids = dict(uuids or {})

    def observe(self, record: Mapping[str, Any]) -> None:
        with self._lock:
            self._record = dict(record)

    def snapshots(self) -> list[RankSnapshot]:
        with self._lock:
            record = self._record
        if record is None:
            return []
        gpus = {entry["index"]: entry for entry in record.get("gpus") or []}
        status = "training" if not record.get("exited") else "ended"
        ranks = record.get("ranks") or []
        if not ranks:  # nothing published: the tree's GPU as NVML sees it
            used = next((entry for entry in gpus.values() if entry.get("uses_it")), None)
            ranks = [
                {
                    "rank": 0,
                    "gpu_index": used["index"] if used else None,
                    "bands": record.get("bands") or {},
                    "step": record.get("step"),
                    "used_bytes": used["used_bytes"] if used else None,
                    "total_bytes": used["total_bytes"] if used else None,
                    "gradients_after_backward_bytes": record.get("gradients_after_backward_bytes"),
                }
            ]
        snapshots = []
        for entry in ranks:
            index = entry.get("gpu_index")
            gpu = gpus.get(index) or {}
            first = entry["rank"] == ranks[0]["rank"]
            snapshots.append(
                RankSnapshot(
                    rank=entry["rank"],
                    run_id=str(record.get("saved_run_id") or ""),
                    status=status,
                    gpu_index=index,
                    gpu_uuid=self._uuids.get(index) if index is not None else None,
                    gpu_name=gpu.get("name"),
                    bands=entry.get("bands") or {},
                    gradients_after_backward_bytes=entry.get("gradients_after_backward_bytes"),
                    device_used_bytes=entry.get("used_bytes"),
                    device_total_bytes=entry.get("total_bytes"),
                    gpu_util_percent=gpu.get("device_util_percent"),
                    sm_active_percent=gpu.get("sm_active_percent"),
                    tensor_active_percent=gpu.get("tensor_active_percent"),
                    dram_bandwidth_percent=gpu.get("dram_bandwidth_percent"),
                    power_w=gpu.get("power_w"),
                    energy_joules=gpu["energy_mj"] / 1000.0 if gpu.get("energy_mj") is not None else None,
                    sm_clock_mhz=gpu.get("sm_clock_mhz"),
                    throttle_reasons=tuple(gpu["throttle_reasons"]) if "throttle_reasons" in gpu else None,
                    step=entry.get("step"),
                    total_steps=record.get("total_steps"),
                    samples_per_second=record.get("samples_per_second") if first else None,
                    # what the watched loop logged: its first rank's, as its samples/s
                    loss=record.get("loss") if first else None,
                    learning_rate=record.get("learning_rate") if first else None,
                    grad_norm=record.get("grad_norm") if first else None,
                )
            )
        return snapshots
