"""Which kind of operation a profiled kernel (or, on a CPU run, a CPU operator) is: the three groups of "Data Movement
Is All You Need" (Ivanov et al., 2020) that the HF "Model training anatomy" page cites — tensor contractions,
statistical normalizations, element-wise operators — and, kept apart so nothing is hidden, the optimizer's update,
memory copies and the rest.

A GPU kernel is classified by what it is, first by its own name (cuBLAS/CUTLASS GEMMs, flash and memory-efficient
attention, Triton kernels of a compiled region, cuDNN's fused attention), then by the operator that launched it
(`aten::native_layer_norm`), then by the generic kernel families of PyTorch (`vectorized_elementwise_kernel`,
`reduce_kernel`). A kernel launched inside the optimizer's step (or zero_grad) is the optimizer's, whatever it is.
The names come from real H100 profiles (tests/data/operations/). Plain Python.
"""

from __future__ import annotations

import re

GROUPS = ("contractions", "normalizations", "elementwise", "optimizer", "memory_copies", "other")
GROUP_LABELS = {
    "contractions": "tensor contractions",
    "normalizations": "normalizations",
    "elementwise": "element-wise",
    "optimizer": "optimizer",
    "memory_copies": "memory copies",
    "other": "other",
}
GROUP_MEANINGS = {
    "contractions": "matrix products: linear layers (GEMMs), attention's batched products and fused attention kernels",
    "normalizations": "softmax, layer/RMS norm, the loss and other reductions (sums of bias gradients)",
    "elementwise": "activations, dropout, bias and residual adds, casts, concatenations, fills",
    "optimizer": "kernels launched inside the optimizer's step and zero_grad (and foreach kernels: gradient clipping)",
    "memory_copies": "copies between host and device, device-to-device copies and memsets",
    "other": "embedding lookups and their gradients, sorting, indexing, collectives (NCCL), anything unrecognised",
}


PROFILER_MARKERS = ("ProfilerStep#", "ProfilerStep*")
"""The torch profiler's own range around each profiled step (`ProfilerStep#4`; `ProfilerStep*` once merged): no
operation. On a CPU its own time is everything between the step's operators (Python, the loop), which would read as
the longest "other" operator."""


def _words(*patterns: str) -> re.Pattern[str]:
    return re.compile("|".join(patterns), re.IGNORECASE)


CONTRACTION_KERNEL = _words(
    r"gemm",
    r"gemv",
    r"xmma",
    r"cutlass",
    r"cublas",
    r"nvjet",
    r"wgmma",
    r"splitkreduce",
    r"flash_",
    r"fmha",
    r"sdpa",
    r"attention",
    r"triton_tem_",
    r"_matmul",
    r"matmul_",
    r"mm_kernel",
)
"""Kernels of matrix products, by name: cuBLAS (sm90_xmma_gemm_…, nvjet_…, splitKreduce_kernel), CUTLASS, flash and
memory-efficient attention (flash_fwd_kernel, fmha_cutlassF_…), cuDNN's fused attention, Triton templates."""
TRITON_REDUCTION = re.compile(r"^triton_(per|red)_", re.IGNORECASE)
TRITON_POINTWISE = re.compile(r"^triton_poi_", re.IGNORECASE)
NORMALIZATION_KERNEL = _words(
    r"softmax",
    r"layer_?norm",
    r"rms_?norm",
    r"group_?norm",
    r"batch_?norm",
    r"gammabeta",
    r"rowwisemoments",
    r"welford",
    r"nll_loss",
    r"cross_?entropy",
    r"cunn_",
    r"norm_kernel",
    r"compute_?internal_?gradients",
)
ELEMENTWISE_KERNEL = _words(
    r"elementwise",
    r"dropout",
    r"direct_copy",
    r"copy_kernel",
    r"fill",
    r"gelu",
    r"silu",
    r"swiglu",
    r"geglu",
    r"rope",
    r"catarraybatchedcopy",
    r"where",
    r"masked",
    r"bernoulli",
    r"pointwise",
    r"tanh",
    r"cast",
    r"element_",
)
REDUCTION_KERNEL = _words(r"reduce_kernel", r"reduction", r"reduce_")
OPTIMIZER_KERNEL = _words(r"multi_tensor_apply", r"adam", r"foreach", r"8bit", r"optimizer")
OTHER_KERNEL = _words(r"nccl", r"index", r"embedding", r"scatter", r"gather", r"sort", r"segment", r"unique")

CONTRACTION_OPS = frozenset(
    {
        "mm",
        "addmm",
        "bmm",
        "baddbmm",
        "matmul",
        "linear",
        "_scaled_mm",
        "einsum",
        "addmv",
        "mv",
        "dot",
        "convolution",
        "_convolution",
        "convolution_backward",
        "conv1d",
        "conv2d",
        "scaled_dot_product_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_flash_attention_backward",
        "_scaled_dot_product_efficient_attention_backward",
        "_scaled_dot_product_cudnn_attention_backward",
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
        "_flash_attention_forward",
        "_flash_attention_backward",
        "_efficient_attention_forward",
        "_efficient_attention_backward",
        "_scaled_dot_product_attention_math",
    }
)
NORMALIZATION_OPS = frozenset(
    {
        "softmax",
        "_softmax",
        "_softmax_backward_data",
        "log_softmax",
        "_log_softmax",
        "_log_softmax_backward_data",
        "_safe_softmax",
        "layer_norm",
        "native_layer_norm",
        "native_layer_norm_backward",
        "rms_norm",
        "_fused_rms_norm",
        "_fused_rms_norm_backward",
        "group_norm",
        "native_group_norm",
        "native_group_norm_backward",
        "batch_norm",
        "native_batch_norm",
        "native_batch_norm_backward",
        "sum",
        "mean",
        "var",
        "std",
        "var_mean",
        "norm",
        "linalg_vector_norm",
        "nll_loss",
        "nll_loss_forward",
        "nll_loss_backward",
        "nll_loss2d_forward",
        "cross_entropy_loss",
        "amax",
        "amin",
        "max",
        "min",
        "logsumexp",
        "cumsum",
        "prod",
        "all",
        "any",
    }
)
OTHER_OPS = frozenset(
    {
        "embedding",
        "embedding_backward",
        "embedding_dense_backward",
        "index_select",
        "index",
        "index_put_",
        "_index_put_impl_",
        "gather",
        "scatter",
        "scatter_add_",
        "sort",
        "argsort",
        "topk",
        "unique",
        "nonzero",
    }
)
"""Operators that move rows by index rather than compute (and the collectives): in "other", named."""
VIEW_OR_ALLOCATION_OPS = frozenset(
    {
        "empty",
        "empty_like",
        "empty_strided",
        "view",
        "reshape",
        "_reshape_alias",
        "as_strided",
        "transpose",
        "t",
        "permute",
        "expand",
        "select",
        "slice",
        "unsqueeze",
        "squeeze",
        "detach",
        "alias",
        "split",
        "chunk",
        "unbind",
        "narrow",
        "_unsafe_view",
        "resize_",
        "set_",
        "lift_fresh",
        "result_type",
        "is_nonzero",
        "item",
        "_local_scalar_dense",
        "size",
        "stride",
        "numel",
        "contiguous",
    }
)
"""CPU operators that compute nothing (views, allocations): their own time on a CPU run is "other"."""


def op_base(op: str | None) -> str | None:
    """'aten::native_layer_norm' → 'native_layer_norm'; None for what is not an ATen operator."""
    if op is None or not op.startswith("aten::"):
        return None
    return op.removeprefix("aten::").split(".", 1)[0]


def group_of_op(op: str | None) -> str | None:
    """The group an ATen operator's name says (None: it does not say)."""
    base = op_base(op)
    if base is None:
        return None
    if base in CONTRACTION_OPS:
        return "contractions"
    if base in NORMALIZATION_OPS:
        return "normalizations"
    if base in OTHER_OPS or base.startswith("_c10d") or base.startswith("c10d"):
        return "other"
    if base.startswith(("_foreach_", "_fused_adam", "_fused_sgd", "_fused_adagrad")):
        return "optimizer"
    if base in {"copy_", "_to_copy", "to", "clone"}:
        return "elementwise"  # casts and copies between tensors of one device
    return None


def kernel_function(name: str) -> str:
    """A kernel's function name without its template arguments and parameters, whose functors and lambdas would
    match any pattern: 'void at::native::reduce_kernel<128, 4, …>(…)' → 'at::native::reduce_kernel'."""
    name = name.replace("(anonymous namespace)::", "")
    cut = min((index for index in (name.find("<"), name.find("(")) if index > 0), default=len(name))
    return name[:cut].removeprefix("void ").strip()


def group_of(name: str, op: str | None, *, optimizer: bool, device: str) -> str:
    """The group of a profiled kernel `name` serving operator `op` (on a CPU run: operator `name`'s own time, inside
    `op`). `op` is the outermost operator around the launch whose name says its kind (`aten::linear` for a copy its
    matmul needed, `aten::embedding_dense_backward` for the zeros its gradient is built on), else the launching
    one."""
    if optimizer:
        return "optimizer"
    if device == "cpu":
        by_op = group_of_op(op) or group_of_op(name)
        if by_op is not None:
            return by_op
        base = op_base(name)
        if base is None or base in VIEW_OR_ALLOCATION_OPS:
            return "other"  # record_function ranges (the step, autograd's wrappers), views and allocations
        return "elementwise"  # every other ATen operator on the CPU computes element by element
    if name.startswith(("Memcpy", "Memset")) or name.lower().startswith(("memcpy", "memset")):
        return "memory_copies"
    name = kernel_function(name)
    if TRITON_REDUCTION.search(name):
        return "normalizations"
    if TRITON_POINTWISE.search(name):
        return "elementwise"
    if CONTRACTION_KERNEL.search(name):
        return "contractions"
    by_op = group_of_op(op)
    if by_op is not None:
        return by_op
    for pattern, group in (
        (NORMALIZATION_KERNEL, "normalizations"),
        (OPTIMIZER_KERNEL, "optimizer"),
        (ELEMENTWISE_KERNEL, "elementwise"),
        (OTHER_KERNEL, "other"),
        (REDUCTION_KERNEL, "normalizations"),
    ):
        if pattern.search(name):
            return group
    return "other"
