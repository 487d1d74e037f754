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

import time
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


class _Saved:
    """One storage autograd saved: the module it was first saved in, its bytes, weak references to the tensors
    saved on it (alive while autograd, or anyone, holds one)."""

    __slots__ = ("bytes", "holders", "module")

    def __init__(self, module: str, size: int, holder: weakref.ref[torch.Tensor]) -> None:
        self.module, self.bytes, self.holders = module, size, [holder]

    def alive(self) -> torch.Tensor | None:
        """A tensor saved on it that is still alive; None when none is."""
        for holder in self.holders:
            tensor = holder()
            if tensor is not None:
                return tensor
        return None


def _storage_key(tensor: torch.Tensor) -> tuple[bool, int] | None:
    """(is CUDA, address) of the storage behind `tensor` (as `tensors.unique_storage_bytes` keys them: CUDA's unified
    addressing keeps every device's apart); None for a tensor without storage of its own."""
    try:
        return tensor.is_cuda, tensor.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None


def module_of_parameter(name: str) -> str:
    """The path of the module that owns the parameter called `name` (dotted, "" for the model itself)."""
    return name.rpartition(".")[0]


class ModuleFollower:
    """Follows one model's modules through a step: `forward_begins` starts capturing (module hooks and saved-tensor
    hooks), `forward_ends` stops it; what was saved stays known, weakly, until the next `forward_begins`. Its hooks'
    own time is kept in `time_s` (the probe counts it as its cost)."""

    def __init__(self, model: torch.nn.Module, device: torch.device):
        self.names = {id(module): name for name, module in model.named_modules()}
        """Each module's path, by its id."""
        self.by_module = not any(getattr(module, "_compiled_call_impl", None) is not None for module in model.modules())
        """Whether modules are followed: not when parts of the model are compiled in place (`--compile-regions`), where
        module hooks would break their graphs; what autograd saves is still captured, under "(no module)"."""
        self._parameter_storage_keys = {
            key for parameter in model.parameters() for shard in local_shards(parameter) if (key := _storage_key(shard))
        }
        self._cuda = device.type == "cuda"
        self._stack: list[str] = []
        self._outputs: list[tuple[Any, str]] = []
        """(autograd node of an output, module) as each module's forward ended: innermost modules first."""
        self._saved: dict[tuple[bool, int], _Saved] = {}
        self._batch_keys: set[tuple[bool, int]] = set()
        self._saved_hooks: Any = None
        self._module_hooks: list[Any] = []
        self.time_s = 0.0

    # --- capture ---------------------------------------------------------------------------------
    def forward_begins(self, batch: Iterable[torch.Tensor]) -> None:
        """A forward pass on `batch` begins (its tensors, which are not activations, are left out)."""
        self.stop()
        self._saved = {}
        self._batch_keys = {key for tensor in batch if (key := _storage_key(tensor)) is not None}
        self._stack = []
        self._outputs = []
        self._saved_hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, _unpack)
        self._saved_hooks.__enter__()
        if self.by_module:
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

    def _module_begins(self, module: torch.nn.Module, args: Any) -> None:
        started_s = time.perf_counter()
        name = self.names.get(id(module))
        if name is not None:
            self._stack.append(name)
        self.time_s += time.perf_counter() - started_s

    def _module_ends(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        started_s = time.perf_counter()
        name = self.names.get(id(module))
        if name is not None:
            if self._stack and self._stack[-1] == name:
                self._stack.pop()
            node = getattr(output, "grad_fn", None) if isinstance(output, torch.Tensor) else _first_node(output)
            if node is not None:
                self._outputs.append((node, name))
        self.time_s += time.perf_counter() - started_s

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        started_s = time.perf_counter()
        try:
            if tensor.is_cuda != self._cuda or isinstance(tensor, torch.nn.Parameter):
                return tensor
            if isinstance(tensor._base, torch.nn.Parameter):  # a weight's view (a gathered shard's too): no activation
                return tensor
            storage = tensor.untyped_storage()
            key = (self._cuda, storage.data_ptr())
            if key in self._parameter_storage_keys or key in self._batch_keys:
                return tensor
            saved = self._saved.get(key)
            if saved is None:
                module = (self._stack[-1] if self._stack else "") if self.by_module else NO_MODULE
                self._saved[key] = _Saved(module, storage.nbytes(), weakref.ref(tensor))
            else:
                saved.holders.append(weakref.ref(tensor))
        except Exception:  # never into autograd: a tensor this cannot read is left uncounted
            pass
        finally:
            self.time_s += time.perf_counter() - started_s
        return tensor

    # --- what is known -------------------------------------------------------------------------
    def current_module(self, autograd_node: Any = None) -> str | None:
        """The innermost module whose forward is running; in a backward, the module whose forward made
        `autograd_node` (the node autograd runs), found by walking the graph down from each module's output."""
        if self._stack:
            return self._stack[-1]
        if autograd_node is None:
            return None
        return _module_of_node(autograd_node, self._outputs)

    def step_ends(self) -> None:
        """The step is over: its graph's nodes are let go (what was saved stays known, weakly)."""
        self._outputs = []

    def saved_alive(self) -> list[_Saved]:
        return [saved for saved in self._saved.values() if saved.alive() is not None]

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
        largest = []
        for saved in sorted(self.saved_alive(), key=lambda saved: -saved.bytes)[:count]:
            tensor = saved.alive()
            if tensor is not None:
                largest.append(LiveTensor("activations", saved.module, saved.bytes, list(tensor.shape), _dtype(tensor)))
        return largest


def _unpack(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def _dtype(tensor: torch.Tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")


def _first_node(value: Any) -> Any:
    """The autograd node of the first tensor a module returned in a tuple, list or ModelOutput (one level)."""
    if isinstance(value, Mapping):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        for item in value:
            if isinstance(item, torch.Tensor) and item.grad_fn is not None:
                return item.grad_fn
    return None


MAX_NODES_WALKED = 200_000
"""A bound on the graph walked at a failure (a forward of a large model makes tens of thousands of nodes)."""


def _module_of_node(target: Any, outputs: list[tuple[Any, str]]) -> str | None:
    """The module whose forward made autograd node `target`: each module's region is the graph below its output's
    node down to the outputs of other modules; modules are tried innermost first (the order their forwards ended),
    each claiming the nodes no inner module claimed."""
    boundaries = {node for node, _ in outputs}
    claimed: set[Any] = set()
    walked = 0
    for node, name in outputs:
        stack = [node]
        while stack and walked < MAX_NODES_WALKED:
            current = stack.pop()
            if current in claimed:
                continue
            claimed.add(current)
            walked += 1
            if current is target or current == target:
                return name
            for child, _ in getattr(current, "next_functions", ()):
                if child is not None and child not in claimed and child not in boundaries:
                    stack.append(child)
    return None


def tensor_bytes(tensor: torch.Tensor) -> int:
    """Bytes of `tensor`'s own elements on this rank (its shard, for a sharded tensor); a view counts its own
    elements, not its whole storage (a gradient that views a flat bucket is that gradient's share)."""
    if type(tensor) in _PLAIN_TENSORS:  # most: no shard to look for
        return tensor.nbytes
    return sum(shard.nbytes for shard in local_shards(tensor))


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)


@dataclass
class OwnedMemory:
    """What each module owns, by module path: its parameters and buffers, the gradients, the optimizer's state."""

    parameters: dict[str, int] = field(default_factory=dict)
    gradients: dict[str, int] = field(default_factory=dict)
    optimizer_state: dict[str, int] = field(default_factory=dict)


class Ownership:
    """Which module owns each parameter and buffer, read once when training begins, and what they, their gradients
    and the optimizer's state of them take, by module — one pass over the parameters, no storage lookups."""

    def __init__(self, model: torch.nn.Module, device: torch.device) -> None:
        self._cuda = device.type == "cuda"
        """Only tensors on the training device count (an optimizer's step counters may stay on the CPU)."""
        self._parameters = [(module_of_parameter(name), p) for name, p in model.named_parameters()]
        self._by_id = {id(parameter): module for module, parameter in self._parameters}
        self._state_shape: tuple[int, ...] = ()
        self._state_by_module: dict[str, int] | None = None
        self.parameters: dict[str, int] = {}
        """Parameters and buffers by module."""
        for module, tensor in [*self._parameters, *((module_of_parameter(n), b) for n, b in model.named_buffers())]:
            self.parameters[module] = self.parameters.get(module, 0) + tensor_bytes(tensor)

    def gradients(self) -> dict[str, int]:
        by_module: dict[str, int] = {}
        for module, parameter in self._parameters:
            gradient = parameter.grad
            if gradient is not None:
                by_module[module] = by_module.get(module, 0) + tensor_bytes(gradient)
        return by_module

    def _state_tensors(self, optimizer: Any) -> Iterable[tuple[str, torch.Tensor]]:
        seen: set[int] = set()
        for wrapped in optimizer_chain(optimizer):
            state = getattr(wrapped, "state", None)
            if not isinstance(state, Mapping) or id(state) in seen:
                continue
            seen.add(id(state))
            for parameter, values in list(state.items()):
                module = self._by_id.get(id(parameter))
                if module is not None and isinstance(values, Mapping):
                    for value in values.values():
                        if isinstance(value, torch.Tensor) and value.is_cuda == self._cuda:
                            yield module, value

    def optimizer_state(self, optimizer: Any) -> dict[str, int]:
        """The optimizer's state by module; read again only when the optimizer holds state for other parameters than
        at the last reading (its tensors keep their sizes from their first step on)."""
        shape = tuple(len(getattr(wrapped, "state", None) or ()) for wrapped in optimizer_chain(optimizer))
        if shape == self._state_shape and self._state_by_module is not None:
            return dict(self._state_by_module)
        by_module: dict[str, int] = {}
        for module, tensor in self._state_tensors(optimizer):
            by_module[module] = by_module.get(module, 0) + tensor_bytes(tensor)
        self._state_shape, self._state_by_module = shape, by_module
        return dict(by_module)

    def owned(self, optimizer: Any, gradients: dict[str, int] | None = None) -> OwnedMemory:
        """Parameters, gradients (`gradients` when given: read earlier, when they were complete), optimizer state."""
        return OwnedMemory(
            dict(self.parameters),
            self.gradients() if gradients is None else dict(gradients),
            self.optimizer_state(optimizer),
        )

    def live_tensors(self, optimizer: Any) -> list[LiveTensor]:
        """Every parameter, gradient and optimizer state tensor, with its band and module (for a failure)."""
        tensors = [LiveTensor("weights", m, tensor_bytes(p), list(p.shape), _dtype(p)) for m, p in self._parameters]
        tensors.extend(
            LiveTensor("gradients", m, tensor_bytes(p.grad), list(p.grad.shape), _dtype(p.grad))
            for m, p in self._parameters
            if p.grad is not None
        )
        tensors.extend(
            LiveTensor("optimizer state", m, tensor_bytes(t), list(t.shape), _dtype(t))
            for m, t in self._state_tensors(optimizer)
        )
        return tensors


def _in_model_order(path: str) -> list[tuple[int, str]]:
    """A module path's sort key that puts layer 2 before layer 10 ("h.2" < "h.10")."""
    return [(int(part), "") if part.isdigit() else (-1, part) for part in path.split(".")]


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

    ranked = sorted(modules - {NO_MODULE}, key=lambda module: (-total(module), _in_model_order(module)))
    rows = [row(module, [module]) for module in ranked[:top]]
    if ranked[top:]:
        rows.append(row(MODULES_REST, ranked[top:]))
    beyond = {  # what no module holds: the bands beyond the modules' sums, and what was saved in none (`by_module`)
        f"{kind}_bytes": column.get(NO_MODULE, 0)
        + (max(0, band - sum(column.values())) if (band := totals.get(kind)) is not None else 0)
        for kind, column in columns.items()
    }
    if any(beyond.values()):
        rows.append(ModuleMemory(module=NO_MODULE, **beyond))
    return rows
