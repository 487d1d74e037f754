"""Public entry points of the probe, one for each kind of training loop:

- HF `Trainer` and what builds on it (TRL's trainers, axolotl): `trainer.add_callback(AnatomyCallback())`;
- a loop of one's own (plain PyTorch, Accelerate, FSDP2): `with track(model, optimizer) as probe:` … `probe.step()`;
- PyTorch Lightning: `Trainer(callbacks=[LightningAnatomyCallback()])` (needs `lightning` or `pytorch_lightning`).

Each is imported when first asked for, so the others' frameworks need not be installed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpuanat.worker.probe.hf import AnatomyCallback
    from gpuanat.worker.probe.lightning_callback import LightningAnatomyCallback
    from gpuanat.worker.probe.plain_loop import LoopProbe, track

__all__ = ["AnatomyCallback", "LightningAnatomyCallback", "LoopProbe", "track"]


def __getattr__(name: str) -> Any:
    if name == "AnatomyCallback":
        from gpuanat.worker.probe.hf import AnatomyCallback

        return AnatomyCallback
    if name in ("track", "LoopProbe"):
        from gpuanat.worker.probe import plain_loop

        return getattr(plain_loop, name)
    if name == "LightningAnatomyCallback":
        from gpuanat.worker.probe.lightning_callback import LightningAnatomyCallback

        return LightningAnatomyCallback
    raise AttributeError(f"module 'gpuanat.probe' has no attribute {name!r}")
