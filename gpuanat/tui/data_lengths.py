"""--data's longest row for the launching dashboard's predictions (`core.memory.data_length`), as `gpuanat predict`
and the commands size theirs.

Reading it tokenizes the data (seconds, into the datasets cache the run then reads back): never on the event loop.
The panel asks with `known`, which starts a worker the first time and answers None meanwhile (the prediction at
--seq-len); the worker posts `DataLengthRead` and the panel repaints. A run or search asks with `read` from its own
worker, which waits for the answer. Answers are kept per data, tokenizer, text field, samples and model (whose tokenizer
is used when none is given); data that cannot be read is kept as None (the run says why, in one line).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from textual.message import Message

from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.tui.messages import DataLengthRead

DataKey = tuple[object, ...]


def data_key(config: RunConfig) -> DataKey:
    """What the data's token lengths depend on."""
    return (config.data, config.tokenizer, config.text_field, config.samples, config.model, config.preset)


class DataLengths:
    """The longest row of each --data read, in tokens."""

    def __init__(self, post: Callable[[Message], None], start_worker: Callable[[Callable[[], None]], None]) -> None:
        """`post` hands a message to the dashboard; `start_worker` runs a function in a worker thread."""
        self._post = post
        self._start_worker = start_worker
        self._longest: dict[DataKey, int | None] = {}
        self._reading: set[DataKey] = set()
        self._lock = threading.Lock()

    def known(self, config: RunConfig) -> int | None:
        """The longest row of `config`'s data if read; else None, and a worker reads it (on the event loop)."""
        if config.data is None:
            return None
        key = data_key(config)
        with self._lock:
            if key in self._longest:
                return self._longest[key]
            if key in self._reading:
                return None
            self._reading.add(key)

        def read_in_worker() -> None:
            self._read_and_tell(config)

        self._start_worker(read_in_worker)
        return None

    def read(self, config: RunConfig) -> int | None:
        """The longest row of `config`'s data, read now if it was not (in a worker: it may take seconds)."""
        if config.data is None:
            return None
        with self._lock:
            if data_key(config) in self._longest:
                return self._longest[data_key(config)]
        return self._read_and_tell(config)

    def _read_and_tell(self, config: RunConfig) -> int | None:
        from gpuanat.core.memory.data_length import longest_row
        from gpuanat.dataset.load import tokenized

        try:
            longest: int | None = longest_row(tokenized(config).lengths)
        except Exception:  # bad data: the run started with it fails with one line naming the flag
            longest = None
        with self._lock:
            self._longest[data_key(config)] = longest
            self._reading.discard(data_key(config))
        self._post(DataLengthRead())
        return longest
