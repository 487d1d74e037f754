"""Build the allocation templates that `gpuanat predict` replays, from traces recorded by allocation_trace.py.

For each configuration recorded at several batch sizes: the template (every allocation's size a line in the batch
size, `gpuanat.core.memory.allocator.build_template`) goes to gpuanat/data/allocation/, with the memory the
allocator could reserve on the GPU it was recorded on: the device's free memory plus the run's reserved memory when
its trace was written, the largest of any run of the same precision (fp32, or mixed). Runs recorded alongside others
only read less (their memory is not free); on the H100 the largest readings agree across optimizers, attention and
accumulation to 0.1 MiB, and differ by precision (mixed precision loads 16 MiB more kernels). Checks, printed and
written to --report:
- the replay is faithful: each recorded run's own requests, replayed, reserve the same segments in the same order
  and peak at the same allocated and reserved bytes as the run did;
- the sizes are lines: the template, the line through the two largest batches, gives every size of the smaller
  batches exactly (the allocations that differ are counted).

    python benchmarks/build_allocation_templates.py TRACES_DIR --gpu-memory-bytes N --torch V --transformers V
        --gpu NAME [--out gpuanat/data/allocation] [--report R.json]
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

from gpuanat.core.memory.allocation_templates import TEMPLATES_DIR, template_name
from gpuanat.core.memory.allocator import build_template, replay, requests_of


def load(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rt") as file:
        return json.load(file)


def faithful(trace: dict[str, Any], capacity_bytes: int) -> dict[str, Any]:
    requests = requests_of(trace["events"])
    replayed = replay(requests.operations, requests.sizes, capacity_bytes)
    recorded_segments = [size for action, _address, size, _stream in trace["events"] if action == "segment_alloc"]
    return {
        "batch_size": trace["batch_size"],
        "same_segments": list(replayed.reservations) == recorded_segments,
        "segments": len(recorded_segments),
        "peak_allocated_difference_bytes": replayed.peak_allocated_bytes - trace["peak_allocated_bytes"],
        "peak_reserved_difference_bytes": replayed.peak_reserved_bytes - trace["peak_reserved_bytes"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("traces", type=Path)
    parser.add_argument("--out", type=Path, default=TEMPLATES_DIR)
    parser.add_argument("--report", type=Path)
    parser.add_argument(
        "--gpu-memory-bytes",
        type=int,
        required=True,
        help="the recording GPU's memory as NVML reports it (the H100 80GB HBM3: 85520809984)",
    )
    parser.add_argument("--gpu", required=True, help="the recording GPU's name, as NVML gives it")
    parser.add_argument("--torch", required=True, help="the recording torch's version (torch.__version__)")
    parser.add_argument("--transformers", required=True, help="the recording transformers' version")
    args = parser.parse_args()
    traces = [load(path) for path in sorted(args.traces.glob("*.json.gz"))]
    capacities: dict[bool, int] = {}
    for trace in traces:
        mixed = trace["overrides"].get("precision", "fp32") != "fp32"
        reading = trace["device"]["device_free_bytes"] + trace["device"]["reserved_bytes"]
        capacities[mixed] = max(capacities.get(mixed, 0), reading)
    by_config: dict[str, list[dict[str, Any]]] = {}
    for trace in traces:
        if trace["status"] == "ok":
            by_config.setdefault(json.dumps(trace["overrides"], sort_keys=True), []).append(trace)
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"capacity_bytes": {"fp32": capacities[False], "mixed": capacities[True]}, "templates": []}
    for key, recorded in sorted(by_config.items()):
        recorded.sort(key=lambda trace: trace["batch_size"])
        if len(recorded) < 2:
            print(f"{key}: recorded at one batch size only, no template", flush=True)
            continue
        template = build_template({trace["batch_size"]: requests_of(trace["events"]) for trace in recorded})
        lines_checked = {}
        for trace in recorded[:-2]:
            sizes = requests_of(trace["events"]).sizes
            predicted = template.sizes(trace["batch_size"])
            lines_checked[trace["batch_size"]] = sum(a != b for a, b in zip(sizes, predicted, strict=True))
        config = recorded[0]["config"]
        capacity_bytes = capacities[config["precision"] != "fp32"]
        name = template_name(config)
        document = {
            "config": config,
            "recorded_batch_sizes": list(template.recorded_batch_sizes),
            "gpu_memory_bytes": args.gpu_memory_bytes,
            "recorded_with": {"gpu": args.gpu, "torch": args.torch, "transformers": args.transformers},
            "capacity_bytes": capacity_bytes,
            "operations": list(template.operations),
            "base_bytes": list(template.base_bytes),
            "per_sample_bytes": list(template.per_sample_bytes),
        }
        with gzip.open(args.out / name, "wt") as file:
            json.dump(document, file, separators=(",", ":"))
        entry = {
            "overrides": json.loads(key),
            "file": name,
            "allocations": len(template.base_bytes),
            "sizes_off_the_line": lines_checked,
            "replay_of_each_run": [faithful(trace, capacity_bytes) for trace in recorded],
        }
        report["templates"].append(entry)
        print(
            f"{key}: {entry['allocations']} allocations; off the line {lines_checked}; faithful "
            f"{[run['same_segments'] for run in entry['replay_of_each_run']]}",
            flush=True,
        )
    if args.report:
        args.report.write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
