"""ConfigError: a value the user chose that cannot run, named by the flag to fix.

Its own module because every stage that judges a value raises it: the request for GPUs as it parses
(`gpu_request`), the checks of a whole `RunConfig` (`validation`), and the choice of GPUs against NVML (`gpus`).
Here it imports none of them, so each imports it without a cycle.
"""

from __future__ import annotations


class ConfigError(ValueError):
    """A value the user chose that cannot run; `flag` names the CLI flag to fix."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(f"{flag}: {message}")
        self.flag = flag
        self.message = message
