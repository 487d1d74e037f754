"""A user's own training loop in plain PyTorch, as someone would write it: the tiny BERT of tiny_trainer.py on the
docs' random dataset, on the CPU. With `--probe` it adds gpuanat's probe for such a loop, `gpuanat.probe.track`.

    python tests/scripts/tiny_plain_loop.py [--probe] [--samples N] [--batch-size N] [--grad-accum N] ...

(options: tiny_loop_common.py)
"""

from __future__ import annotations

import contextlib
import time

import torch
from tiny_loop_common import build, fail_here, mark_ready, options


def main() -> None:
    args = options(__doc__)
    time.sleep(args.start_delay_s)
    model, loader = build(args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    probe = contextlib.nullcontext()
    if args.probe:
        import gpuanat.probe

        probe = gpuanat.probe.track(model, optimizer, total_steps=len(loader) // args.grad_accum * args.epochs)
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
                optimizer.step()
                optimizer.zero_grad()
                step += 1
                if tracker is not None:
                    tracker.step(samples=len(inputs) * args.grad_accum, loss=loss)
                mark_ready(args, step)
    time.sleep(args.hold_s)


if __name__ == "__main__":
    main()
