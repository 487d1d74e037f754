"""What the probe reads off a training loop's inputs, whatever the loop: the tensors of a batch however it is
packed (positional and keyword arguments of a forward call, a Lightning batch of tuples, lists and dicts), and the
`hello` that announces the training process (its device and versions).
"""

from __future__ import annotations

import os
import platform
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from gpuanat.core.vocabulary.protocol import Hello


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


def hello_event(device: torch.device, framework_versions: Mapping[str, str], config: dict[str, Any]) -> Hello:
    """`hello` for a training process on `device`, with its techniques in RunConfig's terms (`config`)."""
    cuda = device.type == "cuda"
    return Hello(
        pid=os.getpid(),
        versions=versions(framework_versions),
        device=device.type,
        device_name=torch.cuda.get_device_name(device) if cuda else platform.processor() or None,
        config=config,
    )
