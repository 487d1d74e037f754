"""A configuration as a run: what a trial trains and its name in the history, and the `gpuanat run` command that
trains the configuration a search found.
"""

from __future__ import annotations

import shlex
from dataclasses import fields

from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.techniques import TECHNIQUES


def trial_config(config: RunConfig, trial_steps: int) -> RunConfig:
    """What a trial trains: `trial_steps` optimizer steps, on a dataset of exactly that many full batches."""
    ranks = config.ranks or 1
    return config.replace(
        max_steps=trial_steps, epochs=1, samples=config.batch_size * config.grad_accum * ranks * trial_steps
    )


def trial_name(index: int, config: RunConfig) -> str:
    return f"tune {index}: {config.techniques_summary()}"


def run_flags(config: RunConfig) -> list[str]:
    """`config` as `gpuanat run` flags: every technique that differs from RunConfig's defaults, and on CUDA the
    allocator's expandable segments either way (the default follows the user's PYTORCH_CUDA_ALLOC_CONF)."""
    defaults = {item.name: item.default for item in fields(RunConfig)}
    flags: list[str] = []
    for technique in TECHNIQUES:
        value = getattr(config, technique.field)
        explicit = technique.field == "expandable_segments" and config.device == "cuda"
        if value == defaults.get(technique.field) and not explicit:
            continue
        if technique.kind == "bool":
            flags.append(technique.flag if value else "--no-" + technique.flag.removeprefix("--"))
        elif value is not None:
            flags.extend([technique.flag, str(value)])
    return flags


def run_command(config: RunConfig) -> str:
    return shlex.join(["gpuanat", "run", *run_flags(config)])
