"""`--gpus` as plain data: a count, a list of NVML indices, or all, read without NVML.

`RunConfig` keeps `--gpus` as the user gave it; this module says what it asks for, so the config knows its ranks
and its validation refuses a spec that does not parse before anything starts. Which GPUs a run then gets is
`gpus`'s work, against what NVML lists.
"""

from __future__ import annotations

from gpuanat.core.vocabulary.errors import ConfigError

MAX_GPUS = 64
"""More GPUs than any single host has; a run spans one host."""


def parse_gpus(spec: str) -> int | tuple[int, ...] | None:
    """`--gpus` as a count (`2`), a list of NVML indices (`0,2`), or None for `all`. A single number is a count
    (`--gpus 1` is one GPU, the first idle one); one particular GPU is a list of one, `--gpus 3,`."""
    text = spec.strip().lower()
    if text == "all":
        return None
    if "," in text:
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if not parts or not all(part.isdigit() for part in parts):
            raise ConfigError("--gpus", f"a list is NVML indices separated by commas, e.g. 0,2 (got {spec!r})")
        indices = tuple(int(part) for part in parts)
        if len(set(indices)) != len(indices):
            raise ConfigError("--gpus", f"GPU {next(i for i in indices if indices.count(i) > 1)} is listed twice")
        if len(indices) > MAX_GPUS:
            raise ConfigError("--gpus", f"at most {MAX_GPUS} GPUs (got {len(indices)})")
        return indices
    if not text.isdigit() or int(text) < 1:
        raise ConfigError("--gpus", f"must be a count (2), a list of GPU indices (0,2) or all (got {spec!r})")
    if int(text) > MAX_GPUS:
        raise ConfigError("--gpus", f"at most {MAX_GPUS} GPUs (got {int(text)})")
    return int(text)


def requested_count(spec: str | None) -> int | None:
    """How many GPUs `spec` asks for; None for `all` (known once NVML is read). No spec is one GPU."""
    if spec is None:
        return 1
    parsed = parse_gpus(spec)
    if parsed is None:
        return None
    return parsed if isinstance(parsed, int) else len(parsed)
