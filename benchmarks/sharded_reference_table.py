"""The tables of docs/several-gpus.md's "7-8B decoders on 2 / 4 H200s": every case that
benchmarks/sharded_reference_check.sh recorded in a folder (and its held_out/), rank 0, the plain Trainer's peaks
beside gpuanat's measured ones and today's prediction from the case's configuration (so a change to the memory model
shows in every row). Markdown on stdout:

    python3 benchmarks/sharded_reference_table.py benchmarks/results/h200x4/sharded_reference [--fitted zero2-1024]

The device is compared with the reference process's own NVML reading, as gpuanat measures it
(benchmarks/sharded_reference_summary.py says why). GB are 10⁹ bytes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

from gpuanat.core.memory.predict import estimate_memory, peak_device_bytes, peak_reserved_bytes
from gpuanat.core.vocabulary.config import RunConfig

GB = 1e9
MODELS = {
    "mistral": "mistral-7b",
    "qwen": "qwen2.5-7b",
    "mistrallora": "mistral-7b",
    "qwenlora": "qwen2.5-7b",
    "tied": "llama-3.2-1b",
    "tiedlora": "llama-3.2-1b",
}
"""A recorded run's name before its first dash: the preset whose config its checkpoint had (llama-3.1-8b's
otherwise; tied: h200x4/batches/)."""
TECHNIQUES = {
    "fsdp": "FSDP2",
    "random": "FSDP2",
    "bf16w": "FSDP2",
    "batch2": "FSDP2",
    "mistral": "FSDP2",
    "qwen": "FSDP2",
    "lora": "FSDP2 + LoRA 16",
    "mistrallora": "FSDP2 + LoRA 16",
    "qwenlora": "FSDP2 + LoRA 16",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2",
    "zero3": "ZeRO-3",
}
ORDER = list(TECHNIQUES)


def case_label(case: str, seq: str, held_out: bool, fitted: bool) -> str:
    kind = case.split("-")[0]
    extra = {
        "random": ", random weights (`--model config.json`)",
        "bf16w": ", `--weights-dtype bf16`",
        "batch2": ", batch 2",
    }.get(kind, "")
    note = " (fitted)" if fitted else " (held out)" if held_out else ""
    return f"{MODELS.get(kind, 'llama-3.1-8b')} {TECHNIQUES[kind]}, seq {seq}{extra}{note}"


def percent(predicted: int, measured: int) -> str:
    return f"{100 * (predicted - measured) / measured:+.1f}%".replace("-", "−")


def recorded_run(run_path: Path) -> tuple[RunConfig, dict]:
    """A recorded `gpuanat run --json` (run-NAME.json: its last JSON line) and its configuration with the preset in
    place of the checkpoint, so that the prediction reads the architecture without the checkpoint."""
    result = json.loads([line for line in run_path.read_text().splitlines() if line.startswith("{")][-1])
    kind = run_path.stem.removeprefix("run-").split("-")[0]
    return dataclasses.replace(
        RunConfig.from_json(result["config"]), model=None, preset=MODELS.get(kind, "llama-3.1-8b")
    ), result


def row(run_path: Path, fitted: set[str]) -> tuple[tuple[bool, int, int], str]:
    case = run_path.stem.removeprefix("run-")
    kind, seq = case.split("-")[0], case.split("-")[-1]
    config, result = recorded_run(run_path)
    references = map(json.loads, run_path.with_name(f"reference-{case}.jsonl").read_text().splitlines())
    reference = min(references, key=lambda line: line["rank"])
    rank = next(rank for rank in result["ranks"] if rank["gpu_index"] == reference["local_rank"])
    estimate = estimate_memory(config)
    allocated, reserved, device = (
        estimate.peak_allocated_bytes,
        peak_reserved_bytes(estimate),
        peak_device_bytes(estimate),
    )
    measured = (reference["peak_allocated_bytes"], reference["peak_reserved_bytes"], reference["process_used_bytes"])
    held_out = run_path.parent.name == "held_out"
    cells = [
        case_label(case, seq, held_out, case in fitted),
        " / ".join(f"{value / GB:.2f}" for value in measured),
        f"{rank['peak_allocated_bytes'] / GB:.2f} / {rank['peak_reserved_bytes'] / GB:.2f}",
        " / ".join(
            f"{value / GB:.2f} ({percent(value, truth)})"
            for value, truth in zip((allocated, reserved, device), measured, strict=True)
        ),
        f"{reference['s_per_step_median']:.2f}",
    ]
    return (held_out, ORDER.index(kind), int(seq)), "| " + " | ".join(cells) + " |"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--fitted", action="append", default=[], help="a held-out case the model was fitted on")
    args = parser.parse_args()
    paths = sorted(args.folder.glob("run-*.json")) + sorted((args.folder / "held_out").glob("run-*.json"))
    print(
        "| case | plain Trainer: peak allocated / reserved / NVML (GB) | gpuanat measured: allocated / reserved "
        "| predicted: allocated / reserved / device (vs the plain Trainer) | s/step (Trainer) |"
    )
    print("| --- | --- | --- | --- | --- |")
    for _, line in sorted(row(path, set(args.fitted)) for path in paths):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
