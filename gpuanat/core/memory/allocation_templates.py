"""The largest batch that fits, by replaying recorded allocations (`gpuanat.core.memory.allocator`) where a recording
exists, else by the bytes model (`gpuanat.core.memory.predict.max_batch_size`).

The templates in gpuanat/data/allocation/ were recorded on an H100 (benchmarks/allocation_trace.py, built by
benchmarks/build_allocation_templates.py) for bert-large at seq 512 and the technique sets of the largest-batch
trials. A template holds for the torch, CUDA and transformers it was recorded with; another GPU of the same
software is taken to leave the allocator its memory less what the H100 did not (driver, CUDA context).
"""

from __future__ import annotations

import functools
import gzip
import importlib.metadata
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuanat.core.memory.allocator import AllocationTemplate, Replay
from gpuanat.core.memory.predict import max_batch_size
from gpuanat.core.memory.reserve import reserve_above_peak_bytes
from gpuanat.core.vocabulary.config import RunConfig

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "data" / "allocation"
REQUEST_FIELDS = ("preset", "seq_len", "precision", "grad_checkpointing", "optim", "attn", "grad_accum")
"""The techniques that change what a run asks the allocator for (expandable segments changes only how it is
served; tf32, the DataLoader's workers and pinning change neither)."""
SCAN_ABOVE = 8
"""The replay's fits are not monotone in the batch near the limit (a layout can fit where one sample fewer does
not): above the edge the bisection finds, this many more batches are replayed and the largest that fits wins."""


def template_name(config_json: dict[str, Any]) -> str:
    config = RunConfig.from_json(config_json)
    return "_".join(f"{field}-{getattr(config, field)}" for field in REQUEST_FIELDS) + ".json.gz"


@dataclass(frozen=True)
class RecordedTemplate:
    template: AllocationTemplate
    unavailable_bytes: int
    """The recording GPU's memory (NVML total) less what its allocator could reserve."""
    recorded_with: dict[str, str]
    """The GPU, torch and transformers it was recorded with."""


@functools.cache
def load_template(name: str) -> RecordedTemplate | None:
    path = TEMPLATES_DIR / name
    if not path.is_file():
        return None
    with gzip.open(path, "rt") as file:
        document = json.load(file)
    template = AllocationTemplate(
        operations=tuple(document["operations"]),
        base_bytes=tuple(document["base_bytes"]),
        per_sample_bytes=tuple(document["per_sample_bytes"]),
        recorded_batch_sizes=tuple(document["recorded_batch_sizes"]),
    )
    return RecordedTemplate(
        template, document["gpu_memory_bytes"] - document["capacity_bytes"], document["recorded_with"]
    )


UNRECORDED_CHANGES = (
    ("weights_dtype", "fp32"),
    ("autocast", True),
    ("lora", 0),
    ("load_in_4bit", False),
    ("liger", False),
    ("liger_layers", False),
)
"""Fields outside a template's name (`REQUEST_FIELDS`) that change the allocations, at the value every template was
recorded with: a run with another value has no recording (pure bf16's bert-large fits 181 by the bytes model, which
its H100 runs bear out, where the fp32-weights template would say 142)."""


def template_for(config: RunConfig) -> RecordedTemplate | None:
    if config.model is not None or config.compile or config.device != "cuda":
        return None
    if any(getattr(config, field) != recorded for field, recorded in UNRECORDED_CHANGES):
        return None
    return load_template(template_name(config.to_json()))


@dataclass(frozen=True)
class LargestBatch:
    batch_size: int
    method: str
    """"replay" (of a recorded run's allocations), "stream" (of the allocations derived from the model and the
    techniques: a causal LM on one GPU, `reserve`) or "model" (bytes and a fragmentation allowance)."""
    least_left_bytes: int | None = None
    """With the replay: the least the device had left at that batch, after any reservation (at least the driver's
    page, `DRIVER_PAGE_BYTES`). A few MiB is as near the edge as the recorded GPU's capacity was read: to the byte,
    but once per precision."""
    recorded_with: dict[str, str] | None = None
    """With the replay: the GPU, torch and transformers of the recorded run."""
    model_batch_size: int = 0
    """The bytes model's answer (`predict.max_batch_size`), which is the answer without a template."""


@functools.cache
def _replayed(name: str, gpu_memory_bytes: int, expandable_segments: bool, start: int) -> tuple[int, int | None]:
    recorded = load_template(name)
    assert recorded is not None
    capacity = gpu_memory_bytes - recorded.unavailable_bytes

    replays: dict[int, Replay] = {}

    def fits(batch_size: int) -> bool:
        if batch_size not in replays:
            replays[batch_size] = recorded.template.replay(
                batch_size, capacity, expandable_segments=expandable_segments
            )
        return replays[batch_size].fits

    if not fits(1):
        return 0, None
    low, high = 1, max(2, start)
    while fits(high):  # from the model's estimate, double until one does not fit
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    largest = max([low] + [batch for batch in range(low + 1, low + 1 + SCAN_ABOVE) if fits(batch)])
    return largest, replays[largest].least_left_bytes


def largest_batch(config: RunConfig, gpu_memory_bytes: int) -> LargestBatch:
    """The largest per-device batch predicted to fit a GPU of `gpu_memory_bytes` (NVML's total)."""
    estimate = max_batch_size(config, gpu_memory_bytes)
    recorded = template_for(config) if config.distributed == "none" else None  # recorded on one GPU alone
    if recorded is None:
        method = "stream" if reserve_above_peak_bytes(config) is not None else "model"
        return LargestBatch(estimate, method, model_batch_size=estimate)
    batch_size, least_left = _replayed(
        template_name(config.to_json()), gpu_memory_bytes, config.expandable_segments, max(1, estimate)
    )
    return LargestBatch(batch_size, "replay", least_left, recorded.recorded_with, estimate)


def version_differences(recorded_with: dict[str, str]) -> list[str]:
    """The packages whose installed major.minor version is not the one a template was recorded with (read from
    the installed metadata: torch is not imported)."""
    differences = []
    for package in ("torch", "transformers"):
        try:
            installed = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            continue
        if installed.split(".")[:2] != recorded_with[package].split(".")[:2]:
            differences.append(f"{package} {installed} here, {recorded_with[package]} recorded")
    return differences
