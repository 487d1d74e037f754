"""A TRL `SFTTrainer` fine-tune of a causal LM from a config.json, bf16 weights, on one GPU, on pre-tokenized random
sequences (the GPU machine reaches no hub: a word-level tokenizer is built here); with `--probe`, measured by
gpuanat's `AnatomyCallback` in one line. `train(args)` is what benchmarks/loop_probe_cost.py alternates.

    python benchmarks/loops/trl_sft.py [--probe] [--config DIR] [--seq-len N] [--batch-size N] [--steps N]
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast, TrainerCallback
from trl import SFTConfig, SFTTrainer

sys.path.insert(0, str(Path(__file__).parent))
from common import SteadyClock, build_model, device, options, random_tokens, report


def word_level_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    vocab = {f"w{index}": index for index in range(vocab_size)}
    return PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="w0")),
        pad_token="w0",
        eos_token="w1",
        unk_token="w0",
    )


class ClockCallback(TrainerCallback):
    def __init__(self, clock: SteadyClock) -> None:
        self.clock = clock

    def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
        self.clock.step_ended(state.global_step)


def train(args: Any, model: torch.nn.Module | None = None) -> dict[str, Any]:
    model = model if model is not None else build_model(args)
    tokens = random_tokens(args, model.config.vocab_size, args.batch_size * args.steps)
    dataset = Dataset.from_dict({"input_ids": tokens.tolist()})
    clock = SteadyClock(args.warmup, args.steps, args.step_times)
    callbacks: list[Any] = [ClockCallback(clock)]
    if args.probe:
        from gpuanat.probe import AnatomyCallback

        callbacks.append(AnatomyCallback())
    with tempfile.TemporaryDirectory() as output_dir:
        config = SFTConfig(
            output_dir=output_dir,
            max_steps=args.steps,
            per_device_train_batch_size=args.batch_size,
            bf16=device().type == "cuda",
            use_cpu=device().type != "cuda",
            max_length=args.seq_len,
            logging_steps=10,
            report_to="none",
            save_strategy="no",
            learning_rate=1e-5,
            optim="adamw_torch_fused" if device().type == "cuda" else "adamw_torch",
            dataloader_pin_memory=device().type == "cuda",
        )
        trainer = SFTTrainer(
            model=model,
            args=config,
            train_dataset=dataset,
            processing_class=word_level_tokenizer(model.config.vocab_size),
            callbacks=callbacks,
        )
        trainer.train()
    return {"loop": "trl", "probe": args.probe, **clock.reading()}


if __name__ == "__main__":
    arguments = options(__doc__)
    report(arguments, train(arguments))
    time.sleep(arguments.hold_s)
