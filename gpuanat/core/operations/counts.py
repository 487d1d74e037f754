"""FLOPs and bytes of one profiled operator, from the shapes and dtypes torch.profiler records (`record_shapes`).

Contractions are counted exactly, with the formulas of `torch.utils.flop_counter` (2·m·n·k a product; attention's
QKᵀ and AV 4·b·h·s_q·s_k·d forward and 10·b·h·s_q·s_k·d backward, causal masking not subtracted, as torch counts).
Normalizations and element-wise operators are counted from their largest tensor's elements — FLOPs an element
(`FLOPS_PER_ELEMENT`) — because they are the ones whose arithmetic is negligible and whose bytes are not. Bytes are
what an operator reads (its tensor arguments) and writes (an output the size of its largest argument, or of the
product): a lower bound of the traffic, without caches. Plain Python.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from gpuanat.core.operations.classify import op_base

Shapes = Sequence[Sequence[int]]

DTYPE_BYTES = {
    "float": 4,
    "double": 8,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
}
"""torch.profiler's dtype names → bytes an element."""
FLOPS_PER_ELEMENT = {"normalizations": 5, "elementwise": 1}
"""Estimated FLOPs an element of the largest tensor: softmax (max, subtract, exponent, sum, divide) and layer norm
(mean, variance, normalise, scale, shift) about 5; an element-wise operator 1."""
REDUCTIONS = frozenset(
    {
        "sum",
        "mean",
        "amax",
        "amin",
        "max",
        "min",
        "all",
        "any",
        "prod",
        "cumsum",
        "norm",
        "linalg_vector_norm",
        "nll_loss",
        "nll_loss_forward",
        "nll_loss_backward",
    }
)
"""Normalizations that only reduce (a sum, a norm, the loss's pick): 1 FLOP an element."""


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 0


def _matmul(a: Sequence[int], b: Sequence[int]) -> int | None:
    """2·m·n·k of a (…, m, k) × (…, k, n) product (batch dimensions of `a` multiply)."""
    if len(a) < 2 or len(b) < 2 or a[-1] != b[-2]:
        return None
    return 2 * _numel(a) * b[-1]


def _attention(shapes: Shapes, backward: bool) -> int | None:
    """Attention's products from (b, h, s, d) query, key, value (after grad_out for the backward)."""
    query, key = (shapes[1], shapes[2]) if backward else (shapes[0], shapes[1])
    if len(query) != 4 or len(key) != 4:
        return None
    batch, heads, s_q, head_dim = query
    forward = 4 * batch * heads * s_q * key[2] * head_dim
    return forward * 5 // 2 if backward else forward


def contraction_flops(op: str, shapes: Shapes) -> int | None:
    """FLOPs of a contraction operator from its argument shapes; None for another operator or shapes it cannot
    read."""
    base = op_base(op)
    try:
        if base in ("mm", "bmm", "matmul"):
            return _matmul(shapes[0], shapes[1])
        if base in ("addmm", "baddbmm"):
            return _matmul(shapes[1], shapes[2])
        if base in (
            "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_efficient_attention",
            "_scaled_dot_product_cudnn_attention",
            "_scaled_dot_product_flash_attention_for_cpu",
            "scaled_dot_product_attention",
        ):
            return _attention(shapes, backward=False)
        if base in (
            "_scaled_dot_product_flash_attention_backward",
            "_scaled_dot_product_efficient_attention_backward",
            "_scaled_dot_product_cudnn_attention_backward",
            "_scaled_dot_product_flash_attention_for_cpu_backward",
        ):
            return _attention(shapes, backward=True)
    except (IndexError, TypeError):
        return None
    return None


def estimated_flops(group: str, shapes: Shapes, op: str | None = None) -> int | None:
    """FLOPs of a normalization or element-wise operator `op`: its largest tensor's elements × `FLOPS_PER_ELEMENT`
    (1 for a reduction)."""
    per_element = 1 if op_base(op) in REDUCTIONS else FLOPS_PER_ELEMENT.get(group)
    if per_element is None:
        return None
    largest = max((_numel(shape) for shape in shapes), default=0)
    return per_element * largest if largest else None


def moved_bytes(op: str, shapes: Shapes, dtypes: Sequence[str]) -> int | None:
    """Bytes an operator reads (its tensor arguments) and writes (one output: the product's for a matmul, else the
    size of its largest argument); None when no argument's dtype is known."""
    sizes = [
        _numel(shape) * DTYPE_BYTES[dtype]
        for shape, dtype in zip(shapes, dtypes, strict=False)
        if dtype in DTYPE_BYTES and shape
    ]
    if not sizes:
        return None
    output = max(sizes)
    base = op_base(op)
    if base in ("mm", "bmm", "addmm", "baddbmm", "matmul") and len(shapes) >= 2:
        a, b = (shapes[1], shapes[2]) if base in ("addmm", "baddbmm") and len(shapes) >= 3 else (shapes[0], shapes[1])
        if len(a) >= 2 and len(b) >= 2:
            element = DTYPE_BYTES.get(dtypes[0] if dtypes else "", 4)
            output = _numel(a[:-1]) * b[-1] * element
    return sum(sizes) + output
