"""The memory model: predicted bands and peaks, the allocator replay and its templates, the largest-batch search."""
