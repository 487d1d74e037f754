"""How far to trust a prediction, from what was measured nearby: the errors of today's prediction on the plain HF
Trainer runs measured on the H100 (gpuanat/data/measured_predictions.json, written by
benchmarks/measured_predictions.py), for the same family and techniques where there are such runs, else the family's
other runs, else every family's runs with these techniques — for the peak allocated and the peak reserved memory.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuanat.core.memory.bands.precision import is_mixed
from gpuanat.core.vocabulary.config import RunConfig

TABLE_PATH = Path(__file__).resolve().parents[2] / "data" / "measured_predictions.json"
TRUSTED_PERCENT = 10.0
"""A prediction whose nearby runs erred by more than this says so."""


def technique_kind(config: RunConfig) -> str:
    """The techniques that move the memory most, as the table groups runs: what is trained and in which dtype, and
    checkpointing, an 8-bit optimizer or eager attention."""
    if config.lora:
        kind = "LoRA"
    elif config.weights_dtype != "fp32":
        kind = f"{config.weights_dtype} weights"
    else:
        kind = "fp32 weights under autocast" if is_mixed(config) else "fp32"
    extras = [
        *(["checkpointing"] if config.grad_checkpointing else []),
        *(["8-bit Adam"] if config.optim == "adamw_bnb_8bit" else []),
        *(["eager attention"] if config.attn == "eager" else []),
    ]
    return " + ".join([kind, *extras])


@functools.cache
def _table() -> tuple[dict[str, Any], ...]:
    try:
        return tuple(json.loads(TABLE_PATH.read_text()))
    except (OSError, ValueError):
        return ()


def measured_families() -> frozenset[str]:
    """The families with H100 runs on record (`gpuanat --model` configs read as these were checked)."""
    return frozenset(str(row["family"]) for row in _table())


@dataclass(frozen=True)
class MeasuredNearby:
    text: str
    """One sentence: which runs, and the errors of the peak allocated and the peak reserved on them."""
    runs: int
    worst_allocated_percent: float | None
    worst_reserved_percent: float | None
    same_techniques: bool = False
    """The runs are of the same family with the same techniques (`technique_kind`)."""

    @property
    def trusted(self) -> bool:
        """Whether the nearby runs all came within `TRUSTED_PERCENT`, allocated and reserved."""
        return self.runs > 0 and all(
            worst is not None and abs(worst) <= TRUSTED_PERCENT
            for worst in (self.worst_allocated_percent, self.worst_reserved_percent)
        )


def _span(rows: list[dict[str, Any]], key: str) -> tuple[float, float]:
    values = [float(row[key]) for row in rows]
    return min(values), max(values)


def _range(span: tuple[float, float]) -> str:
    """ "-1.5..+0.2%", or one value where the runs agree to the tenth."""
    low, high = f"{span[0]:+.1f}", f"{span[1]:+.1f}"
    return f"{low}%" if low == high else f"{low}..{high}%"


def _worst(rows: list[dict[str, Any]], key: str) -> float:
    return max((float(row[key]) for row in rows), key=abs)


def measured_nearby(config: RunConfig, family: str) -> MeasuredNearby:
    """What the H100 runs nearest to `config` (a model of `family`) say of its prediction."""
    table = _table()
    kind = technique_kind(config)
    same = [row for row in table if row["family"] == family and row["kind"] == kind]
    relatives = [row for row in table if row["family"] == family]
    if same or relatives:
        rows = same or relatives
        which = f"{family} ({kind})" if same else f"{family} (other techniques than {kind})"
        allocated, reserved = _span(rows, "allocated_error_percent"), _span(rows, "reserved_error_percent")
        text = (
            f"measured on {len(rows)} H100 run{'s' if len(rows) > 1 else ''} of {which}: peak allocated "
            f"{_range(allocated)}, peak reserved {_range(reserved)}"
        )
    else:
        rows = [row for row in table if row["kind"] == kind]
        if not rows:
            return MeasuredNearby(f"no H100 run with {kind} was measured", 0, None, None)
        families = len({row["family"] for row in rows})
        within = sum(abs(float(row["reserved_error_percent"])) <= 5 for row in rows)
        text = (
            f"no {family} run was measured; on {len(rows)} H100 runs of {families} other families ({kind}) the "
            f"peak reserved came within 5% on {within}, worst {_worst(rows, 'reserved_error_percent'):+.1f}%"
        )
        return MeasuredNearby(
            text,
            0,
            _worst(rows, "allocated_error_percent"),
            _worst(rows, "reserved_error_percent"),
        )
    nearby = MeasuredNearby(
        text, len(rows), _worst(rows, "allocated_error_percent"), _worst(rows, "reserved_error_percent"), bool(same)
    )
    if not nearby.trusted:
        return dataclasses.replace(nearby, text=f"{text} — off by more than {TRUSTED_PERCENT:.0f}% there")
    return nearby
