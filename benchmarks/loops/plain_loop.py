"""A plain PyTorch training loop on a causal LM from a config.json, bf16 weights, fused AdamW, on one GPU; with
`--probe`, measured by `gpuanat.probe.track`. `train(args)` is what benchmarks/loop_probe_cost.py alternates.

    python benchmarks/loops/plain_loop.py [--probe] [--config DIR] [--seq-len N] [--batch-size N] [--steps N]
    torchrun --nproc-per-node 2 benchmarks/loops/plain_loop.py --fsdp --probe ...   (FSDP2, a GPU a rank)
"""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).parent))
from common import SteadyClock, build_model, device, options, random_tokens, report


def sharded(model: torch.nn.Module) -> torch.nn.Module:
    """FSDP2 as torchtitan applies it: each decoder layer, then the model (its embeddings and head), `fully_shard`ed
    over this job's ranks."""
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    if not dist.is_initialized():
        if device().type == "cuda":
            torch.cuda.set_device(device())
        dist.init_process_group("nccl" if device().type == "cuda" else "gloo")
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    return model


def train(args: Any, model: torch.nn.Module | None = None) -> dict[str, Any]:
    model = model if model is not None else build_model(args)
    if args.fsdp:
        model = sharded(model)
    # fused AdamW on one GPU; over FSDP2's sharded parameters (DTensors), the default (foreach) implementation
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=device().type == "cuda" and not args.fsdp)
    tokens = random_tokens(args, model.config.vocab_size, args.batch_size * 8)
    clock = SteadyClock(args.warmup, args.steps, args.step_times)
    probe = contextlib.nullcontext()
    if args.probe:
        import gpuanat.probe

        probe = gpuanat.probe.track(model, optimizer, total_steps=args.steps)
    model.train()
    with probe as tracker:
        for step in range(1, args.steps + 1):
            rows = slice((step % 8) * args.batch_size, (step % 8 + 1) * args.batch_size)
            batch = tokens[rows].to(device(), non_blocking=True)
            loss = model(input_ids=batch, labels=batch).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if tracker is not None:
                tracker.step(samples=args.batch_size, loss=loss)
            clock.step_ended(step)
    return {"loop": "plain", "probe": args.probe, **clock.reading()}


if __name__ == "__main__":
    arguments = options(__doc__)
    report(arguments, train(arguments))
    time.sleep(arguments.hold_s)
