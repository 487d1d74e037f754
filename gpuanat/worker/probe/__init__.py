"""The probe, inside the training process: a measurement core that knows no training framework (`core.Probe`, on
`tensors`, `device_memory`, `timing` and `sink`) and a thin adapter for each training loop — HF `Trainer`'s is
`hf.AnatomyCallback`, public as `from gpuanat.probe import AnatomyCallback`."""
