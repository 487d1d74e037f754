"""gpuanat: GPU anatomy for transformer training — memory bands, throughput, techniques."""

__version__ = "0.1.0"
