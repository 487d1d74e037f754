"""The operations anatomy as text: the table `gpuanat run` prints (and the dashboard's panel shows) — each kind of
operation's share of the profiled device time and of the FLOPs, achieved TFLOP/s and GB/s, beside the paper's
BERT-large shares — and the line saying what profiling cost. Kernel names come from the user's code (a Triton
kernel is named after its model's operators): shown through `printable`. Plain Python.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from gpuanat.core.operations.anatomy import PAPER_SOURCE, table_rows
from gpuanat.core.operations.classify import kernel_function
from gpuanat.core.printable import printable


def percent(share: float | None, digits: int = 1) -> str:
    return "—" if share is None else f"{100 * share:.{digits}f}%"


def rate(value: float | None) -> str:
    return "—" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"


def heading(anatomy: Mapping[str, Any]) -> str:
    """What was profiled: steps, where, the device time against the wall time."""
    steps, first = anatomy.get("profiled_steps"), anatomy.get("first_step")
    device_time_s, wall_s = anatomy.get("device_time_s") or 0.0, anatomy.get("wall_s") or 0.0
    busy = anatomy.get("busy_share")
    where = (
        f"{1000 * device_time_s:.1f} ms of GPU kernels and copies in {1000 * wall_s:.1f} ms"
        + (f" ({percent(busy, 0)} busy)" if busy is not None else "")
        if anatomy.get("device") == "cuda"
        else f"{1000 * device_time_s:.1f} ms of CPU operators' own time"
    )
    return f"Operations: {steps} profiled steps from step {first}, {where}"


def table_lines(anatomy: Mapping[str, Any]) -> list[str]:
    """The table, a line a kind of operation, with a header line; the paper's columns are its BERT-large figures; the
    top kernel by its function's name (the JSON has the whole)."""
    lines = [
        f"  {'kind':<20} {'time':>7} {'FLOPs':>7} {'TFLOP/s':>8} {'GB/s':>7}   "
        f"{'paper time':>10} {'FLOPs':>7}  top kernel"
    ]
    for row in table_rows(anatomy):
        top = printable(kernel_function(row["top_kernel"]))[:60] if row["top_kernel"] else "—"
        lines.append(
            f"  {row['label']:<20} {percent(row['time_share']):>7} {percent(row['flop_share'], 2):>7} "
            f"{rate(row['tflops_per_s']):>8} {rate(row['gb_per_s']):>7}   "
            f"{percent(row['paper_time_share']):>10} {percent(row['paper_flop_share'], 2):>7}  {top}"
        )
    return lines


def cost_line(anatomy: Mapping[str, Any]) -> str:
    """What profiling took, and where the trace went."""
    line = (
        f"  Profiling: the profiled steps took {anatomy.get('wall_s') or 0:.2f} s wall and were left out of the "
        f"steady samples/s; reading the profile took {anatomy.get('processing_s') or 0:.2f} s. "
        f"Paper: {PAPER_SOURCE}."
    )
    if anatomy.get("trace_path"):
        line += f" Trace: {printable(anatomy['trace_path'])}"
    elif anatomy.get("trace_error"):
        line += f" The trace was not written: {printable(anatomy['trace_error'])}"
    return line


def summary_lines(anatomy: Mapping[str, Any] | None) -> list[str]:
    """Everything `gpuanat run` prints of a run's operations anatomy; nothing when it was not profiled."""
    if not isinstance(anatomy, Mapping):
        return []
    return [heading(anatomy), *table_lines(anatomy), cost_line(anatomy)]
