"""How a run reads on the command line, in `gpuanat run`'s summary and in `gpuanat explain`: its title, its memory
bands, memory by module, the allocation that failed, and what to change after running out of memory.

Every string from outside — a run's name, its script, module paths, operations, paths — is shown through
`printable`.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuanat.core.measure.anatomy import BAND_NAMES
from gpuanat.core.measure.failure import PHASE_WORDS
from gpuanat.core.memory.fit_ladder import FitSuggestion
from gpuanat.core.printable import printable
from gpuanat.core.store.report import MIB, format_bytes
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.protocol import MODULES_REST, NO_MODULE
from gpuanat.core.vocabulary.result import RunResult

THE_MODEL = "(the model)"
"""How a module row of the model itself (its path is "") reads."""
MODULE_COLUMNS = (
    ("activations", "activations_bytes"),
    ("parameters", "parameters_bytes"),
    ("gradients", "gradients_bytes"),
    ("optimizer state", "optimizer_state_bytes"),
)
"""The columns of memory by module: title, key of a `modules` row."""
SUMMARY_TOP_MODULES = 3
"""The modules holding the most activations that an out-of-memory run's summary names."""


def run_words(config: Mapping[str, Any], kind: str = "launched") -> str:
    """What ran, in a few words: "bert-large bs172", "script train.py --lr 3e-5", "watched: python train.py"."""
    if "script" in config:
        return printable(" ".join(["script", str(config["script"]), *map(str, config.get("args") or [])]))
    if kind == "watched":
        return "watched: " + printable(config.get("command") or config.get("model") or "a process")
    run = RunConfig.from_json({key: value for key, value in config.items() if value is not None})
    return f"{printable(run.model or run.preset)} {run.techniques_summary()}"


def run_title(result: RunResult, run_id: int | None = None, status: str | None = None, kind: str = "launched") -> str:
    """ "Run 3: oom — bert-large bs172 on NVIDIA H200" (the id and status the history has, where given)."""
    where = result.gpu_name or result.device_name or result.device
    return (
        f"Run {run_id if run_id is not None else result.run_id}: {printable(status or result.status)} — "
        f"{run_words(result.config, kind)} on {printable(where) if where else 'the machine it ran on'}"
    )


def band_lines(
    bands: Mapping[str, int | None] | None,
    why_missing: Mapping[str, str],
    gradients_after_backward_bytes: int | None,
    *,
    at_failure: bool = False,
) -> list[str]:
    """The memory bands, one a line, in stack order; a band that is missing says why; then which moment they are."""
    lines = []
    for band in BAND_NAMES:
        value = (bands or {}).get(band)
        label = band.removesuffix("_bytes").replace("_", " ")
        reason = why_missing.get(band)
        lines.append(
            f"  {label:<22} {format_bytes(value):>11}"
            + (f"  ({printable(reason)})" if value is None and reason else "")
        )
    if at_failure:
        lines.append("  (at the allocation that failed: activations are the tensors saved for backward so far)")
    elif gradients_after_backward_bytes:
        lines.append(
            f"  (at the end of the forward pass; after backward the gradients take "
            f"{format_bytes(gradients_after_backward_bytes)})"
        )
    return lines


def human_size(value: int | None) -> str:
    """`format_bytes`, but a size under a MiB in KiB: a small model's modules hold kilobytes."""
    if value is not None and 0 < abs(value) < MIB:
        return f"{value / 1024:.0f} KiB"
    return format_bytes(value)


def module_label(path: object) -> str:
    """A module's path as shown: "(the model)" for the model itself, escaped."""
    if path == "":
        return THE_MODEL
    return printable(path) if path is not None else NO_MODULE


def module_lines(modules: Sequence[Mapping[str, Any]]) -> list[str]:
    """Memory by module as a table: the module's path, its activations, parameters, gradients, optimizer state."""
    labels = [module_label(row.get("module")) for row in modules]
    width = max([len("module"), *map(len, labels)])
    lines = [f"  {'module':<{width}}" + "".join(f"  {title:>15}" for title, _ in MODULE_COLUMNS)]
    for label, row in zip(labels, modules, strict=True):
        cells = (human_size(_int(row.get(key))) for _, key in MODULE_COLUMNS)
        lines.append(f"  {label:<{width}}" + "".join(f"  {cell:>15}" for cell in cells))
    return lines


def top_activations(modules: Sequence[Mapping[str, Any]], count: int = SUMMARY_TOP_MODULES) -> list[tuple[str, int]]:
    """The `count` modules holding the most activations (none of "the rest"), as (label, bytes)."""
    held = [
        (module_label(row.get("module")), activations)
        for row in modules
        if row.get("module") != MODULES_REST and (activations := _int(row.get("activations_bytes")))
    ]
    return sorted(held, key=lambda item: -item[1])[:count]


def tensor_lines(tensors: Sequence[Mapping[str, Any]]) -> list[str]:
    """The largest live tensors at a failure: band, module, shape and dtype, size."""
    rows = []
    for tensor in tensors:
        shape = tensor.get("shape")
        shape_text = "×".join(map(str, shape)) if isinstance(shape, list) else "?"
        rows.append(
            (
                printable(tensor.get("band") or "?"),
                module_label(tensor.get("module")),
                f"{shape_text} {printable(tensor.get('dtype') or '?')}",
                human_size(_int(tensor.get("bytes"))),
            )
        )
    if not rows:
        return []
    widths = [max(len(row[column]) for row in rows) for column in range(3)]
    return [
        "  " + "  ".join(cell.ljust(width) for cell, width in zip(row[:3], widths, strict=True)) + f"  {row[3]:>11}"
        for row in rows
    ]


def failure_sentence(failure: Mapping[str, Any]) -> str:
    """ "Out of memory in the backward of bert.encoder.layer.23.output.dense (AddmmBackward0), step 2: tried to
    allocate 1.34 GiB with 449 MiB free"."""
    phase, module, operation = failure.get("phase"), failure.get("module"), failure.get("operation")
    where = PHASE_WORDS.get(phase, f"in {printable(phase)}") if phase else ""
    if module is not None:
        where += (" of " if phase in ("forward", "backward") else " in ") + module_label(module)
    if operation:
        where += f" ({printable(operation)})"
    rank = _int(failure.get("rank"))
    if rank:
        where += f" on rank {rank}"
    step = _int(failure.get("step"))
    if step is not None:
        where += f", step {step}"
    failed, free = _int(failure.get("failed_allocation_bytes")), _int(failure.get("device_free_bytes"))
    return (
        f"Out of memory {where.strip()}".rstrip()
        + f": tried to allocate {format_bytes(failed)}"
        + (f" with {format_bytes(free)} free" if free is not None else "")
    )


def fit_hint(suggestion: FitSuggestion) -> str:
    """What to change, in a line: the fit ladder's flags predicted to fit, else the techniques not on yet."""
    if suggestion.flags:
        return f"add {' '.join(suggestion.flags)} (predicted to fit; `gpuanat predict` shows why)"
    *first, last = suggestion.ideas
    return "try " + (f"{', '.join(first)} or {last}" if first else last)


def explain_command(run_id: int | None, db: Path | None) -> str:
    """`gpuanat explain N`, with the history it is in when that was given with --db."""
    words = ["gpuanat", "explain", str(run_id)]
    if db is not None:
        words += ["--db", str(db)]
    return printable(shlex.join(words))


def summary_memory_lines(result: RunResult, db: Path | None = None) -> list[str]:
    """What `gpuanat run`'s summary says after the bands: of an out-of-memory run, the allocation that failed and
    the modules holding the most activations; where to see memory by module."""
    modules = result.modules if isinstance(result.modules, list) else None
    command = explain_command(result.run_id, db)
    if result.status != "oom":
        return [f"Memory by module: {command}"] if modules is not None and result.run_id is not None else []
    lines = []
    if isinstance(result.out_of_memory, dict):
        lines.append(failure_sentence(result.out_of_memory) + ".")
    top = top_activations(modules or [])
    if top:
        lines.append(
            "Most activations, by module: " + ", ".join(f"{label} {format_bytes(size)}" for label, size in top)
        )
    if result.run_id is not None:
        lines.append(f"{command} for the whole anatomy")
    return lines


def _int(value: object) -> int | None:
    """`value` where it is an integer (a result from another version may hold anything)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def activity_lines(result: RunResult) -> list[str]:
    """How busy the GPU really was over the steady steps and what the run cost in energy (`measure.activity`), or
    why not: "GPU activity: tensor pipes 30%, SMs 82%, DRAM bandwidth 48% (steady medians, NVML GPM)", "Energy: …"."""
    why = result.unavailable
    tensor, sm, dram = result.tensor_active_percent, result.sm_active_percent, result.dram_bandwidth_percent
    if tensor is None and sm is None:
        activity = f"GPU activity: — ({printable(why.get('tensor_active_percent') or 'not read')})"
    else:
        parts = [
            f"{label} {value:.0f}%"
            for label, value in (("tensor pipes", tensor), ("SMs", sm), ("DRAM bandwidth", dram))
            if value is not None
        ]
        activity = f"GPU activity: {', '.join(parts)} (steady medians, NVML GPM)"
    clock, highest, throttled = result.sm_clock_mhz, result.max_sm_clock_mhz, result.throttled_percent
    if clock is not None:
        activity += f"; SM clock {clock:,.0f}" + (f" of {highest:,.0f}" if highest else "") + " MHz"
        if throttled:
            reasons = ", ".join(result.throttle_reasons or {})
            activity += f", throttled in {throttled:.0f}% of the samples ({printable(reasons)})"
    per_sample, power, joules = result.joules_per_sample, result.average_power_w, result.energy_joules
    if per_sample is None and joules is None:
        energy = f"Energy: — ({printable(why.get('joules_per_sample') or 'not read')})"
    else:
        parts = []
        if per_sample is not None:
            parts.append(f"{per_sample:.3g} J/sample")
        if result.joules_per_token is not None:
            parts.append(f"{result.joules_per_token:.3g} J/token")
        if power is not None:
            parts.append(f"{power:.0f} W average over the steady steps")
        if joules is not None:
            parts.append(f"the whole run {joules / 3600:.3g} Wh")
        energy = f"Energy: {', '.join(parts)}"
    faults = why.get("gpu_readings")  # NVML failed on a GPU during the run (`nvml_guard.GpuFaultLog`)
    return [activity, energy, *([f"GPU faults: {printable(faults)}"] if faults else [])]


def loss_lines(result: RunResult) -> list[str]:
    """The loss the loop logged: "Loss: 6.558 at the last log (step 150), lowest 6.558; the run's mean 7.77", or why
    there is none (a line only where the run trained)."""
    if result.final_loss is None:
        reason = result.unavailable.get("final_loss")
        return [f"Loss: — ({printable(reason)})"] if reason else []
    curve = result.loss_curve or []
    at = f" (step {curve[-1][0]:.0f})" if curve else ""
    lowest = f", lowest {result.min_loss:.4g}" if result.min_loss is not None else ""
    mean = f"; the run's mean {result.train_loss:.4g}" if result.train_loss is not None else ""
    return [f"Loss: {result.final_loss:.4g} at the last log{at}{lowest}{mean}"]


def compute_text(result: RunResult) -> str:
    """ "311.6 TFLOP/s, 31.5% of NVIDIA H100 80GB HBM3's 989 TFLOP/s dense peak (MFU)": model FLOPs at the steady
    rate; the MFU or why it is missing."""
    achieved = result.achieved_tflops
    if achieved is None:
        return "— TFLOP/s (" + (result.unavailable.get("mfu") or "not measured") + ")"
    text = f"{achieved:.1f} TFLOP/s" if achieved >= 1 else f"{achieved * 1000:.1f} GFLOP/s"
    if result.mfu is None:
        return f"{text} (MFU: {result.unavailable.get('mfu', 'not known')})"
    gpus = len(result.gpus or []) or 1
    where = result.gpu_name or "the GPU"
    where = f"{gpus}× {where}" if gpus > 1 else where
    return f"{text}, {100 * result.mfu:.1f}% of {where}'s {result.peak_tflops:.0f} TFLOP/s dense peak (MFU)"
