"""The HF docs' experiment table ("Efficient training on a single GPU"), as RunConfigs.

Every experiment keeps the docs' effective batch: the plain ones train `batch_size` samples per
step, the accumulating ones 1 sample × `batch_size` accumulation steps (the docs: 4 and 1×4).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gpuanat.core.vocabulary.config import RunConfig


@dataclass(frozen=True)
class Experiment:
    name: str
    changes: dict[str, Any]
    accumulate: bool = False
    """Train batch 1 with `batch_size` accumulation steps instead of batch `batch_size`."""

    def config(self, base: RunConfig) -> RunConfig:
        batch = {"batch_size": 1, "grad_accum": base.batch_size} if self.accumulate else {}
        return base.replace(**batch, **self.changes)


_ACCUM_GC_FP16 = {"grad_checkpointing": True, "precision": "fp16"}

EXPERIMENTS: tuple[Experiment, ...] = (
    Experiment("vanilla", {}),
    Experiment("grad accumulation", {}, accumulate=True),
    Experiment("+ grad checkpointing", {"grad_checkpointing": True}, accumulate=True),
    Experiment("fp16", {"precision": "fp16"}),
    Experiment("accum + gc + fp16", _ACCUM_GC_FP16, accumulate=True),
    Experiment("bf16", {"precision": "bf16"}),
    Experiment("tf32", {"tf32": True}),
    Experiment("adafactor", {"optim": "adafactor"}),
    Experiment("accum + gc + fp16 + adafactor", {**_ACCUM_GC_FP16, "optim": "adafactor"}, accumulate=True),
    Experiment("8-bit adam", {"optim": "adamw_bnb_8bit"}),
    Experiment("accum + gc + fp16 + 8-bit adam", {**_ACCUM_GC_FP16, "optim": "adamw_bnb_8bit"}, accumulate=True),
)

BASE_TECHNIQUE_FIELDS = ("batch_size", "grad_accum", "grad_checkpointing", "precision", "tf32", "optim")
"""Fields the experiments set; the sweep's own flags for them only choose the baseline."""
