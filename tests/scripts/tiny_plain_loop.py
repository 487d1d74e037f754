"""A user's own training loop in plain PyTorch, as someone would write it: the tiny BERT of tiny_trainer.py on the
docs' random dataset, on the CPU. With `--probe` it adds gpuanat's probe for such a loop, `gpuanat.probe.track`;
with `--accelerate` the loop is Accelerate's (`prepare`, `accumulate`, `backward`: the optimizer wrapped); with `--fsdp`
(under torchrun) each BERT layer and the model are sharded by FSDP2's `fully_shard` over gloo.

    python tests/scripts/tiny_plain_loop.py [--probe] [--accelerate] [--samples N] [--batch-size N] ...

(options: tiny_loop_common.py)
"""

from __future__ import annotations

import contextlib
import json
import time

import torch
from tiny_loop_common import build, fail_here, mark_ready, options


def probe_of(args, model, optimizer, loader):  # type: ignore[no-untyped-def]
    """gpuanat's probe for a loop of one's own, with `--probe`; else nothing."""
    if not args.probe:
        return contextlib.nullcontext()
    import gpuanat.probe

    return gpuanat.probe.track(model, optimizer, total_steps=len(loader) // args.grad_accum * args.epochs)


def accelerate_loop(args, model, loader, optimizer) -> None:  # type: ignore[no-untyped-def]
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=args.grad_accum)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    probe = probe_of(args, model, optimizer, loader)
    model.train()
    step = 0
    with probe as tracker:
        for _epoch in range(args.epochs):
            for inputs, labels in loader:
                fail_here(args, step + 1)
                with accelerator.accumulate(model):
                    loss = model(input_ids=inputs, labels=labels).loss
                    accelerator.backward(loss)
                    optimizer.step()
                    optimizer.zero_grad()
                if not accelerator.sync_gradients:
                    continue
                step += 1
                if tracker is not None:
                    tracker.step(samples=len(inputs) * args.grad_accum, loss=loss)
                mark_ready(args, step)


def logged_step(args, tracker, model, optimizer, loss, samples: int, step: int) -> None:  # type: ignore[no-untyped-def]
    """`--loss-log`: the step with its gradients clipped, its loss, learning rate and gradients' norm given to the
    probe as a loop would (the loss and norm as tensors, the rate a number), and written down as the loop saw them."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    learning_rate = optimizer.param_groups[0]["lr"]
    optimizer.step()
    optimizer.zero_grad()
    if tracker is not None:
        tracker.step(samples=samples * args.grad_accum, loss=loss, learning_rate=learning_rate, grad_norm=grad_norm)
    line = {"step": step, "loss": loss.item(), "learning_rate": learning_rate, "grad_norm": grad_norm.item()}
    with args.loss_log.open("a") as log:
        log.write(json.dumps(line) + "\n")


def main() -> None:
    args = options(__doc__)
    time.sleep(args.start_delay_s)
    model, loader = build(args)
    if args.fsdp:
        import torch.distributed as dist
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        for layer in model.bert.encoder.layer:
            fully_shard(layer)
        fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if args.accelerate:
        accelerate_loop(args, model, loader, optimizer)
        time.sleep(args.hold_s)
        return
    probe = probe_of(args, model, optimizer, loader)
    model.train()
    step = 0
    with probe as tracker:
        for _epoch in range(args.epochs):
            for index, (inputs, labels) in enumerate(loader):
                fail_here(args, step + 1)
                loss = model(input_ids=inputs, labels=labels).loss / args.grad_accum
                loss.backward()
                if (index + 1) % args.grad_accum:
                    continue
                if args.loss_log is not None:
                    logged_step(args, tracker, model, optimizer, loss, len(inputs), step + 1)
                    step += 1
                    mark_ready(args, step)
                    continue
                optimizer.step()
                optimizer.zero_grad()
                step += 1
                if tracker is not None:
                    tracker.step(samples=len(inputs) * args.grad_accum, loss=loss)
                mark_ready(args, step)
    time.sleep(args.hold_s)


if __name__ == "__main__":
    main()
