"""What the three GPU training scripts of benchmarks/loops share: their options, a causal LM built from a
config.json in bf16 (as `from_pretrained` loads modern checkpoints, and as TRL and plain loops train them), random
token batches, and a steady-state clock that reads the same in every loop (a CUDA sync at the end of step `--warmup`
and at the end of the last step, nothing in between)."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def options(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--config", type=Path, default=Path(__file__).parent.parent / "configs" / "qwen3-0.6b")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=10, help="steps before the steady clock starts")
    parser.add_argument("--probe", action="store_true", help="add gpuanat's probe for this loop")
    parser.add_argument("--tiny", action="store_true", help="2 small layers, for a CPU smoke test")
    parser.add_argument(
        "--fsdp",
        action="store_true",
        help="under torchrun: FSDP2 (`fully_shard`) of every decoder layer and the model, one GPU a "
        "rank over NCCL (gloo on the CPU); plain_loop.py only",
    )
    parser.add_argument("--hold-s", type=float, default=0.0, help="stay alive this long after training")
    parser.add_argument(
        "--step-times",
        action="store_true",
        help="also time every steady step (a CUDA sync at each step's end) and report their median",
    )
    parser.add_argument("--result", type=Path, default=None, help="write the steady clock's reading here (JSON)")
    return parser.parse_args(argv)


def device() -> torch.device:
    """This rank's device: the GPU of its LOCAL_RANK under torchrun, GPU 0 otherwise, or the CPU."""
    if not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    config = AutoConfig.from_pretrained(args.config)
    if args.tiny:
        config.num_hidden_layers, config.hidden_size, config.intermediate_size = 2, 64, 128
        config.num_attention_heads, config.num_key_value_heads, config.head_dim = 2, 1, 32
        config.vocab_size = 1000
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).to(device())


def random_tokens(args: argparse.Namespace, vocab_size: int, rows: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, vocab_size, (rows, args.seq_len), generator=generator)


class SteadyClock:
    """Seconds per step from the end of step `warmup` to the end of the last step, synchronised at both ends; with
    `every_step`, also each steady step's own seconds (synchronised at every step's end: a loop whose host waits for
    the GPU at each step anyway, as TRL's metrics make it, loses nothing), whose median a stall cannot move."""

    def __init__(self, warmup: int, steps: int, every_step: bool = False) -> None:
        self.warmup, self.steps, self.every_step = warmup, steps, every_step
        self.start_s: float | None = None
        self.end_s: float | None = None
        self.step_s: list[float] = []
        self._last_s: float | None = None

    def step_ended(self, step: int) -> None:
        if step in (self.warmup, self.steps) or (self.every_step and step > self.warmup):
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            now_s = time.perf_counter()
            if step > self.warmup and self._last_s is not None:
                self.step_s.append(now_s - self._last_s)
            self._last_s = now_s
            if step == self.warmup:
                self.start_s = now_s
            elif step == self.steps:
                self.end_s = now_s

    def reading(self) -> dict[str, Any]:
        if self.start_s is None or self.end_s is None:
            return {"s_per_step": None, "steps_timed": 0}
        reading: dict[str, Any] = {
            "s_per_step": (self.end_s - self.start_s) / (self.steps - self.warmup),
            "steps_timed": self.steps - self.warmup,
        }
        if self.every_step and self.step_s:
            reading["median_step_s"] = statistics.median(self.step_s)
        return reading


def report(args: argparse.Namespace, reading: dict[str, Any]) -> None:
    if args.result is not None:
        args.result.write_text(json.dumps(reading))
    print(json.dumps(reading), flush=True)
