"""The XID errors the driver reports (nvmlEventTypeXidCriticalError), read without waiting at each sample.

NVML queues the events of an event set; `XidReader.read` takes what is queued with nvmlEventSetWait_v2 and a
timeout of 0 (it returns NVML_ERROR_TIMEOUT at once when nothing is), so a sample never waits for an event. A
driver, GPU or binding without events (MIG, a vGPU, no permission) leaves `unavailable_reason` set and reads
nothing. pynvml is passed in; nothing here imports it.
"""

from __future__ import annotations

import contextlib
from typing import Any

XID_EVENT = 8
"""nvmlEventTypeXidCriticalError, where the binding does not name it."""
MAX_EVENTS_PER_READ = 64
"""The most events one read takes off the queue (a GPU in an XID storm must not hold up the sample)."""
XID_CARRY_S = 60.0
"""How long a sample carries an XID after the driver reported it (an event, shown as a state for a minute)."""

XID_MEANINGS = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing",
    45: "preemptive cleanup",
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    92: "high single-bit ECC error rate",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
"""The XIDs most seen on training machines (NVIDIA's XID catalogue), in words."""


def xid_text(index: int, xid: int) -> str:
    """ "GPU 0 reported XID 79 (GPU has fallen off the bus)"."""
    meaning = XID_MEANINGS.get(xid)
    return f"GPU {index} reported XID {xid}" + (f" ({meaning})" if meaning else "")


class XidReader:
    """One event set with every GPU's XID events registered; `read` gives the XIDs queued since the last read."""

    def __init__(self, nvml: Any, handles: list[tuple[int, Any]]) -> None:
        self._nvml = nvml
        self._set: Any = None
        self.unavailable_reason: str | None = None
        if not hasattr(nvml, "nvmlEventSetCreate") or not hasattr(nvml, "nvmlEventSetWait_v2"):
            self.unavailable_reason = "this NVML binding has no events"
            return
        kind = getattr(nvml, "nvmlEventTypeXidCriticalError", XID_EVENT)
        try:
            self._set = nvml.nvmlEventSetCreate()
        except nvml.NVMLError as error:
            self.unavailable_reason = f"NVML events unavailable: {error}"
            return
        registered = 0
        for _index, handle in handles:
            with contextlib.suppress(nvml.NVMLError):  # NOT_SUPPORTED on this GPU: the others still report
                nvml.nvmlDeviceRegisterEvents(handle, kind, self._set)
                registered += 1
        if not registered:
            self.unavailable_reason = "no GPU here reports XID events to this process"
            self.close()

    def read(self) -> dict[int, list[int]]:
        """Per GPU index, the XIDs the driver reported since the previous read; never waits."""
        nvml = self._nvml
        found: dict[int, list[int]] = {}
        if self._set is None:
            return {}
        for _ in range(MAX_EVENTS_PER_READ):
            try:
                event = nvml.nvmlEventSetWait_v2(self._set, 0)
            except nvml.NVMLError:  # TIMEOUT: nothing queued (any other error: nothing to read now either)
                break
            try:
                index = int(nvml.nvmlDeviceGetIndex(event.device))
            except nvml.NVMLError:
                continue
            found.setdefault(index, []).append(int(event.eventData))
        return found

    def close(self) -> None:
        if self._set is not None:
            with contextlib.suppress(Exception):  # freeing at shutdown: nothing to do about a failure
                self._nvml.nvmlEventSetFree(self._set)
            self._set = None
