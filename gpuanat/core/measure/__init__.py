"""Measuring: NVML and host sampling, the memory bands, a run's state from its events, probe publications,
PID namespaces."""
