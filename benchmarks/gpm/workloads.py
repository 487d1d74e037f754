"""Steps of known character for issue #51's check, each for --seconds on GPU 0, printing its wall window as JSON:
`gemm` (bf16 8192² matmuls: tensor-pipe bound), `elementwise` (adds and multiplies over 1 GiB tensors: DRAM bound),
`launch` (one-element kernels from a Python loop: launch bound).

    python benchmarks/gpm/workloads.py gemm --seconds 20
"""

from __future__ import annotations

import argparse
import json
import time

import torch


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("gemm", "elementwise", "launch"))
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    device = torch.device("cuda")
    if args.kind == "gemm":
        a = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)
        b = torch.randn(8192, 8192, device=device, dtype=torch.bfloat16)

        def step() -> None:
            for _ in range(8):
                torch.mm(a, b)
    elif args.kind == "elementwise":
        x = torch.randn(256 * 1024 * 1024, device=device)
        y = torch.randn_like(x)

        def step() -> None:
            for _ in range(4):
                torch.add(x, y, out=x)
                torch.mul(x, 0.5, out=x)
    else:
        z = torch.zeros(1, device=device)

        def step() -> None:
            for _ in range(200):
                z.add_(1.0)

    step()
    torch.cuda.synchronize()
    started = time.time()
    steps = 0
    while time.time() - started < args.seconds:
        step()
        steps += 1
        if steps % 10 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    print(json.dumps({"kind": args.kind, "start_wall_s": started, "end_wall_s": time.time(), "steps": steps}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
