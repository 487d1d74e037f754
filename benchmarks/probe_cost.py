"""The probe's cost, paired: plain Trainer blocks and probed blocks alternate in one process.

Between separate processes, steady samples/s of the same config varies by several percent on the
lent GPU machines, more than the 1% the probe may cost. Here one model trains in alternating blocks
of `--steps` optimizer steps (a fresh Trainer each), with only a two-timestamp clock (A), or with the
clock and gpuanat's AnatomyCallback sending every event, JSON-encoded, to a pipe the way the worker
does (B). Blocks run ABBA so drift cancels; each block's time per step excludes its first steps.

    python benchmarks/probe_cost.py --out probe_cost.json [--blocks 8 --steps 40]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback, TrainingArguments

from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.worker.events import EventWriter
from gpuanat.worker.model import build_model
from gpuanat.worker.probe.hf import AnatomyCallback
from gpuanat.worker.train import build_dataset, training_arguments_kwargs

SKIPPED_STEPS = 5


class BlockClock(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        self.start_s = self.end_s = None

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step in (SKIPPED_STEPS, state.max_steps):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            if state.global_step == SKIPPED_STEPS:
                self.start_s = time.perf_counter()
            else:
                self.end_s = time.perf_counter()


def drain(read_fd: int) -> None:
    with os.fdopen(read_fd, "rb") as pipe:
        for _ in pipe:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--config", type=json.loads, default={"device": "cuda"})
    args = parser.parse_args()
    config = RunConfig.from_json({**args.config, "max_steps": args.steps})
    model = build_model(config)
    dataset = build_dataset(config, model.config.vocab_size)
    read_fd, write_fd = os.pipe()
    threading.Thread(target=drain, args=(read_fd,), daemon=True).start()
    writer = EventWriter(write_fd)
    seconds_per_step: dict[str, list[float]] = {"plain": [], "probed": []}
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(**training_arguments_kwargs(config, output_dir))
        for block in range(args.blocks):
            probed = block % 4 in (1, 2)  # A B B A A B B A ...
            clock = BlockClock()
            callbacks: list[TrainerCallback] = [clock, AnatomyCallback(writer.emit)] if probed else [clock]
            Trainer(model=model, args=training_args, train_dataset=dataset, callbacks=callbacks).train()
            per_step = (clock.end_s - clock.start_s) / (args.steps - SKIPPED_STEPS)
            seconds_per_step["probed" if probed else "plain"].append(per_step)
            print(f"block {block} {'probed' if probed else 'plain '} {per_step * 1000:.2f} ms/step", flush=True)
    plain, probed = statistics.median(seconds_per_step["plain"]), statistics.median(seconds_per_step["probed"])
    result = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "config": config.to_json(),
        "blocks": args.blocks,
        "steps_per_block": args.steps,
        "seconds_per_step": seconds_per_step,
        "median_plain_s": plain,
        "median_probed_s": probed,
        "probe_cost_percent_of_step_time": 100.0 * (probed - plain) / plain,
        "throughput_ratio": plain / probed,
    }
    args.out.write_text(json.dumps(result, indent=2))
    print(json.dumps({key: value for key, value in result.items() if key != "seconds_per_step"}, indent=2))


if __name__ == "__main__":
    main()
