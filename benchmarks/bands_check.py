"""Do the bands add up to NVML's device memory used at every step record? Read from a history database.

For every step record of every recorded run, NVML's device and per-process memory at that moment: read by
the training process itself right after torch's reserved memory, on the steps the probe measures and
whenever reserved memory changed; else the parent's NVML sample nearest in time among those taken while
reserved memory had the record's value (from the end of the first step that had it to the end of the last;
the child stamps each step with time.monotonic(), which Linux shares between processes, and the sampler
stamps its samples with it); else, when no sample fell in that window, the training process's reading at
the window's start. Then:

- the bands as gpuanat shows them (`assemble_bands`) — other processes (device used - this process), CUDA
  context (this process - torch reserved), weights, the gradients and optimizer state alive at the end of
  forward (no optimizer state in step 1), activations (the probe's last exact measurement), temporaries &
  cache (reserved - those) — must all be >= 0;
- their sum equals device used by construction, because context and cache are differences. The part that
  can fail is whether every byte of the process is torch's allocator or a *fixed* context: so the check
  takes the context once (median over the run) and reports |other + context + reserved - device used|
  / device used at every step record. Over 1% means something else allocates device memory (a library
  outside torch's allocator, context growth), or the readings are too far apart in time.

    python benchmarks/bands_check.py HISTORY.sqlite --out bands_check.json

The results and records users read get the same check, one moment each (`stack_problems`): every band of a
`run --json` result, each of its ranks, and each `watch --json` record must be >= 0, and the used bands must sum to
the device used beside them within 1%; the gradients' own maximum after backward (`gradients_after_backward_bytes`)
is of another moment and must not be in the stack (the gradients band is what is alive at the end of forward, never
more than that maximum).

    python benchmarks/bands_check.py --results RESULT.json RECORDS.jsonl ... --out bands_results.json
"""

from __future__ import annotations

import argparse
import bisect
import json
import statistics
from pathlib import Path
from typing import Any

from gpuanat.core.measure.anatomy import (
    STACK_TOLERANCE_PERCENT as TOLERANCE_PERCENT,
)
from gpuanat.core.measure.anatomy import (
    assemble_bands,
    bands_of_one_moment,
    stack_problems,
    stack_sum_error_percent,
)
from gpuanat.core.measure.samples import Sample
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.protocol import probe_bands_from_json


def _read_by_child(step: dict[str, Any]) -> bool:
    return step.get("nvml_device_used_bytes") is not None and step.get("nvml_process_used_bytes") is not None


def _child_reading(reading_step: dict[str, Any], step: dict[str, Any], read_by: str) -> dict[str, Any]:
    return {
        "nvml_read_by": read_by,
        "gap_s": reading_step["monotonic_s"] - step["monotonic_s"],
        "device_used_bytes": reading_step["nvml_device_used_bytes"],
        "process_used_bytes": reading_step["nvml_process_used_bytes"],
    }


def _sampler_reading(sample: Sample, step: dict[str, Any], pid: int, read_by: str) -> dict[str, Any]:
    return {
        "nvml_read_by": read_by,
        "gap_s": sample.t_s - step["monotonic_s"],
        "device_used_bytes": sample.gpus[0].used_bytes,
        "process_used_bytes": sample.process_used_bytes([pid]),
    }


def check_run(store: HistoryStore, run_id: int, pid: int) -> dict[str, Any] | None:
    samples = [Sample.from_json(sample) for sample in store.samples(run_id)]
    samples = [sample for sample in samples if sample.gpus and sample.process_used_bytes([pid]) is not None]
    steps = [step for step in store.steps(run_id) if step.get("monotonic_s") and step.get("reserved_bytes")]
    if not samples or not steps:
        return None
    times = [sample.t_s for sample in samples]
    # Runs of consecutive steps with the same reserved memory: within one, the readings all describe one state.
    window_of: dict[int, tuple[float, float, dict[str, Any]]] = {}
    start = 0
    for index in range(1, len(steps) + 1):
        if index == len(steps) or steps[index]["reserved_bytes"] != steps[start]["reserved_bytes"]:
            for step in steps[start:index]:
                window_of[step["step"]] = (steps[start]["monotonic_s"], steps[index - 1]["monotonic_s"], steps[start])
            start = index
    bands = None
    records = []
    for step in steps:
        bands = step.get("bands") or bands
        record: dict[str, Any] = {"step": step["step"], "reserved_bytes": step["reserved_bytes"]}
        window_start_s, window_end_s, first = window_of[step["step"]]
        in_window = range(bisect.bisect_left(times, window_start_s), bisect.bisect_right(times, window_end_s))
        if _read_by_child(step):
            record.update(_child_reading(step, step, "training process"))
        elif in_window:
            nearest = min(in_window, key=lambda i: abs(times[i] - step["monotonic_s"]))
            record.update(_sampler_reading(samples[nearest], step, pid, "sampler"))
        elif _read_by_child(first):
            same_state = f"training process at step {first['step']}, same reserved memory"
            record.update(_child_reading(first, step, same_state))
        else:  # an older probe's run: no reading of this state at all; the nearest sample, flagged
            index = bisect.bisect_left(times, step["monotonic_s"])
            nearest = min(
                (i for i in (index - 1, index) if 0 <= i < len(samples)),
                key=lambda i: abs(times[i] - step["monotonic_s"]),
            )
            record.update(_sampler_reading(samples[nearest], step, pid, "sampler, outside the window"))
        # The bands as gpuanat shows them, from the probe's last exact measurement and this reading.
        memory = assemble_bands(
            probe_bands_from_json(bands) if bands else None,
            reserved_bytes=step["reserved_bytes"],
            device_used_bytes=record["device_used_bytes"],
            device_total_bytes=None,
            process_used_bytes=record["process_used_bytes"],
        )
        record["other_processes_bytes"] = memory.other_processes_bytes
        record["cuda_context_bytes"] = memory.cuda_context_bytes
        if memory.temporaries_and_cache_bytes is not None:
            record["temporaries_and_cache_bytes"] = memory.temporaries_and_cache_bytes
        records.append(record)
    context = statistics.median(record["cuda_context_bytes"] for record in records)
    for record in records:
        fixed_sum = record["other_processes_bytes"] + context + record["reserved_bytes"]
        record["fixed_context_error_percent"] = (
            100.0 * (fixed_sum - record["device_used_bytes"]) / record["device_used_bytes"]
        )
        record["negative_bands"] = [
            name
            for name in ("other_processes_bytes", "cuda_context_bytes", "temporaries_and_cache_bytes")
            if record.get(name, 0) < 0
        ]
    errors = [abs(record["fixed_context_error_percent"]) for record in records]
    return {
        "run_id": run_id,
        "step_records": len(records),
        "cuda_context_median_bytes": context,
        "cuda_context_range_bytes": [
            min(r["cuda_context_bytes"] for r in records),
            max(r["cuda_context_bytes"] for r in records),
        ],
        "max_abs_error_percent": max(errors),
        "within_tolerance": sum(error <= TOLERANCE_PERCENT for error in errors),
        "max_abs_gap_s": max(abs(record["gap_s"]) for record in records),
        "records_by_reading": {
            reading: sum(record["nvml_read_by"] == reading for record in records)
            for reading in sorted({record["nvml_read_by"] for record in records})
        },
        "records_with_negative_bands": sum(bool(record["negative_bands"]) for record in records),
        "records": records,
    }


def _json_entries(path: Path) -> list[dict[str, Any]]:
    """The results and records in a file: one JSON document (a result, or a list of them) or JSON lines."""
    text = path.read_text()
    try:
        loaded = json.loads(text)
        documents = loaded if isinstance(loaded, list) else [loaded]
    except ValueError:
        documents = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [
        bands_of_one_moment(document) for document in documents if isinstance(document, dict) and document.get("bands")
    ]


def check_results(paths: list[Path]) -> dict[str, Any]:
    """Every result and record with bands in `paths`: the ones that add up, and why the others do not."""
    checked, problems, errors = 0, [], []
    for path in paths:
        for index, entry in enumerate(_json_entries(path)):
            checked += 1
            problems.extend(stack_problems(entry, f"{path.name}[{index}]"))
            error = stack_sum_error_percent(entry)
            if error is not None:
                errors.append(error)
    return {
        "checked": checked,
        "with_device_used": len(errors),
        "max_abs_error_percent": max(map(abs, errors)) if errors else None,
        "problems": problems,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("db", type=Path, nargs="?")
    parser.add_argument(
        "--results",
        type=Path,
        nargs="+",
        default=[],
        help="JSON results (run --json) and JSON-lines records (watch --json) to check instead",
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.results:
        report = check_results(args.results)
        print(
            f"{report['checked']} results and records with bands; {report['with_device_used']} beside a device "
            f"reading, max |sum - used| {report['max_abs_error_percent']}%; {len(report['problems'])} problems"
        )
        for problem in report["problems"]:
            print(f"  {problem}")
        args.out.write_text(json.dumps(report, indent=1))
        raise SystemExit(1 if report["problems"] else 0)
    if args.db is None:
        parser.error("give a history database, or --results FILE ...")
    report = []
    with HistoryStore(args.db, read_only=True) as store:
        for run in reversed(store.runs()):
            pid = run.environment.get("pid")
            checked = check_run(store, run.id, pid) if pid else None
            if checked is None:
                continue
            checked["name"] = run.name
            report.append(checked)
            print(
                f"run {run.id} {run.name!r}: {checked['within_tolerance']}/{checked['step_records']} step records "
                f"within {TOLERANCE_PERCENT}%, max error {checked['max_abs_error_percent']:.2f}%, context "
                f"{checked['cuda_context_range_bytes'][0] / 2**20:.0f}-"
                f"{checked['cuda_context_range_bytes'][1] / 2**20:.0f} MiB, "
                f"max gap {checked['max_abs_gap_s']:.2f} s, "
                f"NVML read by {checked['records_by_reading']}, "
                f"{checked['records_with_negative_bands']} with a negative band"
            )
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
