"""Which GPUs a run trains on: `--gpus` (as `gpu_request` reads it) checked against what NVML lists, and handed
to the child.

A run uses exactly the GPUs it was given — never one more — so the child's `CUDA_VISIBLE_DEVICES` names them, by
NVML's index with `CUDA_DEVICE_ORDER=PCI_BUS_ID` (CUDA's own default order, fastest first, can differ from NVML's
and nvidia-smi's; UUIDs would say the same, but DeepSpeed reads the variable as integers). Without
`--gpus` a run trains on one GPU: the first that no process uses. HF Trainer started with several GPUs visible
would otherwise wrap the model in `nn.DataParallel` over all of them, silently.

Indices in `--gpus` are NVML's, as nvidia-smi shows them. A user's own `CUDA_VISIBLE_DEVICES` (indices or UUIDs)
narrows the default choice and `all`; an explicit list of indices overrides it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.gpu_request import parse_gpus

VISIBLE_DEVICES_VARIABLE = "CUDA_VISIBLE_DEVICES"
DEVICE_ORDER_VARIABLE = "CUDA_DEVICE_ORDER"
PCI_BUS_ORDER = "PCI_BUS_ID"
"""NVML's order: with it, CUDA's device i is nvidia-smi's GPU i."""


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML lists it when the run starts."""

    index: int
    """NVML's index, as nvidia-smi shows it."""
    uuid: str
    name: str
    total_bytes: int | None
    used_bytes: int | None
    processes: int
    """Compute processes running on it."""

    def to_json(self) -> dict[str, object]:
        return {"index": self.index, "uuid": self.uuid, "name": self.name, "total_bytes": self.total_bytes}


@dataclass(frozen=True)
class GpuChoice:
    gpus: tuple[Gpu, ...]
    note: str | None = None
    """One line for the user when the choice is not what they might assume (a busy GPU taken)."""

    @property
    def visible_devices(self) -> str:
        """The child's CUDA_VISIBLE_DEVICES, under `CUDA_DEVICE_ORDER=PCI_BUS_ID`: rank r trains on `gpus[r]`."""
        return ",".join(str(gpu.index) for gpu in self.gpus)


def _visible_subset(gpus: Sequence[Gpu], visible: str | None) -> tuple[list[Gpu], str | None]:
    """The GPUs the user's CUDA_VISIBLE_DEVICES allows (all when unset), and what it said, for messages."""
    if visible is None or not visible.strip():
        return list(gpus), None
    allowed: list[Gpu] = []
    for entry in (part.strip() for part in visible.split(",")):
        if entry.isdigit():
            match = [gpu for gpu in gpus if gpu.index == int(entry)]
        else:
            match = [gpu for gpu in gpus if entry and gpu.uuid.startswith(entry)]
        if not match:
            break  # CUDA stops at the first entry it cannot find
        if match[0] not in allowed:
            allowed.append(match[0])
    return allowed, visible


def choose_gpus(spec: str | None, gpus: Sequence[Gpu], environment: Mapping[str, str]) -> GpuChoice:
    """The GPUs a run trains on. Raises ConfigError (flag `--gpus`) when the request cannot be met."""
    if not gpus:
        raise ConfigError("--gpus", "NVML lists no GPU on this machine")
    parsed = parse_gpus(spec) if spec is not None else 1
    if isinstance(parsed, tuple):
        by_index = {gpu.index: gpu for gpu in gpus}
        missing = [index for index in parsed if index not in by_index]
        if missing:
            raise ConfigError(
                "--gpus",
                f"no GPU {missing[0]} here: NVML lists {len(gpus)} "
                f"(indices 0-{len(gpus) - 1}, as nvidia-smi shows them)",
            )
        return GpuChoice(tuple(by_index[index] for index in parsed))
    candidates, visible = _visible_subset(gpus, environment.get(VISIBLE_DEVICES_VARIABLE))
    where = f"CUDA_VISIBLE_DEVICES={visible} allows" if visible is not None else "NVML lists"
    if parsed is None:
        if not candidates:
            raise ConfigError("--gpus", f"{where} no GPU")
        return GpuChoice(tuple(candidates))
    if parsed > len(candidates):
        raise ConfigError("--gpus", f"{parsed} GPUs asked for, but {where} {len(candidates)}")
    idle = [gpu for gpu in candidates if gpu.processes == 0]
    if len(idle) >= parsed:
        return GpuChoice(tuple(idle[:parsed]))
    # Not enough idle GPUs: the idle ones, then the busy ones with the most free memory.
    busy = sorted((gpu for gpu in candidates if gpu.processes), key=lambda gpu: (gpu.used_bytes or 0, gpu.index))
    chosen = tuple(sorted([*idle, *busy[: parsed - len(idle)]], key=lambda gpu: gpu.index))
    taken = [gpu for gpu in chosen if gpu.processes]
    note = (
        ("no idle GPU is left for this run: " if not idle else "too few idle GPUs: ")
        + "training also on "
        + ", ".join(
            f"GPU {gpu.index} ({gpu.processes} other process{'es' if gpu.processes > 1 else ''})" for gpu in taken
        )
        + " — choose with --gpus"
    )
    return GpuChoice(chosen, note)


def read_gpus() -> list[Gpu]:
    """Every GPU NVML lists, with its use now; empty when NVML is unavailable, or does not answer within the start-up
    deadline (`nvml_guard.within_deadline`). NVML: the binding the environment asks for (`nvml_faults`), else pynvml."""
    from gpuanat.core.measure.nvml_faults import binding_from_environment
    from gpuanat.core.measure.nvml_guard import within_deadline

    try:
        nvml = binding_from_environment()
        if nvml is None:
            import pynvml

            nvml = pynvml
    except Exception:  # no pynvml, an unusable fault plan: the run's NVML status says why
        return []
    return within_deadline(lambda: _listed_gpus(nvml)) or []


def _listed_gpus(pynvml: Any) -> list[Gpu]:
    from gpuanat.core.measure.nvml_source import nvml_memory_info, nvml_processes

    try:
        pynvml.nvmlInit()
    except Exception:  # no driver: the run's NVML status says why
        return []
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml_memory_info(pynvml, handle)
            uuid = pynvml.nvmlDeviceGetUUID(handle)
            name = pynvml.nvmlDeviceGetName(handle)
            gpus.append(
                Gpu(
                    index=index,
                    uuid=uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                    name=name.decode() if isinstance(name, bytes) else str(name),
                    total_bytes=int(memory.total) if memory is not None else None,
                    used_bytes=int(memory.used) if memory is not None else None,
                    processes=len(nvml_processes(pynvml, handle)),
                )
            )
        return gpus
    except Exception:  # an NVML error, or a binding without one of these calls (a replayed trace): none listed
        return []
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def gpus_for_run(config: RunConfig, environment: Mapping[str, str], listed: Sequence[Gpu]) -> GpuChoice | None:
    """The GPUs `config` trains on, given what NVML lists (`read_gpus`); None on the CPU, or where NVML lists none
    (the child's CUDA then decides: see `child_visible_devices`). Raises ConfigError when the request cannot be met
    or does not match the distributed technique."""
    if config.device != "cuda":
        return None
    if not listed:
        if config.gpus is not None:
            raise ConfigError(
                "--gpus", "NVML lists no GPU here, so GPUs cannot be chosen; set CUDA_VISIBLE_DEVICES instead"
            )
        return None
    choice = choose_gpus(config.gpus, listed, environment)
    count = len(choice.gpus)
    if config.distributed != "none" and count < 2:
        raise ConfigError(
            "--distributed",
            f"{config.distributed} spreads a run over several GPUs; --gpus {config.gpus or '1'} is one here",
        )
    if config.distributed == "none" and count > 1:
        raise ConfigError(
            "--distributed", f"none trains on one GPU; with {count} choose ddp, fsdp, zero1, zero2 or zero3"
        )
    return choice


def child_gpu_environment(
    choice: GpuChoice | None, config: RunConfig, environment: Mapping[str, str]
) -> dict[str, str]:
    """What the child's environment must say about GPUs: the chosen ones, in NVML's order; without NVML, for one
    rank, CUDA's first visible GPU alone (so Trainer never sees several and wraps the model in DataParallel)."""
    if choice is not None:
        return {VISIBLE_DEVICES_VARIABLE: choice.visible_devices, DEVICE_ORDER_VARIABLE: PCI_BUS_ORDER}
    if config.device == "cuda" and config.distributed == "none":
        visible = environment.get(VISIBLE_DEVICES_VARIABLE)
        return {VISIBLE_DEVICES_VARIABLE: visible.split(",")[0].strip() if visible and visible.strip() else "0"}
    return {}


def rank_file_path(path: str | None, environment: Mapping[str, str]) -> str | None:
    """Where this process writes a file the user named once for the whole run (a memory snapshot, an operations
    trace): `path` itself for rank 0 and a single-process run, `path` with `.rankN` before its suffix for rank N > 0
    of a distributed run, so that every rank writes its own."""
    rank = environment.get("RANK", "0")
    if path is None or not rank.isdigit() or int(rank) == 0:
        return path
    stem, dot, suffix = path.rpartition(".")
    return f"{stem}.rank{rank}.{suffix}" if dot and "/" not in suffix else f"{path}.rank{rank}"
