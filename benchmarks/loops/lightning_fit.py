"""A PyTorch Lightning fit of a causal LM from a config.json, bf16 weights ("bf16-true"), AdamW, on one GPU; with
`--probe`, measured by `gpuanat.probe.LightningAnatomyCallback`. `train(args)` is what
benchmarks/loop_probe_cost.py alternates.

    python benchmarks/loops/lightning_fit.py [--probe] [--config DIR] [--seq-len N] [--batch-size N] [--steps N]
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import lightning
import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import SteadyClock, build_model, device, options, random_tokens, report


class CausalLM(lightning.LightningModule):
    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
        (tokens,) = batch
        return self.model(input_ids=tokens, labels=tokens).loss

    def configure_optimizers(self):  # type: ignore[no-untyped-def]
        return torch.optim.AdamW(self.parameters(), lr=1e-5, fused=device().type == "cuda")


class ClockCallback(lightning.Callback):
    def __init__(self, clock: SteadyClock) -> None:
        self.clock = clock

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
        self.clock.step_ended(trainer.global_step)


def train(args: Any, model: torch.nn.Module | None = None) -> dict[str, Any]:
    model = model if model is not None else build_model(args)
    tokens = random_tokens(args, model.config.vocab_size, args.batch_size * args.steps)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(tokens), batch_size=args.batch_size, pin_memory=device().type == "cuda"
    )
    clock = SteadyClock(args.warmup, args.steps, args.step_times)
    callbacks: list[Any] = [ClockCallback(clock)]
    if args.probe:
        import gpuanat.probe

        callbacks.append(gpuanat.probe.LightningAnatomyCallback())
    trainer = lightning.Trainer(
        accelerator=device().type,
        devices=1,
        precision="bf16-true",
        max_steps=args.steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        log_every_n_steps=10,
        callbacks=callbacks,
    )
    trainer.fit(CausalLM(model), loader)
    return {"loop": "lightning", "probe": args.probe, **clock.reading()}


if __name__ == "__main__":
    arguments = options(__doc__)
    report(arguments, train(arguments))
    time.sleep(arguments.hold_s)
