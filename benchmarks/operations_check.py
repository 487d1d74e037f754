"""One profiled run's operations anatomy checked against its own Chrome trace, for operations_check.sh: the GPU time
of every kernel, memory copy and memset in the trace the profiler wrote (`--profile-ops-trace`), summed here from the
trace's JSON independently of gpuanat's reading of the profile, against the `device_time_s` the groups share; the
groups' shares summed; and the table. The result is appended to a JSON-lines file with the check's name and the
trace's figures.

    python3 benchmarks/operations_check.py RESULT_OUTPUT TRACE.json NAME RESULTS.jsonl

RESULT_OUTPUT is `gpuanat run --json`'s stdout (its last line is the result).
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from gpuanat.core.operations.anatomy import shares_sum_error_percent
from gpuanat.core.operations.report import summary_lines

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")


def trace_device_time_s(trace: Path) -> tuple[float, dict[str, float]]:
    """Σ durations of the trace's device events, and that sum by category."""
    events = json.loads(trace.read_text()).get("traceEvents", [])
    by_category: Counter[str] = Counter()
    for event in events:
        if event.get("ph") == "X" and event.get("cat") in DEVICE_CATEGORIES:
            by_category[event["cat"]] += float(event.get("dur", 0)) / 1e6
    return sum(by_category.values()), dict(by_category)


def main() -> None:
    output, trace, name, results = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    lines = output.read_text(errors="replace").strip().splitlines() if output.exists() else []
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        print(f"{name}: no result")
        return
    anatomy = result.get("operations_anatomy")
    check: dict = {"check": name}
    if anatomy and trace.is_file():
        trace_s, by_category = trace_device_time_s(trace)
        check.update(
            trace_device_time_s=trace_s,
            trace_by_category_s=by_category,
            device_time_vs_trace_percent=100 * (anatomy["device_time_s"] - trace_s) / trace_s if trace_s else None,
        )
    with results.open("a") as kept:
        kept.write(json.dumps({**result, **check}) + "\n")
    print(
        f"== {name}: {result['status']}, steady {result.get('steady_samples_per_second')} samples/s, "
        f"MFU {result.get('mfu')}"
    )
    if not anatomy:
        print("   no operations anatomy")
        return
    print(
        f"   groups' shares sum off by {shares_sum_error_percent(anatomy)}%; device time "
        f"{anatomy['device_time_s']:.4f} s, trace {check.get('trace_device_time_s')} s "
        f"({check.get('device_time_vs_trace_percent')}%) {check.get('trace_by_category_s')}"
    )
    for text in summary_lines(anatomy):
        print("   " + text)
    for group in ("contractions", "normalizations", "elementwise", "optimizer", "memory_copies", "other"):
        for kernel in anatomy[group]["top_kernels"]:
            print(
                f"   {group:<15} {100 * (kernel['time_share'] or 0):5.1f}% {kernel['calls']:>6} "
                f"{(kernel['op'] or '-')[:40]:<40} {kernel['name'][:110]}"
            )


if __name__ == "__main__":
    main()
