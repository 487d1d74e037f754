"""Baseline for the "monitor costs nothing" target: plain HF Trainer, no gpuanat probe, runner or sampler.

Builds the same model, data and TrainingArguments as gpuanat's worker for a RunConfig, trains with
only a two-timestamp clock callback (one CUDA sync at the end of warm-up and one at the last step,
exactly like the probe's steady-state window), and prints one JSON line: steady samples/s, HF's
samples/s and torch's peak allocated memory over the whole run.

    python benchmarks/plain_trainer.py --config '{"preset": "bert-large", "batch_size": 4}'
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from gpuanat.core.run.config import RunConfig
from gpuanat.worker.train import build_dataset, build_model, training_arguments_kwargs


class SteadyClock(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        self.warmup_steps = min(20, max(2, math.ceil(state.max_steps / 10)))
        self.samples_per_step = args.per_device_train_batch_size * args.gradient_accumulation_steps
        self.start_s = self.end_s = None

    def on_step_end(self, args, state, control, **kwargs):
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
    config = RunConfig.from_json(json.loads(parser.parse_args().config))
    model = build_model(config)
    dataset = build_dataset(config, model.config.vocab_size)
    clock = SteadyClock()
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = Trainer(model=model, args=TrainingArguments(**training_arguments_kwargs(config, output_dir)),
                          train_dataset=dataset, callbacks=[clock])
        metrics = trainer.train().metrics
    steady_steps = trainer.state.global_step - clock.warmup_steps
    # Every step of these configs is full (samples divide evenly), so samples = steps × batch.
    print(json.dumps({
        "config": config.to_json(),
        "samples_per_second": metrics["train_samples_per_second"],
        "train_runtime_s": metrics["train_runtime"],
        "steady_samples_per_second": steady_steps * clock.samples_per_step / (clock.end_s - clock.start_s),
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if torch.cuda.is_available() else None,
    }))


if __name__ == "__main__":
    main()
