"""The batches of a --data run (docs/data.md): the tokenized rows padded to each batch's longest row, every row padded
to --seq-len, or packed end to end into --seq-len blocks; and the count of the tokens trained, real and padding.

Packing keeps each row's attention to itself where the model can: a decoder whose masks come from transformers'
`masking_utils` reads the rows' boundaries from `position_ids` that restart at each row (what
`DataCollatorWithFlattening` hands flash attention; transformers builds the block-diagonal causal mask for SDPA and
eager from them), and each row's first token is not a label, so no row learns from the one before. Other models
train on plain packing (the attention spans the rows of a block), and the child's log says so.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

IGNORE_INDEX = -100
"""Labels the loss leaves out (padding; a packed row's first token)."""


class PaddingCollator:
    """Rows of token ids as one batch: truncated at `seq_len`, padded to the longest row (`pad_to_seq_len` False) or
    to `seq_len`; a causal LM's labels are its ids with the padding left out, an encoder's the row's class."""

    def __init__(self, pad_token_id: int, seq_len: int, causal_lm: bool, pad_to_seq_len: bool) -> None:
        self.pad_token_id = pad_token_id
        self.seq_len = seq_len
        self.causal_lm = causal_lm
        self.pad_to_seq_len = pad_to_seq_len

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        ids = [list(row["input_ids"])[: self.seq_len] for row in rows]
        width = self.seq_len if self.pad_to_seq_len else max(len(row_ids) for row_ids in ids)
        input_ids = torch.full((len(ids), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(ids), width), dtype=torch.long)
        for index, row_ids in enumerate(ids):
            input_ids[index, : len(row_ids)] = torch.tensor(row_ids, dtype=torch.long)
            attention_mask[index, : len(row_ids)] = 1
        if self.causal_lm:
            labels = input_ids.masked_fill(attention_mask == 0, IGNORE_INDEX)
        else:
            labels = torch.tensor([int(row.get("label") or 0) for row in rows], dtype=torch.long)
        return {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}


def packs_within_rows(model: Any) -> bool:
    """Whether `model` keeps a packed row's attention to itself: a causal LM whose code builds its masks with
    transformers' `create_causal_mask`, which finds packed rows in restarting `position_ids`."""
    from gpuanat.worker.model import is_causal_lm

    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT model's own
    module = sys.modules.get(type(base).__module__)
    return is_causal_lm(base.config) and module is not None and hasattr(module, "create_causal_mask")


def packed_rows(rows: list[tuple[list[int], int]], seq_len: int, within_rows: bool, causal_lm: bool) -> Any:
    """The rows (ids, label) end to end, cut into blocks of exactly `seq_len` tokens (the remainder shorter than a
    block is dropped): no padding. `within_rows`: each block's `position_ids` restart at every row (and at the
    block's start) and a causal LM's labels leave out each row's first token."""
    from datasets import Dataset

    stream: list[int] = []
    positions: list[int] = []
    row_labels: list[int] = []
    for ids, label in rows:
        stream.extend(ids)
        positions.extend(range(len(ids)))
        row_labels.extend([label] * len(ids))
    blocks = len(stream) // seq_len
    columns: dict[str, list[Any]] = {"input_ids": [], "labels": []}
    if within_rows:
        columns["position_ids"] = []
    for block in range(blocks):
        start = block * seq_len
        ids = stream[start : start + seq_len]
        block_positions = _restarted(positions[start : start + seq_len])
        if causal_lm:
            starts = {index for index, position in enumerate(block_positions) if position == 0 and index > 0}
            labels = [IGNORE_INDEX if within_rows and index in starts else token for index, token in enumerate(ids)]
            columns["labels"].append(labels)
        else:
            columns["labels"].append(row_labels[start])  # the class of the row the block starts in
        columns["input_ids"].append(ids)
        if within_rows:
            columns["position_ids"].append(block_positions)
    dataset = Dataset.from_dict(columns)
    dataset.set_format("pt")
    return dataset


def _restarted(positions: list[int]) -> list[int]:
    """A block's positions counted from its start: the row cut at the block's start goes on from 0."""
    first_row_end = next((index for index, position in enumerate(positions) if position == 0 and index > 0), None)
    head = len(positions) if first_row_end is None else first_row_end
    return list(range(head)) + positions[head:]


class TokenCount:
    """The tokens trained, counted from each micro-batch as the loss is computed (after the DataLoader, whatever
    process collated it): `trained` every position, `real` those the attention mask keeps; no synchronisation
    with the GPU until `totals`."""

    def __init__(self) -> None:
        self.trained = 0
        self.samples = 0
        self._real: Any = 0

    def add(self, inputs: dict[str, Any]) -> None:
        input_ids = inputs["input_ids"]
        self.trained += input_ids.numel()
        self.samples += input_ids.shape[0]
        mask = inputs.get("attention_mask")
        self._real = self._real + (mask.sum() if mask is not None else input_ids.numel())

    def totals(self) -> tuple[int, int, int]:
        """(tokens trained, of them real, samples)."""
        real = self._real.item() if hasattr(self._real, "item") else self._real
        return self.trained, int(real), self.samples


def counting_trainer(count: TokenCount, **kwargs: Any) -> Any:
    """HF Trainer that adds each micro-batch to `count` before its loss."""
    from transformers import Trainer

    class CountingTrainer(Trainer):
        def compute_loss(self, model: Any, inputs: dict[str, Any], *args: Any, **more: Any) -> Any:
            count.add(inputs)
            return super().compute_loss(model, inputs, *args, **more)

    return CountingTrainer(**kwargs)


@dataclass
class DataBatches:
    """What a --data run trains on: the rows (or packed blocks), how they are batched, the count of their tokens."""

    dataset: Any
    collator: Any | None
    """None for packed blocks, which are all `seq_len` long (the Trainer's default collator stacks them)."""
    length_histogram: dict[str, int]
    count: TokenCount = field(default_factory=TokenCount)


def data_batches(config: Any, model: Any) -> DataBatches:
    """`config.data` tokenized (or read back from the cache) and made into batches for `model` as `config.padding`
    says; ConfigError for data the model cannot train on. Says on stderr (the run's log) where the tokens came from
    and how packing treats the attention."""
    from gpuanat.core.vocabulary.errors import ConfigError
    from gpuanat.dataset.load import LABEL_FIELD, length_histogram, tokenized
    from gpuanat.worker.model import is_causal_lm

    data = tokenized(config)
    print(
        f"gpuanat: --data: {len(data.rows)} rows, tokenized "
        + (f"rows read back from the cache {data.cache_file}" if data.reused else f"into the cache {data.cache_file}"),
        file=sys.stderr,
    )
    embeddings = model.get_input_embeddings().num_embeddings
    if data.vocab_size > embeddings:
        if hasattr(model, "get_base_model"):
            raise ConfigError(
                "--tokenizer", f"the tokenizer has {data.vocab_size} tokens, the model only {embeddings} embeddings"
            )
        model.resize_token_embeddings(data.vocab_size)
        print(f"gpuanat: embeddings grown from {embeddings} to the tokenizer's {data.vocab_size}", file=sys.stderr)
    causal = is_causal_lm(model.config)
    labels = data.rows[LABEL_FIELD] if LABEL_FIELD in data.rows.column_names else [0] * len(data.rows)
    if not causal and labels and max(labels) >= model.config.num_labels:
        raise ConfigError(
            "--data",
            f"{LABEL_FIELD} {max(labels)} is not one of the model's {model.config.num_labels} classes "
            f"(0-{model.config.num_labels - 1})",
        )
    histogram = length_histogram(data.lengths, config.seq_len)
    if config.padding == "pack":
        within = packs_within_rows(model)
        if within:
            model.config.use_cache = False  # transformers reads packed rows from position_ids only without a cache
        print(
            "gpuanat: packing: attention kept within each row (position_ids restart at each row)"
            if within
            else f"gpuanat: packing: {type(model).__name__} cannot keep a packed row's attention to itself: plain "
            "packing, the attention spans each block's rows",
            file=sys.stderr,
        )
        dataset = packed_rows(list(zip(data.rows["input_ids"], labels, strict=False)), config.seq_len, within, causal)
        if len(dataset) == 0:
            raise ConfigError(
                "--padding",
                f"the {len(data.rows)} rows hold {sum(data.lengths)} tokens, less than one --seq-len block of "
                f"{config.seq_len}: give more rows (--samples) or a shorter --seq-len",
            )
        return DataBatches(dataset, None, histogram)
    columns = ["input_ids"] + ([LABEL_FIELD] if not causal and LABEL_FIELD in data.rows.column_names else [])
    collator = PaddingCollator(data.pad_token_id, config.seq_len, causal, pad_to_seq_len=config.padding == "max")
    return DataBatches(data.rows.select_columns(columns), collator, histogram)
