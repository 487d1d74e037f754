"""A real tokenizer and real text for the --data tests, built here from the tests' own words (no download).

`build_tokenizer` trains a WordLevel tokenizer (the `tokenizers` library) on WORDS and saves it as a
PreTrainedTokenizerFast directory, with a pad, an unknown and an end-of-sequence token; `rows_of` writes rows of
texts of the lengths asked for. The tests count tokens with this same tokenizer, outside gpuanat.
"""

from __future__ import annotations

import json
from pathlib import Path

WORDS = (
    *("the", "cat", "sat", "on", "a", "mat", "and", "dog", "ran", "far", "away", "from", "home", "while"),
    *("birds", "sang", "in", "tall", "green", "trees"),
)


def build_tokenizer(directory: Path) -> Path:
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(
        [" ".join(WORDS)], trainers.WordLevelTrainer(special_tokens=["[PAD]", "[UNK]", "[EOS]"])
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="[PAD]", unk_token="[UNK]", eos_token="[EOS]")
    fast.save_pretrained(directory)
    return directory


def texts(lengths: list[int]) -> list[str]:
    """One text a length, each of that many words (one token a word with this tokenizer)."""
    return [
        " ".join(WORDS[(index + offset) % len(WORDS)] for offset in range(length))
        for index, length in enumerate(lengths)
    ]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def token_lengths(tokenizer_dir: Path, rows: list[str]) -> list[int]:
    """The rows' token counts as the tokenizer gives them, counted here."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    return [len(ids) for ids in tokenizer(rows)["input_ids"]]
