"""Baseline for the "monitor costs nothing" target: plain HF Trainer, no gpuanat probe, runner or sampler.

Builds the same model, data and TrainingArguments as gpuanat's worker for a RunConfig, trains with
only a two-timestamp clock callback (one CUDA sync at the end of warm-up and one at the last step,
exactly like the probe's steady-state window), and prints one JSON line: steady samples/s, HF's
samples/s, torch's peak allocated memory over the whole run, and its start-up timed by the same parts as
gpuanat's (gpuanat.core.measure.startup: the first step's end taken after a CUDA sync, as gpuanat's probe measures
it), from `--requested-monotonic-s` (when the caller started it) or else this process's start.

    python benchmarks/plain_trainer.py --config '{"preset": "bert-large", "batch_size": 4}'
"""

from __future__ import annotations

import time

STARTED_MONOTONIC_S = time.monotonic()

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import tempfile  # noqa: E402

import torch  # noqa: E402
from transformers import Trainer, TrainerCallback, TrainingArguments  # noqa: E402

from gpuanat.core.measure.startup import (  # noqa: E402
    REQUESTED,
    process_started_monotonic_s,
    time_to_first_step_s,
    wall_breakdown,
)
from gpuanat.core.vocabulary.config import RunConfig  # noqa: E402
from gpuanat.worker.model import build_model, enable_checkpointing  # noqa: E402
from gpuanat.worker.train import build_dataset, training_arguments_kwargs  # noqa: E402

IMPORTED_MONOTONIC_S = time.monotonic()


class SteadyClock(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        self.warmup_steps = min(20, max(2, math.ceil(state.max_steps / 10)))
        self.samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self.start_s = self.end_s = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            self.first_step_s = time.monotonic()
        if state.global_step == state.max_steps:
            self.last_step_s = time.monotonic()
        if state.global_step in (self.warmup_steps, state.max_steps):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if state.global_step == self.warmup_steps:
                self.start_s = time.perf_counter()
            else:
                self.end_s = time.perf_counter()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--config", required=True)
    parser.add_argument("--requested-monotonic-s", type=float, help="when the caller started this script")
    parser.add_argument(
        "--with-probe",
        action="store_true",
        help="add gpuanat's probe (AnatomyCallback, its events dropped): the probe's cost alone",
    )
    args = parser.parse_args()
    config = RunConfig.from_json(json.loads(args.config))
    points = {
        REQUESTED: args.requested_monotonic_s or process_started_monotonic_s() or STARTED_MONOTONIC_S,
        "started": STARTED_MONOTONIC_S,
        "imported": IMPORTED_MONOTONIC_S,
    }
    model = build_model(config)  # CUDA initialises here: the model is built on the GPU
    if config.grad_checkpointing and config.selective_checkpointing:  # as the worker: no TrainingArguments value
        enable_checkpointing(model, config)
    points["model built"] = time.monotonic()
    dataset = build_dataset(config, model.config.vocab_size)
    points["dataset built"] = time.monotonic()
    clock = SteadyClock()
    callbacks: list[TrainerCallback] = [clock]
    if args.with_probe:
        from gpuanat.worker.probe.hf import AnatomyCallback

        callbacks.insert(0, AnatomyCallback(lambda event: None))
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = Trainer(
            model=model,
            args=TrainingArguments(**training_arguments_kwargs(config, output_dir)),
            train_dataset=dataset,
            callbacks=callbacks,
        )
        points["trainer ready"] = time.monotonic()
        metrics = trainer.train().metrics
    points.update({"first step": clock.first_step_s, "last step": clock.last_step_s, "trained": time.monotonic()})
    steady_steps = trainer.state.global_step - clock.warmup_steps
    # Every step of these configs is full (samples divide evenly), so samples = steps × batch.
    print(
        json.dumps(
            {
                "config": config.to_json(),
                "samples_per_second": metrics["train_samples_per_second"],
                "train_runtime_s": metrics["train_runtime"],
                "steady_samples_per_second": steady_steps * clock.samples_per_step / (clock.end_s - clock.start_s),
                "peak_allocated_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
                "wall_breakdown_s": wall_breakdown(points),
                "time_to_first_step_s": time_to_first_step_s(points),
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
