"""Writing protocol events from the training process to the parent's pipe."""

from __future__ import annotations

import os

from gpuanat.core.vocabulary.protocol import Event, encode


class ParentGone(Exception):
    """The reading end of the events pipe was closed: nobody is listening any more."""


class EventWriter:
    """Writes one event per line to a file descriptor, whole lines at a time."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def emit(self, event: Event) -> None:
        data = encode(event)
        try:
            while data:
                written = os.write(self._fd, data)
                data = data[written:]
        except BrokenPipeError as error:
            raise ParentGone from error
