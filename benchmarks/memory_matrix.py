"""Measured memory of bert-large across the docs' techniques, for checking `gpuanat predict`.

One process trains every configuration in turn for a few optimizer steps with the real HF Trainer,
gpuanat's model/data builders and its AnatomyCallback, and records what the probe measured: exact
weights, gradients and optimizer-state bytes, activations at the end of forward, each step's peak
allocated memory, and the run's peak allocated and reserved memory. Between configurations the model
and Trainer are dropped and the allocator emptied; peak statistics are reset.

The matrix (bert-large, seq 512): fp32/fp16/bf16 x checkpointing off/on x batch 1..64 with fused AdamW,
then the other optimizers, eager attention and gradient accumulation at a few batch sizes. Results are
written after every configuration, so a cut-off run keeps what it measured.

    python benchmarks/memory_matrix.py --out memory_matrix.json [--budget-s 480] [--steps 3]
    python benchmarks/memory_matrix.py --set autocast-cache --out memory_matrix_autocast_cache.json

`--set autocast-cache` measures, after the fact that AMP with checkpointing keeps autocast's weight copies
until the forward pass returns was found in the docs' table, configurations none of which the model has
seen: AMP + checkpointing + accumulation at micro-batches 1-32, with each optimizer, and controls.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import itertools
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TQDM_DISABLE", "1")

import torch
import transformers
from transformers import Trainer, TrainingArguments

from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.protocol import Step
from gpuanat.worker.model import build_model
from gpuanat.worker.probe.hf import AnatomyCallback
from gpuanat.worker.train import build_dataset, training_arguments_kwargs

BATCH_SIZES = (1, 2, 4, 8, 16, 32, 64)
PRECISIONS = ("fp32", "fp16", "bf16")


def matrix() -> list[dict[str, Any]]:
    """Configurations as RunConfig overrides, the core precision x checkpointing x batch grid first."""
    configs: list[dict[str, Any]] = []
    for precision, checkpointing in itertools.product(PRECISIONS, (False, True)):
        configs += [
            {"precision": precision, "grad_checkpointing": checkpointing, "batch_size": batch} for batch in BATCH_SIZES
        ]
    for optim, precision, batch in itertools.product(("adamw_torch", "adafactor", "sgd"), ("fp32", "bf16"), (4, 16)):
        configs.append({"optim": optim, "precision": precision, "batch_size": batch})
    for precision, batch, checkpointing in itertools.product(("fp32", "bf16"), (4, 16), (False, True)):
        configs.append(
            {"attn": "eager", "precision": precision, "batch_size": batch, "grad_checkpointing": checkpointing}
        )
    for precision, batch in itertools.product(("fp32", "bf16"), (4, 16)):
        configs.append({"grad_accum": 4, "precision": precision, "batch_size": batch})
    # Last: the Trainer registers the embeddings with bitsandbytes' global manager, which keeps them alive
    # (about 0.24 GiB per run) after the run is gone and would inflate every later measurement.
    for precision, batch in itertools.product(("fp32", "bf16"), (4, 16)):
        configs.append({"optim": "adamw_bnb_8bit", "precision": precision, "batch_size": batch})
    return configs


def autocast_cache_set() -> list[dict[str, Any]]:
    """Where autocast's cache of weight copies matters (AMP + checkpointing + accumulation, small micro-batches)
    and where it should not (larger micro-batches, fp32, no accumulation)."""
    configs: list[dict[str, Any]] = []
    for precision, batch in itertools.product(("bf16", "fp16"), (1, 2, 4, 8, 16, 32)):
        configs.append({"precision": precision, "grad_checkpointing": True, "grad_accum": 4, "batch_size": batch})
    for optim in ("adafactor", "sgd", "adamw_torch"):
        configs.append(
            {"optim": optim, "precision": "bf16", "grad_checkpointing": True, "grad_accum": 2, "batch_size": 2}
        )
    configs += [
        {"precision": "fp32", "grad_checkpointing": True, "grad_accum": 4, "batch_size": batch} for batch in (2, 8)
    ]
    configs += [{"precision": "bf16", "grad_checkpointing": True, "batch_size": batch} for batch in (2, 8)]
    configs.append({"attn": "eager", "precision": "bf16", "grad_checkpointing": True, "grad_accum": 4, "batch_size": 4})
    # Last (see matrix()): bitsandbytes' manager keeps memory alive after the run.
    configs.append(
        {"optim": "adamw_bnb_8bit", "precision": "bf16", "grad_checkpointing": True, "grad_accum": 2, "batch_size": 2}
    )
    return configs


CONFIG_SETS: dict[str, Callable[[], list[dict[str, Any]]]] = {"grid": matrix, "autocast-cache": autocast_cache_set}


MAX_BATCH_CONFIGS: tuple[dict[str, Any], ...] = (
    {"precision": "fp32"},
    {"precision": "bf16"},
    {"precision": "fp32", "grad_checkpointing": True},
    {"precision": "bf16", "grad_checkpointing": True},
    {"precision": "fp32", "optim": "adafactor"},
    {"precision": "fp32", "attn": "eager"},
    {"precision": "bf16", "grad_accum": 4},
    {"precision": "bf16", "optim": "sgd"},
    {"precision": "bf16", "optim": "adamw_bnb_8bit"},  # last: see matrix()
)
H100_ALLOCATABLE_BYTES = (81559 - 615 - 760) * 2**20
"""An H100 80GB's memory less the driver's reservation and the CUDA context: what the allocator can get."""


def _release() -> None:
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def measure(overrides: dict[str, Any], steps: int) -> dict[str, Any]:
    batch = overrides["batch_size"] * overrides.get("grad_accum", 1)
    config = RunConfig.from_json(
        {
            "preset": "bert-large",
            "device": "cuda",
            "seq_len": 512,
            "max_steps": steps,
            "samples": batch * steps,
            **overrides,
        }
    )
    events: list[Any] = []
    probe = AnatomyCallback(events.append)
    record: dict[str, Any] = {"overrides": overrides, "config": config.to_json()}
    started_s = time.perf_counter()
    model = trainer = None
    _release()
    try:
        with tempfile.TemporaryDirectory() as output_dir:
            model = build_model(config)
            dataset = build_dataset(config, model.config.vocab_size)
            trainer = Trainer(
                model=model,
                args=TrainingArguments(**training_arguments_kwargs(config, output_dir)),
                train_dataset=dataset,
                callbacks=[probe],
            )
            trainer.train()
        record["status"] = "ok"
    except (torch.OutOfMemoryError, RuntimeError) as error:
        if not isinstance(error, torch.OutOfMemoryError) and "out of memory" not in str(error):
            raise
        record["status"] = "oom"
        record["error"] = str(error).splitlines()[0]
    finally:
        trainer = model = None
    record["seconds"] = time.perf_counter() - started_s
    record["peak_allocated_bytes"] = probe.peak_allocated_bytes
    record["peak_reserved_bytes"] = probe.peak_reserved_bytes
    record["steps"] = [dataclasses.asdict(event) for event in events if isinstance(event, Step)]
    measured = [step["bands"] for step in record["steps"] if step["bands"] is not None]
    record["bands"] = measured[-1] if measured else None
    _release()
    return record


def start_guess(runs: list[dict[str, Any]], overrides: dict[str, Any], allocatable_bytes: int) -> int:
    """A first batch size from this run's measurements of the same configuration: peak memory is linear
    in the batch, so extrapolate the line through the two largest batches measured."""
    family = [
        run
        for run in runs
        if run.get("status") == "ok"
        and {key: value for key, value in run["overrides"].items() if key != "batch_size"} == overrides
    ]
    family = sorted(family, key=lambda run: run["overrides"]["batch_size"])[-2:]
    if len(family) < 2:
        return 8
    (b1, p1), (b2, p2) = [(run["overrides"]["batch_size"], run["peak_allocated_bytes"]) for run in family]
    slope = (p2 - p1) / (b2 - b1)
    return max(1, int(b2 + (allocatable_bytes - p2) / slope)) if slope > 0 else 8


def find_max_batches(
    result: dict[str, Any], steps: int, budget_s: float, started_s: float, save: Callable[[], None]
) -> None:
    """The largest batch that trains `steps` steps, per MAX_BATCH_CONFIGS, searched as `gpuanat fit` does."""
    from gpuanat.core.run.fit import find_largest_batch

    total_bytes = torch.cuda.get_device_properties(0).total_memory
    emulated = "H100" not in torch.cuda.get_device_name() and total_bytes > H100_ALLOCATABLE_BYTES
    if emulated:
        torch.cuda.set_per_process_memory_fraction(H100_ALLOCATABLE_BYTES / total_bytes)
    allocatable_bytes = H100_ALLOCATABLE_BYTES if emulated else total_bytes
    result["max_batch"] = {"emulated_h100": emulated, "allocatable_bytes": allocatable_bytes, "searches": []}
    for overrides in MAX_BATCH_CONFIGS:
        if time.perf_counter() - started_s > budget_s:
            result["max_batch"]["searches"].append(
                {"overrides": overrides, "status": "skipped", "reason": "time budget spent"}
            )
            continue
        trials: list[dict[str, Any]] = []

        def trains(batch_size: int, overrides: dict[str, Any] = overrides, trials: list = trials) -> bool:
            record = measure({**overrides, "batch_size": batch_size}, steps)
            trials.append(
                {
                    "batch_size": batch_size,
                    "status": record["status"],
                    "peak_allocated_bytes": record["peak_allocated_bytes"],
                    "peak_reserved_bytes": record["peak_reserved_bytes"],
                    "seconds": record["seconds"],
                }
            )
            print(f"  max batch {json.dumps(overrides)} {batch_size}: {record['status']}", flush=True)
            return record["status"] == "ok"

        start = start_guess(result["runs"], overrides, allocatable_bytes - 2**30)
        largest, _ = find_largest_batch(trains, start, limit=4096)
        result["max_batch"]["searches"].append(
            {"overrides": overrides, "start": start, "largest_batch_size": largest, "trials": trials}
        )
        save()


def environment() -> dict[str, Any]:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    info = {
        "gpu": pynvml.nvmlDeviceGetName(handle),
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "total_memory_bytes": pynvml.nvmlDeviceGetMemoryInfo(handle).total,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
    }
    try:
        import bitsandbytes

        info["bitsandbytes"] = bitsandbytes.__version__
    except ImportError:
        info["bitsandbytes"] = None
    pynvml.nvmlShutdown()
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per configuration")
    parser.add_argument(
        "--set",
        choices=sorted(CONFIG_SETS),
        default="grid",
        dest="config_set",
        help="which configurations: the technique grid, or the autocast-cache check (see above)",
    )
    parser.add_argument("--budget-s", type=float, default=480.0, help="start no configuration after this")
    parser.add_argument(
        "--max-batch",
        action="store_true",
        help="then search the largest batch that trains, on an H100's memory (emulated on bigger GPUs)",
    )
    args = parser.parse_args()
    started_s = time.perf_counter()
    result: dict[str, Any] = {
        "environment": environment(),
        "set": args.config_set,
        "steps_per_config": args.steps,
        "runs": [],
    }
    out_of_memory: set[tuple[Any, ...]] = set()
    for overrides in CONFIG_SETS[args.config_set]():
        family = tuple(sorted((key, value) for key, value in overrides.items() if key != "batch_size"))
        if family in out_of_memory:
            result["runs"].append(
                {
                    "overrides": overrides,
                    "status": "skipped",
                    "reason": "a smaller batch of this configuration ran out of memory",
                }
            )
            continue
        if time.perf_counter() - started_s > args.budget_s:
            result["runs"].append({"overrides": overrides, "status": "skipped", "reason": "time budget spent"})
            continue
        record = measure(overrides, args.steps)
        if record["status"] == "oom":
            out_of_memory.add(family)
        result["runs"].append(record)
        peak = record["peak_allocated_bytes"] or 0
        print(
            f"{json.dumps(overrides)} {record['status']} peak {peak / 2**30:.2f} GiB {record['seconds']:.1f} s",
            flush=True,
        )
        args.out.write_text(json.dumps(result, indent=1))
    if args.max_batch:
        find_max_batches(
            result, 2, args.budget_s * 2, started_s, lambda: args.out.write_text(json.dumps(result, indent=1))
        )
    args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
