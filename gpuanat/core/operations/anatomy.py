"""A profiled run's operations anatomy (`operations_anatomy` in its result): each group's share of the profiled
device time and of the FLOPs, achieved TFLOP/s and GB/s, top kernels — and the paper's BERT-large figures beside it.

The shares are of the sum of every profiled kernel's and memory copy's duration (`device_time_s`; on a CPU run, of
every operator's own time), so the groups add up to it by construction; `busy_share` says how much of the profiled
steps' wall time the device was busy (kernels on several streams can overlap, memory copies too). Plain Python.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypedDict

from gpuanat.core.operations.classify import GROUP_LABELS, GROUPS
from gpuanat.core.vocabulary.protocol import KernelRow, Operations

PAPER = {"contractions": (0.9980, 0.610), "normalizations": (0.0017, 0.255), "elementwise": (0.0003, 0.135)}
"""(FLOP share, runtime share) of BERT-large's encoder in training, Ivanov et al., "Data Movement Is All You Need: A
Case Study on Optimizing Transformers" (MLSys 2021), Table 1 (PyTorch on a V100), as the HF "Model training anatomy"
page cites it."""
PAPER_SOURCE = "Ivanov et al. 2020, BERT-large, PyTorch on a V100"
TOP_KERNELS = 5
"""Kernels named for each group."""


class _GroupTotals(TypedDict):
    """One group's sums over the profile's rows."""

    time_s: float
    calls: int
    flops: float
    bytes: float
    uncounted_time_s: float
    """Time of the rows whose FLOPs are not known."""
    rows: list[KernelRow]


def operations_anatomy(event: Operations) -> dict[str, Any]:
    """The JSON of a run's `operations_anatomy`: one entry a group (`GROUPS`) and the profile's own figures."""
    totals: dict[str, _GroupTotals] = {
        group: {"time_s": 0.0, "calls": 0, "flops": 0.0, "bytes": 0.0, "uncounted_time_s": 0.0, "rows": []}
        for group in GROUPS
    }
    for row in event.kernels:
        entry = totals[row.group if row.group in GROUPS else "other"]
        entry["time_s"] += row.time_s
        entry["calls"] += row.calls
        entry["flops"] += row.flops or 0.0
        entry["bytes"] += row.bytes or 0.0
        if row.flops is None:
            entry["uncounted_time_s"] += row.time_s
        entry["rows"].append(row)
    device_time_s = sum(entry["time_s"] for entry in totals.values())
    flops = sum(entry["flops"] for entry in totals.values())
    anatomy: dict[str, Any] = {}
    for group, entry in totals.items():
        time_s = entry["time_s"]
        rows = sorted(entry["rows"], key=lambda row: row.time_s, reverse=True)[:TOP_KERNELS]
        anatomy[group] = {
            "time_share": time_s / device_time_s if device_time_s > 0 else None,
            "flop_share": (
                entry["flops"] / flops if flops > 0 and (entry["flops"] or not entry["uncounted_time_s"]) else None
            ),
            "time_s": time_s,
            "calls": entry["calls"],
            "flops": entry["flops"],
            "tflops_per_s": entry["flops"] / time_s / 1e12 if time_s > 0 and entry["flops"] else None,
            "bytes": entry["bytes"] or None,
            "gb_per_s": entry["bytes"] / time_s / 1e9 if time_s > 0 and entry["bytes"] else None,
            "uncounted_flops_time_share": entry["uncounted_time_s"] / time_s if time_s > 0 else None,
            "top_kernels": [
                {
                    "name": row.name,
                    "op": row.op,
                    "calls": row.calls,
                    "time_s": row.time_s,
                    "time_share": row.time_s / device_time_s if device_time_s > 0 else None,
                }
                for row in rows
            ],
        }
    anatomy.update(
        {
            "profiled_steps": event.profiled_steps,
            "first_step": event.first_step,
            "source": "torch.profiler",
            "device": event.device,
            "unit": "GPU kernels and memory copies" if event.device == "cuda" else "CPU operators' own time",
            "device_time_s": device_time_s,
            "wall_s": event.wall_s,
            "busy_share": device_time_s / event.wall_s if event.wall_s > 0 and event.device == "cuda" else None,
            "processing_s": event.processing_s,
            "flops": flops,
            "trace_path": event.trace_path,
            "trace_error": event.trace_error,
            "kernels": [dataclasses.asdict(row) for row in event.kernels],
        }
    )
    return anatomy


def kernel_rows(anatomy: Mapping[str, Any]) -> list[KernelRow]:
    """The profile's kernel rows back from a result's `operations_anatomy` (rows that do not read are skipped)."""
    rows = []
    for data in anatomy.get("kernels") or []:
        try:
            rows.append(KernelRow.from_json(data))
        except (TypeError, ValueError, AttributeError):
            continue
    return rows


def group_share(anatomy: Mapping[str, Any] | None, group: str, key: str = "time_share") -> float | None:
    """One group's share (`key`: "time_share" or "flop_share") in `anatomy`, None when absent or unreadable."""
    if not isinstance(anatomy, Mapping):
        return None
    entry = anatomy.get(group)
    value = entry.get(key) if isinstance(entry, Mapping) else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def shares_sum_error_percent(anatomy: Mapping[str, Any]) -> float | None:
    """How far the groups' time shares are from adding up to the profiled device time, in percent."""
    shares = [share for group in GROUPS if (share := group_share(anatomy, group)) is not None]
    if len(shares) < len(GROUPS):
        return None
    return 100 * abs(sum(shares) - 1)


def memory_bound_share(anatomy: Mapping[str, Any] | None) -> float | None:
    """The time share of normalizations and element-wise operators: the work that moves memory and barely computes,
    what fused kernels take away."""
    groups = ("normalizations", "elementwise")
    shares = [share for group in groups if (share := group_share(anatomy, group)) is not None]
    return None if len(shares) < len(groups) else sum(shares)


def table_rows(anatomy: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The anatomy as a table a view prints: a row a group with its label, measured shares, the paper's shares
    (None where the paper has no such group), TFLOP/s and GB/s, and its top kernel's name."""
    rows = []
    for group in GROUPS:
        found = anatomy.get(group)
        entry: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
        paper = PAPER.get(group)
        top = entry.get("top_kernels") or []
        rows.append(
            {
                "group": group,
                "label": GROUP_LABELS[group],
                "time_share": group_share(anatomy, group),
                "flop_share": group_share(anatomy, group, "flop_share"),
                "paper_time_share": paper[1] if paper else None,
                "paper_flop_share": paper[0] if paper else None,
                "tflops_per_s": entry.get("tflops_per_s"),
                "gb_per_s": entry.get("gb_per_s"),
                "time_s": entry.get("time_s"),
                "top_kernel": top[0].get("name") if top and isinstance(top[0], Mapping) else None,
            }
        )
    return rows
