"""The docs' "Using 🤗 Accelerate" training loop as an engine (`--engine accelerate`), measured by the same probe.

The loop of "Efficient training on a single GPU": an `Accelerator` with the run's mixed precision and gradient
accumulation, gradient checkpointing on the model, the chosen optimizer (built as HF Trainer builds it, from the
same TrainingArguments, so the two engines train the same optimizer), a DataLoader with the run's pin_memory and
workers, and `accelerator.accumulate`. Under torchrun the Accelerator trains with DDP by itself.

The probe is a TrainerCallback; here the loop calls its methods where Trainer would: at each optimizer step's
start and end, before the optimizer step, and with the loss every `LOGGING_STEPS` steps. So the events, the bands
and the result are the same contract as with Trainer, and `sweep --engine accelerate` and compare put both side by
side. Throughput as HF reports it (`train_samples_per_second`) is computed the way Trainer does: every rank's
samples over the loop's wall time.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any


def train_with_accelerate(
    config: Any,
    model: Any,
    dataset: Any,
    probe: Any,
    arguments: Any,
    logging_steps: int,
    on_ready: Callable[[], None] = lambda: None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    count: Any = None,
) -> dict[str, Any]:
    """Train `model` on `dataset` as the docs' Accelerate loop does; returns Trainer-like metrics. `on_ready` is
    called once model, optimizer and loader are prepared, before the first step. A --data run batches its rows with
    `collate_fn` and adds each batch to `count` (`batches.TokenCount`)."""
    import torch
    from accelerate import Accelerator, DataLoaderConfiguration
    from torch.utils.data import DataLoader
    from transformers import Trainer

    # From pinned memory the batch's copy to the GPU need not wait: a blocking copy queues behind the step's kernels
    # and holds the host there, so the next step's kernels start late (the H100 at batch 136: 98% busy, the host in
    # the data phase)
    accelerator = Accelerator(
        mixed_precision=config.precision if config.precision != "fp32" and config.autocast else "no",
        gradient_accumulation_steps=config.grad_accum,
        cpu=config.device == "cpu",
        dataloader_config=DataLoaderConfiguration(non_blocking=config.pin_memory),
    )
    if config.tf32 and config.device == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    if config.grad_checkpointing and not config.selective_checkpointing:  # selective: enabled with the model
        model.gradient_checkpointing_enable()
    optimizer_class, optimizer_kwargs = Trainer.get_optimizer_cls_and_kwargs(arguments, model)
    optimizer = optimizer_class(model.parameters(), **optimizer_kwargs)
    loader = DataLoader(
        dataset,
        batch_size=config.batch_size,
        shuffle=True,
        pin_memory=config.pin_memory,
        num_workers=config.workers,
        generator=torch.Generator().manual_seed(config.seed),
        collate_fn=collate_fn,
    )
    if config.compile:
        model = torch.compile(model)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    on_ready()
    steps_per_epoch = max(1, math.ceil(len(loader) / config.grad_accum))
    total_steps = config.max_steps if config.max_steps is not None else steps_per_epoch * config.epochs
    epochs = math.ceil(total_steps / steps_per_epoch)
    state = SimpleNamespace(global_step=0, max_steps=total_steps)
    args = SimpleNamespace(
        torch_compile=config.compile,
        per_device_train_batch_size=config.batch_size,
        gradient_accumulation_steps=config.grad_accum,
    )
    control = SimpleNamespace(should_training_stop=False)
    probe.on_train_begin(args, state, control, model=accelerator.unwrap_model(model), optimizer=optimizer)
    model.train()
    started_s = time.perf_counter()
    samples = 0
    # Sums on the device, read only when logged and at the end: no sync a step, and no tensor kept per step.
    run_loss_sum = window_loss_sum = torch.zeros((), device=accelerator.device)
    run_batches = window_batches = 0
    step_begun = False
    for _epoch in range(epochs):
        for batch in loader:
            if not step_begun:
                probe.on_step_begin(args, state, control)
                step_begun = True
            if count is not None:
                count.add(batch)
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    probe.on_pre_optimizer_step(args, state, control)
                optimizer.step()
                optimizer.zero_grad()
            samples += int(batch["input_ids"].shape[0])
            run_loss_sum = run_loss_sum + loss.detach()
            window_loss_sum = window_loss_sum + loss.detach()
            run_batches += 1
            window_batches += 1
            if not accelerator.sync_gradients:
                continue
            state.global_step += 1
            step_begun = False
            if state.global_step % logging_steps == 0:
                logs = {
                    "loss": float(window_loss_sum) / window_batches,
                    "learning_rate": optimizer.param_groups[0]["lr"],
                }
                probe.on_log(args, state, control, logs=logs)
                window_loss_sum, window_batches = torch.zeros((), device=accelerator.device), 0
            probe.on_step_end(args, state, control)
            if state.global_step >= total_steps or control.should_training_stop:
                break
        if state.global_step >= total_steps or control.should_training_stop:
            break
    runtime_s = time.perf_counter() - started_s
    probe.on_train_end(args, state, control)
    train_loss = float(run_loss_sum) / run_batches if run_batches else None
    return {
        "train_runtime": runtime_s,
        "train_samples_per_second": samples * accelerator.num_processes / runtime_s,
        "train_loss": train_loss,
        "global_step": state.global_step,
    }
