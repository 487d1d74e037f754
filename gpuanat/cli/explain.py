"""`gpuanat explain [RUN]`: where a recorded run's memory was — at the allocation that failed for a run that ran out
of memory, else at its peak — by band and by module; of an out-of-memory run, what failed, how far over the GPU it
was, what the prediction said beforehand and by how much it missed, and what is predicted to fit, as a command to
paste. It reads the history (the last run by default; `--db` another box's) and never writes it; `--json` prints the
same as one JSON object, strings exact.

What is explained is computed in `core/measure/explain.py`; this module only prints it.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from gpuanat.cli.common import EXIT_OK, fail_usage, history_path, open_store
from gpuanat.cli.run_text import (
    band_lines,
    failure_sentence,
    fit_hint,
    module_lines,
    run_title,
    tensor_lines,
)
from gpuanat.core.measure.explain import Explanation, PredictionCheck, explain_run
from gpuanat.core.memory.fit_ladder import FitSuggestion
from gpuanat.core.printable import printable
from gpuanat.core.store.history import RunRow
from gpuanat.core.store.report import format_bytes
from gpuanat.core.vocabulary.config import RunConfig


def command_explain(args: argparse.Namespace) -> int:
    run_id = _run_id(args.run)
    db = printable(str(history_path(args)))
    with open_store(args, read_only=True) as store:
        last = store.runs(limit=1)
        row = store.run(run_id) if run_id is not None else (last[0] if last else None)
    if row is None and not last:
        fail_usage(f"explain: history {db} has no runs yet; record one with `gpuanat run`, or give another with --db")
    if row is None:
        fail_usage(
            f"explain: there is no run {run_id} in history {db} (its last is run {last[0].id}; `gpuanat history` "
            "lists them)"
        )
    explanation = explain_run(row.id, row.name, row.kind, row.status, row.result)
    command = fitting_command(explanation)
    if args.json:
        record = explanation.to_json()
        if record["would_fit"] is not None:
            record["would_fit"]["command"] = command
        print(json.dumps(record))
    else:
        print_explanation(explanation, row, command)
    return EXIT_OK


def _run_id(text: str | None) -> int | None:
    """RUN as a run's number; None (the last run) when not given."""
    if text is None:
        return None
    try:
        run_id = int(text)
    except ValueError:
        fail_usage(f"explain: RUN must be a run's number, as `gpuanat history` lists it (got {printable(text)})")
    if run_id < 1:
        fail_usage(f"explain: RUN must be a run's number ≥ 1 (got {run_id})")
    return run_id


def fitting_command(explanation: Explanation) -> str | None:
    """The run as a `gpuanat run` command with the fit ladder's flags predicted to fit added, else at the largest
    batch predicted to fit; None when neither is."""
    from gpuanat.core.run.tune.runs import run_command

    suggestion = explanation.would_fit
    if suggestion is None or not (suggestion.flags or suggestion.max_batch_size):
        return None
    config = RunConfig.from_json({key: value for key, value in explanation.config.items() if value is not None})
    if suggestion.max_batch_size:
        return run_command(config.replace(batch_size=suggestion.max_batch_size))
    return " ".join([run_command(config), *suggestion.flags])


def print_explanation(explanation: Explanation, row: RunRow, command: str | None) -> None:
    result = row.result
    print(run_title(result, row.id, row.status, row.kind))
    if row.name is not None:
        print(f"Name: {printable(row.name)}")
    if result.error is not None and row.status != "oom":
        print(f"  {printable(result.error.kind)}: {printable(result.error.message.split(chr(10))[0])}")
    failure = explanation.out_of_memory
    if failure is not None:
        _print_failure(explanation, failure)
    elif "out_of_memory" in explanation.missing:
        why = printable(explanation.missing["out_of_memory"])
        print(f"Out of memory; the failing allocation was not recorded: {why}.")
    at = "at its failure" if explanation.at == "failure" else "at its peak"
    print(f"Memory {at}, by band:")
    for line in band_lines(
        explanation.bands,
        explanation.why_bands_missing,
        explanation.gradients_after_backward_bytes,
        at_failure=explanation.at == "failure",
    ):
        print(line)
    if explanation.modules is not None:
        print(f"Memory {at}, by module:")
        for line in module_lines(explanation.modules):
            print(line)
    else:
        print(f"Memory {at}, by module: not recorded — {printable(explanation.missing['modules'])}.")
    tensors = failure.get("largest_tensors") if failure is not None else None
    if isinstance(tensors, list) and tensors:
        print("Largest live tensors at the failure:")
        for line in tensor_lines([tensor for tensor in tensors if isinstance(tensor, dict)]):
            print(line)
    _print_prediction(explanation.prediction, explanation.missing.get("prediction"), result.device_memory_total_bytes)
    if explanation.would_fit is not None:
        _print_would_fit(explanation.would_fit, command)
    elif "would_fit" in explanation.missing:
        print(f"What would fit: not predicted — {printable(explanation.missing['would_fit'])}.")
    snapshot = failure.get("snapshot_path") if failure is not None else None
    if snapshot:
        print(f"Out-of-memory snapshot: {printable(snapshot)} (drop it on pytorch.org/memory_viz)")


def _print_failure(explanation: Explanation, failure: dict[str, Any]) -> None:
    over = explanation.over_bytes
    if over is None:
        how_far = ""
    elif over > 0:
        how_far = f": {format_bytes(over)} more than the GPU had free"
    else:
        how_far = ": the GPU reported that much free, but the allocator could not have it in one piece"
    print(failure_sentence(failure) + how_far + ".")
    allocated, reserved, total = (
        failure.get(key) for key in ("allocated_bytes", "reserved_bytes", "device_total_bytes")
    )
    if allocated is not None or reserved is not None:
        print(
            f"  When it failed: {format_bytes(allocated)} allocated and {format_bytes(reserved)} reserved by torch, "
            f"of the GPU's {format_bytes(total)}."
        )


def _print_prediction(check: PredictionCheck | None, why_none: str | None, gpu_total_bytes: int | None) -> None:
    if check is None:
        print(f"Prediction before the run: none — {printable(why_none)}.")
        return
    device = (
        f" ({format_bytes(check.predicted_peak_device_bytes)} on the device with the CUDA context"
        + (f", of the GPU's {format_bytes(gpu_total_bytes)})" if gpu_total_bytes else ")")
        if check.predicted_peak_device_bytes is not None
        else ""
    )
    print(f"Prediction before the run: peak {format_bytes(check.predicted_peak_allocated_bytes)} allocated{device}.")
    measured, missed = check.measured_bytes, check.missed_bytes
    if measured is None or missed is None:
        print(f"  No measured peak to hold it against ({printable(check.why_not_measured or 'not measured')}).")
        return
    by = f"{format_bytes(abs(missed))} ({check.missed_percent:+.1f}%)" if check.missed_percent is not None else ""
    if not check.measured_is_a_floor:
        print(f"  Measured peak {format_bytes(measured)}: the prediction was {by} {'high' if missed > 0 else 'low'}.")
    elif missed >= 0:
        print(
            f"  The run failed having asked for {format_bytes(measured)} (allocated, and the allocation that failed), "
            f"the least its peak would have been: the prediction is {by} above that."
        )
    else:
        print(
            f"  The run failed having asked for {format_bytes(measured)} (allocated, and the allocation that failed): "
            f"the prediction was at least {by} too low."
        )


def _print_would_fit(suggestion: FitSuggestion, command: str | None) -> None:
    if command is not None and suggestion.max_batch_size:
        print(
            f"What would fit: no step of the fit ladder is predicted to fit this GPU; batch {suggestion.max_batch_size}"
            f" is (`gpuanat predict` with it shows why):\n  {printable(command)}"
        )
    elif command is not None:
        print(
            f"What would fit: add {' '.join(suggestion.flags)}, the fit ladder's cheapest step predicted to fit this "
            f"GPU (`gpuanat predict` with it shows why):\n  {printable(command)}"
        )
    elif suggestion.gpu_memory_bytes is None:
        print(f"What would fit: not predicted — no GPU's size to fit (a CPU run); {fit_hint(suggestion)}.")
    elif suggestion.not_predicted is not None:
        print(f"What would fit: not predicted here ({printable(suggestion.not_predicted)}); {fit_hint(suggestion)}.")
    elif suggestion.fits_as_is:
        print(
            "What would fit: the memory model predicts this run fits as it is, so it has no step to offer (it "
            f"missed); {fit_hint(suggestion)}."
        )
    else:
        print(f"What would fit: no step of the fit ladder is predicted to fit this GPU; {fit_hint(suggestion)}.")
