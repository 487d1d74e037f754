"""The history screen's rows: every run (a search folded into one row unless expanded), and how they are filtered and
sorted, for every run at once while the table holds PAGE_ROWS of them (`screens/history.py`).

Textual only in the screen: this is plain Python over `report.listing_rows`.
"""

from __future__ import annotations

from typing import Any

from gpuanat.core.store.history import RunRow
from gpuanat.core.store.report import HISTORY_COLUMNS, listing_rows
from gpuanat.core.store.searches import SearchLine, fold_searches

PAGE_ROWS = 100
"""The rows the table holds at first, and how many more `m` adds: the newest in the run order (the top ones in any
other order), so that a history of ten thousand runs opens and filters at once (docs/history.md, "Big histories")."""
SCREEN_COLUMN_ORDER = (
    "id",
    "when",
    "name",
    "status",
    "techniques",
    "time_s",
    "samples_per_second",
    "steady_samples_per_second",
    "achieved_tflops",
    "mfu",
    "tensor_active_percent",
    "joules_per_sample",
    "loss",
    "peak_allocated",
    "gpu_memory_mb",
    "prediction_error_delta",
    "model",
    "device",
)
"""The metrics come before the long model and device names so that 120 columns show them."""
SCREEN_COLUMNS = tuple(next(c for c in HISTORY_COLUMNS if c.key == key) for key in SCREEN_COLUMN_ORDER)
SORT_KEYS = (
    "id",
    "time_s",
    "samples_per_second",
    "steady_samples_per_second",
    "achieved_tflops",
    "mfu",
    "tensor_active_percent",
    "joules_per_sample",
    "loss",
    "peak_allocated",
    "gpu_memory_mb",
    "prediction_error_delta",
    "status",
    "name",
    "model",
    "techniques",
    "device",
)
"""The columns `<` and `>` step through; `id` (the order the runs were made in) first."""
FILTERED_KEYS = ("name", "status", "model", "techniques", "device", "tags")


def sorted_rows(rows: list[dict[str, Any]], key: str, descending: bool) -> list[dict[str, Any]]:
    """`rows` by `key`; rows without a value last either way (a failed run has no samples/s)."""
    present = [row for row in rows if row.get(key) is not None]
    missing = [row for row in rows if row.get(key) is None]
    return sorted(present, key=lambda row: row[key], reverse=descending) + missing


def filtered_rows(rows: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """The rows whose name, status, model, techniques, device or tags contain `text` (any case), by the `haystack`
    `table_rows` gave each (a row without one is searched field by field)."""
    needle = text.strip().lower()
    if not needle:
        return rows
    return [row for row in rows if needle in (row.get("haystack") or _haystack(row))]


def _haystack(row: dict[str, Any]) -> str:
    """The row's FILTERED_KEYS values in lower case, one a line: a filter looks for its text in this."""
    return "\n".join(str(row.get(key) or "").lower() for key in FILTERED_KEYS)


def table_rows(runs: list[RunRow], expanded: set[int]) -> list[dict[str, Any]]:
    """The table's rows: each search folded into one row (its best trial's, `key` "s3") unless `expanded`; every row
    with its `key` (the table's row key), `run_id` (the run it opens and compares) and `run_ids` (what `t` and `d` act
    on: a folded search's every trial), and `order` (its place in the run order)."""
    lines = [
        trial
        for line in fold_searches(runs)
        for trial in (line.trials if isinstance(line, SearchLine) and line.search.id in expanded else (line,))
    ]
    rows = listing_rows(lines)
    for line, row in zip(lines, rows, strict=True):
        trials = line.trials if isinstance(line, SearchLine) else (line,)
        best = line.best if isinstance(line, SearchLine) else line
        row.update(key=str(row["id"]), run_id=best.id, run_ids=[trial.id for trial in trials], order=trials[0].id)
        row["haystack"] = _haystack(row)
        row["when"] = row["when"][5:]  # the year goes: MM-DD HH:MM
    return rows
