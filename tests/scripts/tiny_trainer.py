"""A user's own training script, as someone would write it without gpuanat: a tiny BERT trained with HF Trainer
on the docs' random dataset, on the CPU. With `--callback` it adds gpuanat's probe in one line.

    python tests/scripts/tiny_trainer.py [--callback] [--samples N] [--seq-len N] [--batch-size N]
        [--ready-file PATH] [--hold-s S]

`--ready-file` is written with the PID once training starts (tests wait for it); `--hold-s` keeps the process
alive that long after training, so a watcher can read the end of the run before it exits.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments


class ReadyFile(TrainerCallback):
    def __init__(self, path: Path) -> None:
        self.path = path

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.path.write_text(str(os.getpid()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--callback", action="store_true", help="add gpuanat's AnatomyCallback")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--ready-file", type=Path, default=None)
    parser.add_argument("--hold-s", type=float, default=0.0)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
    )
    rng = np.random.default_rng(0)
    dataset = Dataset.from_dict(
        {
            "input_ids": rng.integers(100, 30000, (args.samples, args.seq_len)),
            "labels": rng.integers(0, 1, args.samples),
        }
    )
    dataset.set_format("pt")
    callbacks: list[TrainerCallback] = [ReadyFile(args.ready_file)] if args.ready_file else []
    if args.callback:
        from gpuanat.probe import AnatomyCallback

        callbacks.append(AnatomyCallback())
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir,
            per_device_train_batch_size=args.batch_size,
            use_cpu=True,
            report_to="none",
            save_strategy="no",
            logging_steps=5,
        )
        Trainer(model=model, args=training_args, train_dataset=dataset, callbacks=callbacks).train()
    time.sleep(args.hold_s)


if __name__ == "__main__":
    main()
