"""The operations profiler on a small GPU model, outside any loop: every row it reads printed, so a change of
torch's profiler shows before a long run. Run first by operations_check.sh.

    python3 benchmarks/operations_smoke.py
"""

from __future__ import annotations

import torch

from gpuanat.core.vocabulary.protocol import Event
from gpuanat.worker.probe.operations import OperationsProfiler


def main() -> None:
    events: list[Event] = []
    model = torch.nn.Sequential(torch.nn.Linear(512, 512), torch.nn.GELU(), torch.nn.LayerNorm(512)).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), fused=True)
    profiler = OperationsProfiler(2, 3, cuda=True, trace_path=None, emit=events.append)
    for step in range(1, 7):
        profiler.step_begins(step)
        batch = torch.randn(64, 512, device="cuda")
        torch.nn.functional.cross_entropy(model(batch), torch.zeros(64, dtype=torch.long, device="cuda")).backward()
        optimizer.step()
        optimizer.zero_grad()
        profiler.step_ends(step)
    with torch.profiler.profile(record_shapes=True) as profile:
        model(torch.randn(64, 512, device="cuda"))
    addmm = next(event for event in profile.events() if event.name == "aten::addmm")
    print("aten::addmm", addmm.input_shapes, "dtypes", getattr(addmm, "input_dtypes", "(no input_dtypes)"))
    (operations,) = events
    print(f"wall {operations.wall_s:.4f} s, processing {operations.processing_s:.3f} s, {len(operations.kernels)} rows")
    for row in operations.kernels:
        print(
            f"{row.group:<15} {row.calls:>4} {1e6 * row.time_s:8.1f} us flops {row.flops} bytes {row.bytes} "
            f"op {row.op} optimizer {row.optimizer} :: {row.name[:120]}"
        )


if __name__ == "__main__":
    main()
