"""A user's own PyTorch Lightning script, as someone would write it: the tiny BERT of tiny_trainer.py on the docs'
random dataset, on the CPU, in a LightningModule whose training_step calls the inner model. With `--probe` it adds
gpuanat's probe for Lightning, `gpuanat.probe.LightningAnatomyCallback`, to the Trainer's callbacks.

    python tests/scripts/tiny_lightning.py [--probe] [--samples N] [--batch-size N] [--grad-accum N] ...

(options: tiny_loop_common.py)
"""

from __future__ import annotations

import json
import time

import lightning
import torch
from tiny_loop_common import build, fail_here, mark_ready, options


def main() -> None:
    args = options(__doc__)
    time.sleep(args.start_delay_s)
    model, loader = build(args)

    class Classifier(lightning.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):  # type: ignore[no-untyped-def]
            fail_here(args, self.global_step + 1)
            inputs, labels = batch
            loss = self.model(input_ids=inputs, labels=labels).loss
            if args.loss_log is not None:  # each step's loss as the loop had it
                with args.loss_log.open("a") as log:
                    log.write(json.dumps({"step": self.global_step + 1, "loss": loss.item()}) + "\n")
            return loss

        def on_train_batch_end(self, outputs, batch, batch_idx):  # type: ignore[no-untyped-def]
            mark_ready(args, self.global_step)

        def configure_optimizers(self):  # type: ignore[no-untyped-def]
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    callbacks = []
    if args.probe:
        import gpuanat.probe

        callbacks.append(gpuanat.probe.LightningAnatomyCallback())
    trainer = lightning.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        accumulate_grad_batches=args.grad_accum,
        log_every_n_steps=5,
        callbacks=callbacks,
    )
    trainer.fit(Classifier(), loader)
    time.sleep(args.hold_s)


if __name__ == "__main__":
    main()
