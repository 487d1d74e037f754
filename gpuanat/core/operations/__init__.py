"""The anatomy of a training step's operations: where the GPU time goes by kind of operation (tensor contractions,
normalizations, element-wise operators, the optimizer, memory copies, the rest), from a few steps profiled with
torch.profiler — the second half of the HF "Model training anatomy" page. Plain Python: no torch, no UI."""
