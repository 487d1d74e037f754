"""The probe, inside the training process: a measurement core that knows no training framework (`core.Probe`, on
`tensors`, `device_memory`, `timing`, `loop_inputs`, `readings` and `sink`) and a thin adapter for each kind of
training loop — HF `Trainer`'s `hf.AnatomyCallback`, Lightning's `lightning_callback.LightningAnatomyCallback`, and
`plain_loop.track` for a loop of one's own — public as `gpuanat.probe.AnatomyCallback`, `LightningAnatomyCallback`
and `track`."""
