"""A plain PyTorch loop that runs out of GPU memory in its optimizer's step (#49's "an optimizer step" case).

Run under gpuanat (`gpuanat run --script benchmarks/oom/optimizer_step.py --json --keep-oom-snapshot F.pickle`) or
alone with `--events FILE` (the probe's event lines written there: a recorded GPU failure for CI to replay). A GPT-2
shaped decoder (transformers, random weights) trains with AdamW; before its first optimizer step, a ballast tensor
takes all the free memory but half of what Adam's two fp32 states need, so the step fails creating them.
"""

from __future__ import annotations

import argparse
import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from gpuanat.core.vocabulary.protocol import encode
from gpuanat.probe import track


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", default=None, help="also write the probe's events here")
    args = parser.parse_args()
    events = open(args.events, "wb") if args.events else None  # noqa: SIM115 (open for the run)
    emit = (lambda event: events.write(encode(event))) if events else None
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=24, n_embd=2048, n_head=16)).cuda()  # about 1.3B parameters
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, foreach=False)
    state_bytes = 2 * sum(p.numel() * 4 for p in model.parameters())
    ballast = None

    def fill_before_step(opt, args, kwargs):
        nonlocal ballast
        if ballast is None:
            torch.cuda.empty_cache()  # the cache would hold the states: the ballast leaves only free memory
            free, _ = torch.cuda.mem_get_info()
            ballast = torch.empty(max(0, free - state_bytes // 2), dtype=torch.uint8, device="cuda")

    optimizer.register_step_pre_hook(fill_before_step)
    ids = torch.randint(0, 50257, (4, 512), device="cuda")
    kwargs = {"emit": emit} if emit else {}
    with track(model, optimizer, total_steps=3, **kwargs) as probe:
        for _ in range(3):  # the first step's optimizer step fails
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            probe.step(loss=loss)
    return 0


if __name__ == "__main__":
    sys.exit(main())
