"""A bert-large training script as its author would write it, without gpuanat — plus the one opt-in line.

The HF docs' workload (bert-large-uncased shape, random weights built from config: the GPU machine has no
internet; 512 random sequences of 512 tokens; HF Trainer), trained for `--max-steps` steps so that there is a
minute or so to watch. `scripts/gpu_check.sh start-watch` starts it outside gpuanat and watches it by PID.

    python scripts/bert_large_external.py [--no-callback] [--max-steps 900] [--batch-size 8] [--precision bf16]
        [--ready-file PATH]
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from transformers import (
    AutoModelForSequenceClassification,
    BertConfig,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class ReadyFile(TrainerCallback):
    """Writes the PID once training has begun, so the watcher starts on a live run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 1:
            self.path.write_text(str(os.getpid()))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--no-callback", action="store_true", help="leave gpuanat's probe out")
    parser.add_argument("--max-steps", type=int, default=900)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="bf16")
    parser.add_argument("--ready-file", type=Path, default=None)
    args = parser.parse_args()
    torch.manual_seed(42)
    config = BertConfig(
        vocab_size=30522,
        hidden_size=1024,
        num_hidden_layers=24,
        num_attention_heads=16,
        intermediate_size=4096,
        max_position_embeddings=512,
    )
    with torch.device("cuda"):
        model = AutoModelForSequenceClassification.from_config(config)
    rng = np.random.default_rng(42)
    dataset = Dataset.from_dict({"input_ids": rng.integers(100, 30000, (512, 512)), "labels": rng.integers(0, 1, 512)})
    dataset.set_format("pt")
    callbacks: list[TrainerCallback] = [ReadyFile(args.ready_file)] if args.ready_file else []
    with tempfile.TemporaryDirectory() as output_dir:
        training_args = TrainingArguments(
            output_dir=output_dir,
            per_device_train_batch_size=args.batch_size,
            max_steps=args.max_steps,
            bf16=args.precision == "bf16",
            fp16=args.precision == "fp16",
            report_to="none",
            save_strategy="no",
            logging_steps=50,
            log_level="error",
        )
        trainer = Trainer(model=model, args=training_args, train_dataset=dataset, callbacks=callbacks)
        if not args.no_callback:
            import gpuanat.probe

            trainer.add_callback(gpuanat.probe.AnatomyCallback())  # the one line that publishes the anatomy
        trainer.train()


if __name__ == "__main__":
    main()
