"""What the history gives back: a run's row (`RunRow`), the search it is a trial of (`SearchRef`), what a deletion
removed (`Deleted`), which log files are gpuanat's own to delete (`own_log_path`), and the run ids of a statement in
chunks SQLite binds (`id_chunks`).

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuanat.core.vocabulary.result import RunResult


@dataclass(frozen=True)
class RunRow:
    id: int
    kind: str
    """"launched" (gpuanat started it) or "watched"."""
    name: str | None
    """The name given — `run --name`, a sweep's experiment, a tune or fit trial, `watch --save NAME`, a rename — kept as
    given (shown escaped); None when it has none."""
    status: str
    created_at: float
    """Unix time."""
    finished_at: float | None
    config: dict[str, Any]
    environment: dict[str, Any]
    result: RunResult
    """The stored result as written (no key when the run stored none yet)."""
    log_path: str | None
    tags: tuple[str, ...] = ()
    """Its tags (`history --tag`, `run --tag`, the dashboard's `t`), sorted; user text kept as given (shown escaped)."""
    search: SearchRef | None = None
    """The `tune` or `fit` it is a trial of; None for a run of its own."""


@dataclass(frozen=True)
class SearchRef:
    """A `tune` or `fit`: the search whose trials name it (schema 4's `searches`)."""

    id: int
    kind: str
    """"tune" or "fit"."""
    name: str | None
    created_at: float


@dataclass(frozen=True)
class Deleted:
    """What `HistoryStore.delete_runs` removed."""

    run_ids: tuple[int, ...]
    log_paths: tuple[str, ...]
    """The log files removed: only those gpuanat wrote under the history's own log folder (`own_log_path`)."""


def own_log_path(history_path: Path, run_id: int, log_path: str | None) -> Path | None:
    """Run `run_id`'s log when gpuanat wrote it where it writes logs — `logs/run-ID.log` beside the history, a
    regular file, not a link — else None: a file elsewhere is never gpuanat's to delete."""
    if not log_path:
        return None
    expected = history_path.parent / "logs" / f"run-{run_id}.log"
    given = Path(log_path)
    try:
        if given.is_symlink() or not given.is_file() or not expected.is_file():
            return None
        if os.path.samefile(given, expected) and given.resolve() == expected.resolve():
            return expected
    except OSError:
        return None
    return None


IDS_PER_STATEMENT = 900
"""The most run ids one statement binds: under SQLite's variable limit of old builds (999, with room for a
statement's other values), so deleting, tagging or checking tens of thousands of runs goes in chunks of this."""


def id_chunks(ids: list[int]) -> Iterable[tuple[list[int], str]]:
    """`ids` in slices of at most IDS_PER_STATEMENT, each with its "?, ?, …" marks."""
    for start in range(0, len(ids), IDS_PER_STATEMENT):
        chunk = ids[start : start + IDS_PER_STATEMENT]
        yield chunk, ", ".join("?" * len(chunk))
