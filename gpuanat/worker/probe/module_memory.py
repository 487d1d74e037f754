"""Memory by module: which module's forward (or backward) runs, what autograd saves for backward in it, and the
parameters, gradients and optimizer state each module owns.

Followed on the probe's measured steps only — global module hooks and saved-tensor hooks cost a Python call a module
and a saved tensor, too much for every step — and never under torch.compile (hooks would enter the graph). Each
distinct storage autograd saves is attributed to the innermost module whose forward was running when it was first
saved (MemTracker attributes a tensor to the module that created it: the same layers, at times another leaf), and
held by weak references, so what is still alive can be told at any moment of the step: at the end of the forward
pass (the peak) every saved tensor is; during the backward, those not yet freed.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from gpuanat.core.vocabulary.protocol import MODULES_REST, NO_MODULE, LiveTensor, ModuleMemory
from gpuanat.worker.probe.tensors import local_shards, optimizer_chain

TOP_MODULES = 12
"""Modules a list names before "(the rest)"."""
LARGEST_TENSORS = 10
"""Live tensors a failure names."""


@dataclass
class _Saved:
    module: str
    bytes: int
    shape: list[int]
    dtype: str
    holders: list[weakref.ref[torch.Tensor]] = field(default_factory=list)

    def alive(self) -> bool:
        return any(holder() is not None for holder in self.holders)


def _storage_key(tensor: torch.Tensor) -> tuple[str, int] | None:
    try:
        storage = tensor.untyped_storage()
    except (RuntimeError, NotImplementedError):  # a tensor without storage of its own
        return None
    return str(storage.device), storage.data_ptr()


def module_of_parameter(name: str) -> str:
    """The path of the module that owns the parameter called `name` (dotted, "" for the model itself)."""
    return name.rpartition(".")[0]


class ModuleFollower:
    """Follows one model's modules through a step: `forward_begins` starts capturing (module hooks and saved-tensor
    hooks), `forward_ends` stops it; what was saved stays known, weakly, until the next `forward_begins`."""

    def __init__(self, model: torch.nn.Module, parameter_storage_keys: set[tuple[str, int]], device: torch.device):
        self.names = {id(module): name for name, module in model.named_modules()}
        """Each module's path, by its id."""
        self._parameter_storage_keys = parameter_storage_keys
        self._device_type = device.type
        self._stack: list[str] = []
        self.backward_module: str | None = None
        """The module whose backward began last (its output's gradient reached it), while a backward runs."""
        self._saved: dict[tuple[str, int], _Saved] = {}
        self._batch_keys: set[tuple[str, int]] = set()
        self._saved_hooks: Any = None
        self._module_hooks: list[Any] = []

    # --- capture ---------------------------------------------------------------------------------
    def forward_begins(self, batch: Iterable[torch.Tensor]) -> None:
        """A forward pass on `batch` begins (its tensors, which are not activations, are left out)."""
        self.stop()
        self._saved = {}
        self._batch_keys = {key for tensor in batch if (key := _storage_key(tensor)) is not None}
        self._stack = []
        self.backward_module = None
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._saved_hooks.__enter__()
        self._module_hooks = [
            torch.nn.modules.module.register_module_forward_pre_hook(self._module_begins),
            torch.nn.modules.module.register_module_forward_hook(self._module_ends),
        ]

    def forward_ends(self) -> None:
        self.stop()

    def stop(self) -> None:
        """Stops capturing (what was saved stays known)."""
        if self._saved_hooks is not None:
            self._saved_hooks.__exit__(None, None, None)
            self._saved_hooks = None
        for hook in self._module_hooks:
            hook.remove()
        self._module_hooks = []

    @property
    def capturing(self) -> bool:
        return self._saved_hooks is not None

    def _module_begins(self, module: torch.nn.Module, args: Any) -> None:
        name = self.names.get(id(module))
        if name is not None:
            self._stack.append(name)

    def _module_ends(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        name = self.names.get(id(module))
        if name is None:
            return
        if self._stack and self._stack[-1] == name:
            self._stack.pop()
        for tensor in _tensors_of(output):
            node = tensor.grad_fn
            if node is not None:
                node.register_prehook(self._backward_reaches(name))

    def _backward_reaches(self, name: str) -> Any:
        def prehook(grad_outputs: Any) -> None:
            self.backward_module = name

        return prehook

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        try:
            if isinstance(tensor, torch.nn.Parameter) or isinstance(tensor._base, torch.nn.Parameter):
                return tensor
            if tensor.device.type != self._device_type:
                return tensor
            key = _storage_key(tensor)
            if key is None or key in self._parameter_storage_keys or key in self._batch_keys:
                return tensor
            saved = self._saved.get(key)
            if saved is None:
                storage = tensor.untyped_storage()
                module = self._stack[-1] if self._stack else ""
                saved = self._saved[key] = _Saved(module, storage.nbytes(), list(tensor.shape), _dtype(tensor))
            saved.holders.append(weakref.ref(tensor))
        except Exception:  # never into autograd: a tensor this cannot read is left uncounted
            pass
        return tensor

    # --- what is known -------------------------------------------------------------------------
    def current_module(self) -> str | None:
        """The innermost module whose forward is running, else the module whose backward began last."""
        if self._stack:
            return self._stack[-1]
        return self.backward_module

    def saved_alive(self) -> list[_Saved]:
        return [saved for saved in self._saved.values() if saved.alive()]

    def saved_bytes(self) -> int:
        """Bytes of the distinct storages saved for backward in the last forward pass and still alive."""
        return sum(saved.bytes for saved in self.saved_alive())

    def saved_by_module(self) -> dict[str, int]:
        """Those bytes by the module they were saved in."""
        by_module: dict[str, int] = {}
        for saved in self.saved_alive():
            by_module[saved.module] = by_module.get(saved.module, 0) + saved.bytes
        return by_module

    def largest_saved(self, count: int) -> list[LiveTensor]:
        alive = sorted(self.saved_alive(), key=lambda saved: -saved.bytes)[:count]
        return [LiveTensor("activations", saved.module, saved.bytes, saved.shape, saved.dtype) for saved in alive]


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _tensors_of(value: Any) -> list[torch.Tensor]:
    """The tensors a module returned: itself, in a tuple or list, or a ModelOutput's / dict's values (one level)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        return [item for item in value if isinstance(item, torch.Tensor)]
    return []


def _shard_bytes(tensor: torch.Tensor | None, seen: set[tuple[bool, int]]) -> int:
    """Bytes of `tensor`'s storage on this rank, unless a storage in `seen` (which it joins)."""
    if tensor is None:
        return 0
    total = 0
    for shard in local_shards(tensor):
        try:
            storage = shard.untyped_storage()
        except (RuntimeError, NotImplementedError):
            continue
        key = (shard.is_cuda, storage.data_ptr())
        if key not in seen:
            seen.add(key)
            total += storage.nbytes()
    return total


@dataclass
class OwnedMemory:
    """What each module owns, by module path: its parameters and buffers, the gradients, the optimizer's state."""

    parameters: dict[str, int] = field(default_factory=dict)
    gradients: dict[str, int] = field(default_factory=dict)
    optimizer_state: dict[str, int] = field(default_factory=dict)
    tensors: list[LiveTensor] = field(default_factory=list)
    """Each parameter, gradient and state tensor, for the largest of a failure."""


def owned_memory(model: torch.nn.Module, optimizer: Any, *, with_tensors: bool = False) -> OwnedMemory:
    """Parameters, gradients and optimizer state by module, each distinct storage counted once."""
    owned = OwnedMemory()
    seen: set[tuple[bool, int]] = set()
    by_id: dict[int, str] = {}

    def add(kind: dict[str, int], band: str, module: str, tensor: torch.Tensor | None) -> None:
        size = _shard_bytes(tensor, seen)
        if size:
            kind[module] = kind.get(module, 0) + size
            if with_tensors and tensor is not None:
                owned.tensors.append(LiveTensor(band, module, size, list(tensor.shape), _dtype(tensor)))

    parameters = list(model.named_parameters())
    for name, parameter in parameters:
        module = module_of_parameter(name)
        by_id[id(parameter)] = module
        add(owned.parameters, "weights", module, parameter)
    for name, buffer in model.named_buffers():
        add(owned.parameters, "weights", module_of_parameter(name), buffer)
    for name, parameter in parameters:
        add(owned.gradients, "gradients", module_of_parameter(name), parameter.grad)
    for wrapped in optimizer_chain(optimizer):
        state = getattr(wrapped, "state", None)
        if not isinstance(state, Mapping):
            continue
        for parameter, values in list(state.items()):
            owner = by_id.get(id(parameter))
            if owner is None or not isinstance(values, Mapping):
                continue
            for value in values.values():
                if isinstance(value, torch.Tensor):
                    add(owned.optimizer_state, "optimizer state", owner, value)
    return owned


def module_rows(
    activations: Mapping[str, int],
    owned: OwnedMemory,
    totals: Mapping[str, int | None],
    top: int = TOP_MODULES,
) -> list[ModuleMemory]:
    """The top `top` modules by their memory in all, then "(the rest)" summing the others, then "(no module)": what
    the bands' `totals` ("activations", "parameters", "gradients", "optimizer_state") hold beyond the modules', so
    each column sums to its band (a total of None is not topped up)."""
    columns = {
        "activations": dict(activations),
        "parameters": owned.parameters,
        "gradients": owned.gradients,
        "optimizer_state": owned.optimizer_state,
    }
    modules = set().union(*(column.keys() for column in columns.values()))

    def row(name: str, members: Iterable[str]) -> ModuleMemory:
        members = list(members)
        return ModuleMemory(
            module=name,
            **{f"{kind}_bytes": sum(column.get(m, 0) for m in members) for kind, column in columns.items()},
        )

    def total(module: str) -> int:
        return sum(column.get(module, 0) for column in columns.values())

    ranked = sorted(modules, key=lambda module: (-total(module), module))
    rows = [row(module, [module]) for module in ranked[:top]]
    if ranked[top:]:
        rows.append(row(MODULES_REST, ranked[top:]))
    beyond = {
        f"{kind}_bytes": max(0, band - sum(column.values()))
        for kind, column in columns.items()
        if (band := totals.get(kind)) is not None
    }
    if any(beyond.values()):
        rows.append(ModuleMemory(module=NO_MODULE, **beyond))
    return rows
