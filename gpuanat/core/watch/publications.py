"""Finding and following the publication files of a watched process tree.

A process that runs an `AnatomyCallback` gpuanat did not launch publishes its probe events into
`<dir>/<pid>.jsonl` (`gpuanat.core.measure.publish`: where, in which format, and how a reader trusts the file).
The watch does not know which process of the tree publishes, nor which directory its environment names:
`Publications` looks, at most every `PUBLICATION_SEARCH_INTERVAL_S`, for each process of the tree that does not
publish yet in the directories it would publish to (`default_publication_dirs`), and reads what each file found
adds at every poll. A file the reader stops trusting is dropped and its problem kept, to say why the run reads
as not published.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil

from gpuanat.core.measure.publish import PUBLICATION_SUFFIX, PublicationReader, publication_dirs
from gpuanat.core.vocabulary.protocol import Event, Malformed, Ranked

PUBLICATION_SEARCH_INTERVAL_S = 1.0
"""How often the tree's processes that do not publish yet are looked for in the publication directories."""


def default_publication_dirs(pid: int) -> list[Path]:
    """Where `pid` would publish: from its own environment when we may read it, then from ours."""
    uid = os.getuid()
    dirs: list[Path] = []
    with contextlib.suppress(psutil.Error):
        dirs.extend(publication_dirs(psutil.Process(pid).environ(), uid))
    dirs.extend(publication_dirs(os.environ, uid))
    return list(dict.fromkeys(dirs))


class Publications:
    """Finds and follows the publication files of the watched tree's processes."""

    def __init__(self, dirs_for: Callable[[int], list[Path]], clock: Callable[[], float]) -> None:
        self._dirs_for = dirs_for
        self._clock = clock
        self.readers: dict[int, PublicationReader] = {}
        self.problems: dict[int, str] = {}
        self._searched_at_s: dict[int, float] = {}

    def poll(self, pids: Iterable[int]) -> list[tuple[int, Event | Ranked | Malformed]]:
        now_s = self._clock()
        for pid in pids:
            if pid in self.readers or now_s - self._searched_at_s.get(pid, -1e9) < PUBLICATION_SEARCH_INTERVAL_S:
                continue
            self._searched_at_s[pid] = now_s
            for directory in self._dirs_for(pid):
                path = directory / f"{pid}{PUBLICATION_SUFFIX}"
                if os.path.lexists(path):
                    try:
                        started_s = psutil.Process(pid).create_time()
                    except psutil.Error:
                        break
                    self.readers[pid] = PublicationReader(path, not_before_s=started_s - 0.5)
                    break
        events: list[tuple[int, Event | Ranked | Malformed]] = []
        for pid, reader in list(self.readers.items()):
            events.extend((pid, event) for event in reader.read())
            if reader.problem is not None:
                self.problems[pid] = reader.problem
                reader.close()
                del self.readers[pid]
                self._searched_at_s[pid] = now_s + 30.0  # do not retry an untrusted file at every sample
            else:
                self.problems.pop(pid, None)
        return events

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()
