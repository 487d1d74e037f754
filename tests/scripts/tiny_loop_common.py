"""What tiny_plain_loop.py and tiny_lightning.py share: their options, the tiny BERT of tiny_trainer.py and the docs'
random dataset in a DataLoader, on the CPU."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch
from transformers import BertConfig, BertForSequenceClassification


def options(description: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--probe", action="store_true", help="add gpuanat's probe for this loop")
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--accelerate", action="store_true", help="(plain loop) Accelerate's loop, wrapped optimizer")
    parser.add_argument("--fsdp", action="store_true", help="(plain loop, under torchrun) FSDP2 over gloo")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument(
        "--ready-file",
        type=Path,
        default=None,
        help="written with the PID after the first optimizer step (tests wait for it)",
    )
    parser.add_argument("--hold-s", type=float, default=0.0, help="stay alive this long after training")
    parser.add_argument(
        "--start-delay-s", type=float, default=0.0, help="sleep this long before building the model (a slow start)"
    )
    parser.add_argument("--fail-at-step", type=int, default=None, help="raise in this step's forward pass")
    parser.add_argument(
        "--loss-log",
        type=Path,
        default=None,
        help="write each step's loss as a JSON line here (the plain loop also clips the gradients and gives the probe "
        "the loss, learning rate and gradients' norm)",
    )
    return parser.parse_args()


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, torch.utils.data.DataLoader]:
    torch.manual_seed(0)
    model = BertForSequenceClassification(
        BertConfig(vocab_size=30522, hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128)
    )
    generator = torch.Generator().manual_seed(0)
    inputs = torch.randint(100, 30000, (args.samples, args.seq_len), generator=generator)
    labels = torch.zeros(args.samples, dtype=torch.long)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(inputs, labels), batch_size=args.batch_size, shuffle=True, generator=generator
    )
    return model, loader


def mark_ready(args: argparse.Namespace, step: int) -> None:
    if step == 1 and args.ready_file is not None:
        args.ready_file.write_text(str(os.getpid()))


def fail_here(args: argparse.Namespace, step: int) -> None:
    if step == args.fail_at_step:
        raise RuntimeError(f"the loss went [red]NaN[/] at step {step}")  # markup-like text: shown as it is
