"""Public entry point for the probe: `from gpuanat.probe import AnatomyCallback`."""

from gpuanat.worker.probe.hf import AnatomyCallback

__all__ = ["AnatomyCallback"]
