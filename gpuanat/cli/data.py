"""`--data` in the commands: checked and tokenized before any GPU work, and how a run's data reads in its summary
(docs/data.md)."""

from __future__ import annotations

import sys

from gpuanat.core.store.report import format_number
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.dataset.load import TokenizedData


def check_data(config: RunConfig) -> TokenizedData:
    """--data read and tokenized now, before any GPU work (the tokens are cached for the training child; one line on
    stderr says whether an earlier run had tokenized them). ConfigError, which the commands say in one line with exit
    2, for a missing file, an unknown format, no text field, a tokenizer not found offline, a bad row."""
    from gpuanat.dataset.load import tokenized

    data = tokenized(config)
    done = "read back from the cache (tokenized by an earlier run)" if data.reused else "tokenized into the cache"
    print(f"gpuanat: --data: {len(data.rows)} rows of {data.text_field!r}, {done} {data.cache_file}", file=sys.stderr)
    return data


def checked_longest_row(config: RunConfig) -> int | None:
    """--data checked as `check_data` does (ConfigError where it cannot be used), and its longest row in tokens,
    which sizes the run's predictions (`core.memory.data_length`); None without --data."""
    if config.data is None:
        return None
    from gpuanat.core.memory.data_length import longest_row

    return longest_row(check_data(config).lengths)


def data_line(result: RunResult) -> str:
    """ "Real tokens/second: 747 (steady 874); padding 41.1% of the tokens trained": a --data run's data."""
    steady = result.steady_real_tokens_per_second
    return (
        f"Real tokens/second: {format_number(result.real_tokens_per_second)}"
        + (f" (steady {format_number(steady)})" if steady is not None else "")
        + f"; padding {result.padding_percent:.1f}% of the tokens trained"
    )
