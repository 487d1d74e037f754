"""Memory sizes as a user writes them ('80GiB', '80G', '80GB', '81559MiB'), read into bytes for `--gpu-memory`
(`gpuanat predict`, `fit`, `tune`); and the mebibyte that the bytes model's constants are written in."""

from __future__ import annotations

MIB = 1024**2
SIZE_UNITS = {
    "b": 1,
    "kib": 1024,
    "mib": MIB,
    "gib": 1024**3,
    "tib": 1024**4,
    "k": 1024,
    "m": MIB,
    "g": 1024**3,
    "t": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}
MIN_GPU_MEMORY_BYTES = 64 * MIB
"""Below this a size is no GPU's memory: the CUDA context alone takes about 500 MiB. Mostly a forgotten unit."""
MAX_GPU_MEMORY_BYTES = 64 * 1024**4
"""Above this a size is no GPU's memory: the largest today have under 300 GiB."""


def parse_size(text: str) -> int:
    """Bytes of GPU memory from '80GiB', '80G' (binary), '80GB' (decimal) or '81559MiB'. A number without a unit
    is refused (is '24' GiB or bytes?), and so is a size no GPU has."""
    stripped = text.strip().replace(" ", "").lower()
    number = stripped.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = stripped[len(number) :]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if not unit and value > 0:
        raise ValueError(f"give a unit: {number}GiB, {number}G, {number}GB or {int(value * 1024)}MiB")
    if unit not in SIZE_UNITS or value <= 0:
        raise ValueError(f"not a memory size: {text!r} (write e.g. 80GiB, 24G, 40GB or 81559MiB)")
    size = int(value * SIZE_UNITS[unit])
    if not MIN_GPU_MEMORY_BYTES <= size <= MAX_GPU_MEMORY_BYTES:
        raise ValueError(f"{text} is not a GPU's memory: give a size from 64MiB to 64TiB, e.g. 80GiB")
    return size
