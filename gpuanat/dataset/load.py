"""`--data` read, its text field chosen, tokenized and cached (docs/data.md).

Every way the data can be wrong — a missing file, an unknown format, no text field, a tokenizer that cannot be had
offline, a row that does not decode or holds no text — is a `ConfigError` naming the flag to fix; the parent raises
it before any GPU work (`cli.common.check_values`), one line and exit 2. The tokenized rows are written once into
datasets' cache (`HF_DATASETS_CACHE/gpuanat-tokenized/`, named by a fingerprint of the rows, the text field and the
tokenizer), so the training child and every later run read them back instead of tokenizing again.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuanat.core.vocabulary.errors import ConfigError

FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
"""A file's extension and the datasets builder that reads it."""
TEXT_FIELDS = ("text", "content", "sentence", "document", "body")
"""The columns taken as the text, first found first, when --text-field is not given."""
CHAT_FIELDS = ("messages", "conversations")
"""Columns of chat messages ({role, content} each), rendered with the tokenizer's chat template."""
LABEL_FIELD = "label"
"""An encoder's classification label, where the data has one (else 0, as the random data's)."""
CACHE_FOLDER = "gpuanat-tokenized"
TOKENIZED_VERSION = 1
"""Part of the cache's fingerprint: raised when what a tokenized row holds changes."""


@dataclass(frozen=True)
class TokenizedData:
    """The first `--samples` rows of the data, tokenized."""

    rows: Any
    """A datasets.Dataset: `input_ids` (untruncated), `length`, and `label` where the data has one."""
    text_field: str
    chat: str | None
    """How chat messages became text: "chat template", or "role: content lines" for a tokenizer without one; None
    for plain text."""
    pad_token_id: int
    vocab_size: int
    """The tokenizer's (`len(tokenizer)`): a model with fewer embeddings cannot train on its ids."""
    cache_file: Path
    reused: bool
    """Whether the tokenization was read back from the cache (a run before tokenized the same rows)."""

    @property
    def lengths(self) -> list[int]:
        return [int(length) for length in self.rows["length"]]


def _cause(error: BaseException) -> str:
    """The deepest cause of `error`, as one line."""
    while error.__cause__ is not None:
        error = error.__cause__
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__


def _looks_like_path(data: str) -> bool:
    """A --data that is meant as a file or directory, not a Hub dataset name ("name" or "org/name")."""
    return data.startswith((".", "/", "~")) or data.count("/") > 1 or bool(Path(data).suffix)


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """datasets and the Hub offline while a Hub name is read: only what is in the local cache, never the network."""
    from datasets import config

    before = config.HF_HUB_OFFLINE, config.HF_DATASETS_OFFLINE
    config.HF_HUB_OFFLINE = config.HF_DATASETS_OFFLINE = True
    try:
        yield
    finally:
        config.HF_HUB_OFFLINE, config.HF_DATASETS_OFFLINE = before


def load_rows(data: str) -> Any:
    """The rows of --data as one datasets.Dataset (a saved DatasetDict's "train" split, else its first)."""
    import datasets

    datasets.disable_progress_bars()
    path = Path(data).expanduser()
    try:
        with _quiet_datasets():
            return _loaded(datasets, data, path)
    except ConfigError:
        raise
    except Exception as error:
        raise ConfigError("--data", f"cannot read {data}: {_cause(error)}") from None


@contextlib.contextmanager
def _quiet_datasets() -> Iterator[None]:
    """datasets' own log lines left out while it reads: what went wrong is said once, in the ConfigError."""
    from datasets.utils import logging

    before = logging.get_verbosity()
    logging.set_verbosity(logging.CRITICAL + 1)
    try:
        yield
    finally:
        logging.set_verbosity(before)


def _loaded(datasets: Any, data: str, path: Path) -> Any:
    """--data read by the datasets loader its kind takes."""
    if path.is_dir():
        if not (path / "state.json").exists() and not (path / "dataset_dict.json").exists():
            raise ConfigError(
                "--data",
                f"{data} is a directory but not a saved dataset (Dataset.save_to_disk writes state.json there): "
                "give one of its files",
            )
        loaded = datasets.load_from_disk(str(path))
    elif path.is_file():
        builder = FORMATS.get(path.suffix.lower())
        if builder is None:
            raise ConfigError(
                "--data",
                f"unknown format {path.suffix or '(no extension)'} of {data}: give a "
                f"{', '.join(FORMATS)} file, a saved dataset directory or a cached Hub dataset name",
            )
        loaded = datasets.load_dataset(builder, data_files=str(path), split="train")
    elif _looks_like_path(data):
        raise ConfigError("--data", f"no such file or directory: {data}")
    else:
        try:
            with _offline():
                loaded = datasets.load_dataset(data, split="train")
        except Exception as error:
            raise ConfigError(
                "--data",
                f"{data} is no file here and no Hub dataset in the local cache (gpuanat never downloads data; "
                f"load it once with datasets.load_dataset while online): {_cause(error)}",
            ) from None
    if isinstance(loaded, datasets.DatasetDict):
        loaded = loaded["train"] if "train" in loaded else next(iter(loaded.values()))
    return loaded


def text_field(columns: Sequence[str], given: str | None, data: str) -> str:
    """The column holding the text: --text-field when given, else the first of TEXT_FIELDS and CHAT_FIELDS."""
    if given is not None:
        if given not in columns:
            raise ConfigError("--text-field", f"{given!r} is not a column of {data}; its columns: {', '.join(columns)}")
        return given
    found = next((name for name in (*TEXT_FIELDS, *CHAT_FIELDS) if name in columns), None)
    if found is None:
        raise ConfigError(
            "--text-field",
            f"no text field in {data} (none of {', '.join(TEXT_FIELDS + CHAT_FIELDS)}); its columns: "
            f"{', '.join(columns) or 'none'}: name the one holding the text with --text-field NAME",
        )
    return found


def load_tokenizer(config: Any) -> Any:
    """The tokenizer --data is tokenized with (--tokenizer, else --model's), from local files only."""
    from transformers import AutoTokenizer

    name = config.tokenizer if config.tokenizer is not None else config.model
    flag = "--tokenizer" if config.tokenizer is not None else "--model"
    try:
        return AutoTokenizer.from_pretrained(os.path.expanduser(name), local_files_only=True)
    except Exception as error:
        also = "; or give --tokenizer PATH" if flag == "--model" else ""
        raise ConfigError(
            flag,
            f"no tokenizer found in {name} without the network ({_cause(error)}): give a tokenizer directory or a "
            f"Hub name in the local cache{also}",
        ) from None


def _is_list_feature(feature: Any) -> bool:
    return isinstance(feature, list) or type(feature).__name__ in ("List", "LargeList", "Sequence")


def _row_text(value: Any, row: int, field: str, chat: str | None, tokenizer: Any, data: str) -> str:
    if chat is not None:
        messages_ok = isinstance(value, list) and all(
            isinstance(message, dict) and isinstance(message.get("content"), str) and "role" in message
            for message in value
        )
        if not messages_ok:
            raise ConfigError("--data", f"row {row + 1} of {data}: {field} is not a list of {{role, content}} messages")
        if chat == "chat template":
            return str(tokenizer.apply_chat_template(value, tokenize=False))
        return "\n".join(f"{message['role']}: {message['content']}" for message in value)
    if not isinstance(value, str):
        kind = "null" if value is None else type(value).__name__
        raise ConfigError(
            "--data", f"row {row + 1} of {data}: {field} is {kind}, not text (--text-field names the column)"
        )
    return value


def _tokenize_batch(
    batch: dict[str, list[Any]], indices: list[int], *, field: str, chat: str | None, tokenizer: Any, data: str
) -> dict[str, Any]:
    texts = [
        _row_text(value, row, field, chat, tokenizer, data) for row, value in zip(indices, batch[field], strict=False)
    ]
    for row, label in zip(indices, batch.get(LABEL_FIELD, []), strict=False):
        if isinstance(label, bool) or not isinstance(label, int) or label < 0:
            raise ConfigError("--data", f"row {row + 1} of {data}: {LABEL_FIELD} {label!r} is not a class number")
    # A chat template writes the special tokens itself; plain text gets the tokenizer's (BERT's [CLS]/[SEP], BOS)
    ids = tokenizer(texts, add_special_tokens=chat != "chat template", truncation=False)["input_ids"]
    return {"input_ids": ids, "length": [len(row_ids) for row_ids in ids]}


def _fingerprint(rows: Any, data: str, field: str, chat: str | None, tokenizer: Any) -> str:
    """Names the tokenized rows in the cache: the same rows, field and tokenizer give the same name."""
    from datasets.fingerprint import Hasher

    backend = getattr(tokenizer, "backend_tokenizer", None)
    path = Path(data).expanduser()
    source = (
        [str(path.resolve()), path.stat().st_size, path.stat().st_mtime_ns] if path.is_file() else rows._fingerprint
    )
    parts = {
        "version": TOKENIZED_VERSION,
        "rows": source,
        "count": len(rows),
        "field": field,
        "chat": chat,
        "chat_template": getattr(tokenizer, "chat_template", None),
        "tokenizer": backend.to_str() if backend is not None else Hasher.hash(tokenizer),
        "tokenizer_class": type(tokenizer).__name__,
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def tokenized(config: Any) -> TokenizedData:
    """`config.data`'s first `config.samples` rows tokenized with its tokenizer (every row is checked and tokenized
    once; the cache keeps them for the next run). ConfigError for anything wrong with the data or the tokenizer."""
    import datasets

    rows = load_rows(config.data)
    field = text_field(rows.column_names, config.text_field, config.data)
    tokenizer = load_tokenizer(config)
    chat = None
    if field in CHAT_FIELDS or _is_list_feature(rows.features.get(field)):
        chat = "chat template" if getattr(tokenizer, "chat_template", None) else "role: content lines"
    key = _fingerprint(rows, config.data, field, chat, tokenizer)
    cache_file = Path(datasets.config.HF_DATASETS_CACHE) / CACHE_FOLDER / f"{key}.arrow"
    reused = cache_file.exists()
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    keep = [LABEL_FIELD] if LABEL_FIELD in rows.column_names and field != LABEL_FIELD else []
    tokenize = functools.partial(_tokenize_batch, field=field, chat=chat, tokenizer=tokenizer, data=config.data)
    try:
        tokens = rows.map(
            tokenize,
            batched=True,
            with_indices=True,
            remove_columns=[name for name in rows.column_names if name not in keep],
            cache_file_name=str(cache_file),
            load_from_cache_file=True,
            new_fingerprint=key,
        )
    except ConfigError:
        raise
    except Exception as error:
        if isinstance(error.__context__, ConfigError):  # datasets may wrap what the function raised
            raise error.__context__ from None
        raise ConfigError("--data", f"cannot tokenize {config.data}: {_cause(error)}") from None
    if len(tokens) == 0:
        raise ConfigError("--data", f"{config.data} has no rows")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    return TokenizedData(
        rows=tokens.select(range(min(len(tokens), config.samples))),
        text_field=field,
        chat=chat,
        pad_token_id=int(pad) if pad is not None else 0,
        vocab_size=len(tokenizer),
        cache_file=cache_file,
        reused=reused,
    )


def length_histogram(lengths: Sequence[int], seq_len: int) -> dict[str, int]:
    """Rows by token length, in buckets up to an eighth, a quarter, half and all of `seq_len`, and beyond it (rows
    that padding truncates and packing splits): {"1-8": 3, "9-16": 0, …, "65+": 1} at seq 64."""
    edges = sorted({max(1, seq_len // 8), max(1, seq_len // 4), max(1, seq_len // 2), seq_len})
    histogram: dict[str, int] = {}
    low = 1
    for edge in edges:
        histogram[f"{low}-{edge}"] = sum(1 for length in lengths if low <= length <= edge)
        low = edge + 1
    histogram[f"{low}+"] = sum(1 for length in lengths if length >= low)
    return histogram
