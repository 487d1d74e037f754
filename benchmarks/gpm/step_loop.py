"""Training steps of known character, through gpuanat's probe for a loop of one's own (issue #51's check of a run's
steady medians): `gemm` (a model of bf16 8192² matmuls: tensor-pipe bound), `elementwise` (adds and multiplies over a
1 GiB parameter: DRAM bound), `launch` (one-element kernels from a Python loop: launch bound). Each step is a forward,
a backward and an SGD step; the loss a tensor (read every 10 steps, as Trainer does).

    gpuanat run --script benchmarks/gpm/step_loop.py --json -- gemm --steps 300
"""

from __future__ import annotations

import argparse

import torch

import gpuanat.probe


class Gemm(torch.nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(size, size, dtype=torch.bfloat16) / size**0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            x = x @ self.weight
        return x.float().square().mean()


class Elementwise(torch.nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight * x
        for _ in range(3):
            y = y * 0.5 + x
        return y.mean()


class Launch(torch.nn.Module):
    def __init__(self, _size: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.weight + x
        for _ in range(200):
            y = y + 1.0
        return y.sum()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("kind", choices=("gemm", "elementwise", "launch"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--scale", type=int, default=1, help="divide the sizes by this (a CPU smoke test)")
    args = parser.parse_args()
    size = {"gemm": 8192, "elementwise": 256 * 1024 * 1024, "launch": 1}[args.kind] // args.scale
    model = {"gemm": Gemm, "elementwise": Elementwise, "launch": Launch}[args.kind](size)
    x = {
        "gemm": lambda: torch.randn(size, size, dtype=torch.bfloat16) / size**0.5,
        "elementwise": lambda: torch.randn(size),
        "launch": lambda: torch.zeros(1),
    }[args.kind]()
    model, x = model.to(args.device), x.to(args.device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6)
    with gpuanat.probe.track(model, optimizer, total_steps=args.steps) as probe:
        for _ in range(args.steps):
            loss = model(x)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if probe.step(samples=1, loss=loss):
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
