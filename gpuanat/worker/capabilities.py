"""Capability probe: what this machine can train with. Prints Capabilities as JSON.

Run in a subprocess (`python -m gpuanat.worker.capabilities`) so the parent never imports torch and
never holds a CUDA context.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys

from gpuanat.core.vocabulary.config import Capabilities


def detect() -> Capabilities:
    try:
        import torch
    except ImportError as error:
        return Capabilities(torch_version=None, cuda_available=False, reason=f"torch is not installed: {error}")
    cuda_available = torch.cuda.is_available()
    name = capability = total = None
    reason = None
    if cuda_available:
        properties = torch.cuda.get_device_properties(0)
        name, capability, total = properties.name, (properties.major, properties.minor), properties.total_memory
    elif torch.version.cuda is None:
        reason = f"torch {torch.__version__} is a CPU-only build"
    else:
        reason = "torch found no CUDA device (driver missing or no GPU visible)"
    bnb_version = bnb_error = None
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            import bitsandbytes
        bnb_version = bitsandbytes.__version__
    except Exception as error:  # bitsandbytes raises many kinds when its native library is missing
        bnb_error = f"{type(error).__name__}: {error}".splitlines()[0]
    deepspeed_version, deepspeed_error = _installed_version("deepspeed")
    peft_version, peft_error = _installed_version("peft")
    liger_version, liger_error = _installed_version("liger_kernel")
    return Capabilities(
        torch_version=torch.__version__,
        cuda_available=cuda_available,
        cuda_device_name=name,
        cuda_compute_capability=capability,
        cuda_total_memory_bytes=total,
        bitsandbytes_version=bnb_version,
        bitsandbytes_error=bnb_error,
        peft_version=peft_version,
        peft_error=peft_error,
        liger_version=liger_version,
        liger_error=liger_error,
        deepspeed_version=deepspeed_version,
        deepspeed_error=deepspeed_error,
        cuda_device_count=torch.cuda.device_count() if cuda_available else 0,
        reason=reason,
    )


def _installed_version(package: str) -> tuple[str | None, str | None]:
    """(version, None) when `package` is installed, else (None, why): read from its metadata, without importing
    it (importing deepspeed takes seconds; the training child imports it when a run needs it)."""
    import importlib.metadata
    import importlib.util

    if importlib.util.find_spec(package) is None:
        return None, f"{package} is not installed"
    try:
        return importlib.metadata.version(package), None
    except importlib.metadata.PackageNotFoundError:
        return None, f"{package} is importable but has no package metadata"


if __name__ == "__main__":
    json.dump(detect().to_json(), sys.stdout)
