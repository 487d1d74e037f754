"""Public entry point for the probe: `from gpuanat.probe import AnatomyCallback`."""

from gpuanat.worker.probe import AnatomyCallback

__all__ = ["AnatomyCallback"]
