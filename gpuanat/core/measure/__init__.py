"""Measuring: NVML and host sampling, the GPUs a run may use, the memory bands, a run's state and result from its
events, throughput and MFU, where step and start-up time go, probe publications, PID namespaces."""
