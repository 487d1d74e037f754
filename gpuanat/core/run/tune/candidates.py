"""The candidates of one search: the batch ladder, the moves one step from the best, and what a failed trial
rules out.

Every candidate is checked against the memory prediction (`Predictor`) before it runs: one predicted not to fit
the GPU's memory less `MEMORY_MARGIN_FRACTION` is refused without running (`Pruned`), and a move that changes the
memory, say fp32 in place of bf16, first steps its batch down the ladder to the largest that fits. A trial that
runs out of memory or fails marks its direction dead (`Search.mark_failed`): the same value of that technique is
not tried again, and after an OOM no batch at least as large with the same memory-relevant techniques.

The whole model compiled is never a candidate: the prediction does not cover its memory (`compiled`; on the H100
bert-large took 1.7x eager's). Its regions compiled are, predicted as eager. Only a user who gives --compile trains
it, every trial then compiled: the prediction it is pruned with is eager's, which bounds nothing (`Predictor`).
"""

from __future__ import annotations

from typing import Any

from gpuanat.core.memory.allocation_templates import largest_batch
from gpuanat.core.memory.data_length import at_data_length, data_prediction
from gpuanat.core.memory.predict import unreadable_model_reason
from gpuanat.core.run.tune.result import Pruned, TuneTrial
from gpuanat.core.run.tune.space import DIMENSION_FIELDS, MEMORY_MARGIN_FRACTION, SearchSpace, searched_fields
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.techniques import (
    WEIGHTS_MODES,
    compile_mode,
    weights_mode,
    with_compile_mode,
    with_distributed,
    with_weights_mode,
)

WORKER_COUNTS = (0, 2)
COMPILE_CANDIDATES = ("regions", "off")
"""What the compile move tries (`compile_mode`): not the whole model, whose memory the prediction does not cover."""
TOP_RUNG_MULTIPLE = 8
"""Besides powers of two, the batch ladder's top rung is the largest batch predicted to fit, rounded down to a
multiple of 8 (tensor-core friendly): bert-large bf16 on an 80 GiB GPU fits 140, above the 128 rung."""
MEMORY_RELEVANT_FIELDS = (
    "precision",
    "weights_dtype",
    "autocast",
    "grad_checkpointing",
    "selective_checkpointing",
    "optim",
    "attn",
    "compile",
    "compile_regions",
    "expandable_segments",
    "liger",
    "liger_layers",
    "distributed",
)
"""Techniques that change what a batch needs: a trial that ran out of memory rules out larger batches only for
the same values of these."""

GIB = 1024**3


def _powers_of_two(limit: int) -> list[int]:
    return [1 << exponent for exponent in range(limit.bit_length()) if 1 << exponent <= limit]


class Predictor:
    """The memory prediction, asked the same questions many times: answers kept. For the whole model compiled (the
    user's --compile, never a candidate of the search) the largest batch is eager's, no bound (`largest_batch`
    reads it from the eager bytes model), and no peak is predicted. A --data run's candidates are predicted at the
    length of its longest batch, whose rows are at most `data_longest_row` tokens (`memory.data_length`)."""

    def __init__(self, space: SearchSpace, data_longest_row: int | None = None) -> None:
        self.space = space
        self.data_longest_row = data_longest_row
        self._largest: dict[RunConfig, int] = {}

    def largest_fitting(self, config: RunConfig) -> int | None:
        """The largest batch predicted to fit with `config`'s other techniques (None: no limit known)."""
        usable = self.space.usable_memory_bytes
        if usable is None or unreadable_model_reason(config) is not None:
            return None
        key = at_data_length(config, self.data_longest_row).replace(batch_size=1)
        if key not in self._largest:
            self._largest[key] = largest_batch(key, usable).batch_size
        return self._largest[key]

    def fits(self, config: RunConfig) -> bool:
        largest = self.largest_fitting(config)
        return largest is None or config.batch_size <= largest

    def peak_device_bytes(self, config: RunConfig) -> int | None:
        predicted = data_prediction(config, self.data_longest_row)
        return predicted.peak_device_bytes if predicted is not None else None


class Search:
    """The state of one search: what was tried, refused and ruled out."""

    def __init__(self, base: RunConfig, space: SearchSpace, predictor: Predictor) -> None:
        self.base = base
        self.space = space
        self.predictor = predictor
        self.tried: dict[RunConfig, TuneTrial] = {}
        self.pruned: dict[RunConfig, Pruned] = {}
        self.dead: set[tuple[str, tuple[Any, ...]]] = set()
        self.oom_batches: dict[tuple[Any, ...], int] = {}

    # The batch ladder

    def with_batch(self, config: RunConfig, batch_size: int) -> RunConfig:
        if self.space.effective_batch is not None:
            return config.replace(batch_size=batch_size, grad_accum=self.space.effective_batch // batch_size)
        return config.replace(batch_size=batch_size)

    def ladder(self, config: RunConfig) -> list[int]:
        """Batches the search may try with `config`'s techniques, smallest first: powers of two (dividing the
        effective batch when one is kept, and the effective batch itself), and the largest predicted to fit."""
        effective = self.space.effective_batch
        rungs = set(_powers_of_two(self.space.max_batch))
        if effective is not None:
            rungs = {rung for rung in rungs if effective % rung == 0} | {effective}
        largest = self.predictor.largest_fitting(config)
        if largest is not None and effective is None:
            top = min(largest, self.space.max_batch) // TOP_RUNG_MULTIPLE * TOP_RUNG_MULTIPLE
            if top > 0:
                rungs.add(top)
        return sorted(rung for rung in rungs if rung <= self.space.max_batch)

    def largest_fitting_rung(self, config: RunConfig, powers_only: bool = False) -> RunConfig | None:
        """`config` at the largest rung predicted to fit (only powers of two and the effective batch when
        `powers_only`); None when none does."""
        for rung in reversed(self.ladder(config)):
            if powers_only and rung & (rung - 1) and rung != self.space.effective_batch:
                continue
            candidate = self.with_batch(config, rung)
            if self.predictor.fits(candidate) and not self._batch_dead(candidate):
                return candidate
        return None

    # Candidates

    def start(self) -> RunConfig:
        """The strong start, before its batch is chosen."""
        config, searched = self.base, searched_fields(self.space)
        changes: dict[str, Any] = {
            "precision": self.space.half_precision,
            "tf32": self.space.tf32_available,
            "attn": "sdpa",
            "optim": "adamw_torch_fused",
            "grad_checkpointing": False,
            "compile": False,
            "compile_regions": False,
        }
        config = config.replace(**{name: value for name, value in changes.items() if name in searched})
        if "distributed" in self.space.dimensions and not self.predictor.fits(self.with_batch(config, 1)):
            # no batch fits as the state is spread: the least sharding that lets one fit (ZeRO-1, …, FSDP2)
            for technique in self.space.distributed_techniques:
                candidate = with_distributed(config, technique)
                if self.predictor.fits(self.with_batch(candidate, 1)):
                    return candidate
        return config

    def _fitted(self, candidate: RunConfig, dimension: str) -> RunConfig | None:
        """`candidate`, or with its batch stepped down to the largest rung that fits when the batch is searched;
        None (and the refusal noted) when it cannot fit."""
        if self.predictor.fits(candidate):
            return candidate
        self.note_pruned(candidate, dimension)
        if "batch" not in self.space.dimensions:
            return None
        smaller = [rung for rung in self.ladder(candidate) if rung < candidate.batch_size]
        for rung in reversed(smaller):
            stepped = self.with_batch(candidate, rung)
            if self.predictor.fits(stepped):
                return stepped
        return None

    def note_pruned(self, candidate: RunConfig, dimension: str) -> None:
        if candidate in self.pruned:
            return
        largest = self.predictor.largest_fitting(candidate)
        usable = self.space.usable_memory_bytes
        total = self.space.gpu_memory_bytes
        reason = (
            f"predicted not to fit {usable / GIB:.2f} GiB (the GPU's {total / GIB:.2f} GiB less a "
            f"{MEMORY_MARGIN_FRACTION:.0%} margin): the largest batch predicted to fit with these techniques is "
            f"{largest}"
            if usable is not None and total is not None
            else ""
        )
        self.pruned[candidate] = Pruned(candidate, dimension, reason, self.predictor.peak_device_bytes(candidate))

    def alternatives(self, dimension: str, center: RunConfig) -> list[RunConfig]:
        """The candidates of one move away from `center` along `dimension`, each fitted to the memory (those that
        cannot fit are noted as pruned and left out)."""
        candidates: list[RunConfig | None] = []
        if dimension == "batch":
            ladder = sorted(set(self.ladder(center)) | {center.batch_size})
            position = ladder.index(center.batch_size)
            for neighbour in (
                ladder[position - 1] if position > 0 else None,
                ladder[position + 1] if position + 1 < len(ladder) else None,
            ):
                if neighbour is None:
                    continue
                candidate = self.with_batch(center, neighbour)
                if self.predictor.fits(candidate):
                    candidates.append(candidate)
                else:
                    self.note_pruned(candidate, dimension)
        elif dimension == "precision":  # a bf16 model computes in bf16: another precision brings fp32 weights back
            for precision in (self.space.half_precision, "fp32"):
                if precision != center.precision:
                    moved = center.replace(precision=precision)
                    if precision != "bf16":
                        moved = with_weights_mode(moved, "fp32")
                    candidates.append(self._fitted(moved, dimension))
        elif dimension == "weights":
            for mode in WEIGHTS_MODES:
                if mode != weights_mode(center):
                    candidates.append(self._fitted(with_weights_mode(center, mode), dimension))
        elif dimension == "tf32":
            candidates.append(center.replace(tf32=not center.tf32))
        elif dimension == "attn":
            candidates.append(
                self._fitted(center.replace(attn="eager" if center.attn == "sdpa" else "sdpa"), dimension)
            )
        elif dimension == "optim":
            candidates.extend(
                self._fitted(center.replace(optim=optim), dimension)
                for optim in self.space.optimizers
                if optim != center.optim
            )
        elif dimension == "distributed":
            candidates.extend(
                self._fitted(with_distributed(center, technique), dimension)
                for technique in self.space.distributed_techniques
                if technique != center.distributed
            )
        elif dimension == "grad-checkpointing":
            candidates.extend(self._checkpointing_moves(center))
        elif dimension == "workers":
            candidates.extend(center.replace(workers=workers) for workers in WORKER_COUNTS if workers != center.workers)
        elif dimension == "engine":
            candidates.append(center.replace(engine="accelerate" if center.engine == "trainer" else "trainer"))
        elif dimension == "compile":  # eager and regions compiled: the whole model's memory is not predicted
            for mode in COMPILE_CANDIDATES:
                if mode != compile_mode(center):
                    candidates.append(self._fitted(with_compile_mode(center, mode), dimension))
        elif dimension in ("expandable-segments", "liger"):  # each field of the dimension flipped together
            names = DIMENSION_FIELDS[dimension]
            on = not any(getattr(center, name) for name in names)
            candidates.append(self._fitted(center.replace(**dict.fromkeys(names, on)), dimension))
        return [candidate for candidate in dict.fromkeys(candidates) if candidate is not None and candidate != center]

    def _checkpointing_moves(self, center: RunConfig) -> list[RunConfig | None]:
        """Checkpointing trades speed for memory, so each mode (full, selective) is tried only where it lets a
        larger batch fit: on, at the largest power of two that fits with it, when that is larger than the largest
        without checkpointing. Off again (from a start the user gave it in) at the largest batch that fits."""
        moves: list[RunConfig | None] = []
        without_checkpointing = center.replace(grad_checkpointing=False, selective_checkpointing=False)
        if center.grad_checkpointing:
            moves.append(self._fitted(without_checkpointing, "grad-checkpointing"))
        searching_batch = "batch" in self.space.dimensions
        without = self.largest_fitting_rung(without_checkpointing, powers_only=True) if searching_batch else None
        for selective in (False, True):
            if center.grad_checkpointing and center.selective_checkpointing == selective:
                continue
            mode = center.replace(grad_checkpointing=True, selective_checkpointing=selective)
            if not searching_batch:
                moves.append(self._fitted(mode, "grad-checkpointing"))
                continue
            with_mode = self.largest_fitting_rung(mode, powers_only=True)
            if with_mode is not None and (without is None or with_mode.batch_size > without.batch_size):
                moves.append(with_mode)
        return moves

    # What failed

    @staticmethod
    def _direction(dimension: str, config: RunConfig) -> tuple[str, tuple[Any, ...]]:
        return dimension, tuple(getattr(config, name) for name in DIMENSION_FIELDS[dimension])

    @staticmethod
    def _memory_signature(config: RunConfig) -> tuple[Any, ...]:
        return (*(getattr(config, name) for name in MEMORY_RELEVANT_FIELDS), config.grad_accum > 1)

    def _batch_dead(self, config: RunConfig) -> bool:
        limit = self.oom_batches.get(self._memory_signature(config))
        return limit is not None and config.batch_size >= limit

    def is_dead(self, dimension: str, config: RunConfig) -> bool:
        return self._batch_dead(config) or (
            dimension not in ("start", "batch") and self._direction(dimension, config) in self.dead
        )

    def mark_failed(self, trial: TuneTrial) -> None:
        if trial.status == "oom":
            signature = self._memory_signature(trial.config)
            self.oom_batches[signature] = min(
                self.oom_batches.get(signature, trial.config.batch_size), trial.config.batch_size
            )
        if trial.dimension not in ("start", "batch"):
            self.dead.add(self._direction(trial.dimension, trial.config))

    def untried(self, center: RunConfig) -> list[RunConfig]:
        """Candidates one move from `center` still to try: the trials the search runs before it ends, if no move
        from `center` helps (those of this round's dimensions still to come, and of the next round's for the
        dimensions passed before `center` became the best)."""
        return [
            candidate
            for dimension in self.space.dimensions
            for candidate in self.alternatives(dimension, center)
            if candidate not in self.tried and not self.is_dead(dimension, candidate)
        ]
