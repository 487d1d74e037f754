"""The user's own data (`--data`): read through 🤗 datasets, tokenized with the model's tokenizer, cached between runs.

Outside `core/` because it imports datasets and transformers' tokenizers; no torch of its own, so the parent checks
the data with it before any GPU work and `predict` reads the data's lengths, while the training child builds its
batches from what it returns (`gpuanat.worker.batches`).
"""
