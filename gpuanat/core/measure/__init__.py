"""Measuring: NVML and host sampling, the memory bands, watching any PID, probe publications, PID namespaces."""
