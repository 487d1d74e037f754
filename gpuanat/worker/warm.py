"""A prepared training process (`python -m gpuanat.worker --warm-fd FD`): import now, train when handed a run.

gpuanat starts it ahead (gpuanat.core.run.warm). It imports what every run needs while a thread waits on FD for
the run: one line of JSON, {"config": RunConfig, "environ": {name: value or null}}, written when the user starts a
run, then end-of-file. End-of-file without a line: gpuanat no longer needs it, and it leaves quietly.

CUDA is not touched before the run is handed over: the run's variables (the allocator's options above all) are set
first, as a cold start's environment would have them.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any

HANDOFF_MAX_BYTES = 1 << 20


class Handoff:
    """Reads the hand-over pipe on a thread of its own from the start, so that the moment the run arrived is known
    even while the imports are still running."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._data = b""
        self.received_monotonic_s: float | None = None
        """When the first byte of the run arrived."""
        self._thread = threading.Thread(target=self._read, name="gpuanat-handoff", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while len(self._data) < HANDOFF_MAX_BYTES:
                chunk = os.read(self._fd, 1 << 16)
                if not chunk:
                    return
                if self.received_monotonic_s is None:
                    self.received_monotonic_s = time.monotonic()
                self._data += chunk
        except OSError:
            return
        finally:
            os.close(self._fd)

    def wait(self) -> tuple[dict[str, Any], float] | None:
        """The run handed over and when it arrived; None when the pipe closed without one. Raises ValueError when
        what arrived is not a run."""
        self._thread.join()
        if not self._data.strip():
            return None
        try:
            payload = json.loads(self._data.decode())
        except ValueError as error:  # not UTF-8, or not JSON
            raise ValueError(f"the hand-over is not a run: {error}") from None
        if (
            not isinstance(payload, dict)
            or not isinstance(payload.get("config"), dict)
            or not isinstance(payload.get("environ"), dict)
        ):
            raise ValueError('the hand-over is not a run: not {"config": {...}, "environ": {...}}')
        assert self.received_monotonic_s is not None
        return payload, self.received_monotonic_s


def prepare() -> None:
    """Import what `gpuanat.worker.train.train` imports, so that a run handed over starts at once."""
    import datasets  # noqa: F401
    import numpy  # noqa: F401
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import Trainer, TrainingArguments  # noqa: F401

    import gpuanat.worker.probe.hf  # noqa: F401


def apply_environment(environ: dict[str, Any]) -> None:
    """Set the run's variables (None: unset); the allocator's options also go to torch's allocator directly, in case
    this torch read them when it was imported."""
    from gpuanat.core.vocabulary.config import ALLOCATOR_CONF_VARIABLE

    for name, value in environ.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = str(value)
    conf = environ.get(ALLOCATOR_CONF_VARIABLE)
    if conf:
        import torch

        # Not torch.cuda.is_available(): it would initialise the driver here, in the run's "imports" part.
        setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None) or getattr(
            torch.cuda.memory, "_set_allocator_settings", None
        )
        # (torch.cuda.is_initialized is unannotated in torch)
        if setter is not None and not torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            setter(conf)
