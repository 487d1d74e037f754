"""What the probe reads off a training loop's inputs, whatever the loop: the tensors of a batch however it is
packed (positional and keyword arguments of a forward call, a Lightning batch of tuples, lists and dicts), and the
versions a `hello` reports.
"""

from __future__ import annotations

import platform
from collections.abc import Iterable, Mapping
from typing import Any

import torch


def batch_tensors(*values: Any) -> list[torch.Tensor]:
    """The tensors in `values`, in order, looking one level into tuples, lists and mappings (a batch of
    `(inputs, labels)` or `{"input_ids": …, "labels": …}`, a HF `BatchEncoding`)."""
    found: list[torch.Tensor] = []
    for value in values:
        inner: Iterable[Any] = (
            value.values() if isinstance(value, Mapping) else value if isinstance(value, (tuple, list)) else (value,)
        )
        found.extend(item for item in inner if isinstance(item, torch.Tensor))
    return found


def versions(framework_versions: Mapping[str, str]) -> dict[str, str]:
    """Python's, torch's, CUDA's and the training framework's versions, for `hello`."""
    found = {"python": platform.python_version(), "torch": torch.__version__, **framework_versions}
    if torch.version.cuda:
        found["cuda"] = torch.version.cuda
    return found
