"""The history as a listing reads it: every run's row with only what a listing shows, fast for ten thousand runs.

A run's stored result is some 9 KB of JSON; parsing each in Python and building its whole `RunResult` took most of
`gpuanat history`'s 8 s for 10,000 runs (benchmarks/history_scale.py). A listing shows a dozen of its values, so SQLite
picks them out of the stored text (`json_extract`, in C) and Python reads a short array per run; the environment is
not read at all. A run whose result is damaged, or that its recorder left running (shown as interrupted, its result
rebuilt from its steps), is read whole, as `HistoryStore.runs` reads it. A search's trial counts come in one query.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from typing import Any

from gpuanat.core.store.history import HistoryStore, RunRow
from gpuanat.core.vocabulary.result import RunResult

LISTED_RESULT_KEYS = (
    *("gpu_name", "device_name", "train_runtime_s", "samples_per_second", "steady_samples_per_second"),
    *("final_loss", "peak_allocated_bytes", "device_memory_used_bytes", "achieved_tflops", "mfu"),
    *("tensor_active_percent", "joules_per_sample", "prediction_error_percent", "diagnosis", "operations_anatomy"),
)
"""The result's keys a listing shows (`report.history_rows`) or folds searches by (`searches.best_trial`)."""
_LISTED_PATHS = ", ".join(f"'$.{key}'" for key in LISTED_RESULT_KEYS)
_LISTED_RESULT = (
    f"CASE WHEN result_json IS NULL THEN NULL WHEN json_valid(result_json) THEN json_extract(result_json, "
    f"{_LISTED_PATHS}) ELSE '!' END AS result_json"
)
"""The listed values as one JSON array (NULL: none stored; '!': damaged, read whole to say so)."""


def listed_runs(
    store: HistoryStore, limit: int | None = None, *, name_contains: str | None = None, tagged: str | None = None
) -> list[RunRow]:
    """`store.runs(limit, name_contains=…, tagged=…)`, oldest first, each run's `result` holding only
    LISTED_RESULT_KEYS and its `environment` empty: for listings (`history`, the dashboard's history screen). Read a
    run whole with `store.run(run_id)`."""
    columns = ", ".join(
        _LISTED_RESULT
        if column == "result_json"
        else "NULL AS environment_json"
        if column == "environment_json"
        else column
        for column in store._run_columns.split(", ")
    )
    rows = store._selected(columns, limit, name_contains, tagged)
    tags, searches = store._tags_and_searches()
    listed = []
    for row in reversed(rows):
        if row["result_json"] == "!" or store._gone(row):
            whole = store.run(row["id"])
            if whole is not None:
                listed.append(whole)
            continue
        values = json.loads(row["result_json"]) if row["result_json"] is not None else []
        result = _listed_result({key: value for key, value in zip(LISTED_RESULT_KEYS, values, strict=False)})
        listed.append(
            RunRow(
                id=row["id"],
                kind=row["kind"],
                name=row["name"],
                status=row["status"],
                created_at=row["created_at"],
                finished_at=row["finished_at"],
                config=store._json(row["config_json"], row["id"]),
                environment={},
                result=result,
                log_path=row["log_path"],
                tags=tags.get(row["id"], ()),
                search=searches.get(row["search_id"]) if row["search_id"] is not None else None,
            )
        )
    return listed


_EMPTY_RESULT = RunResult()
_FRESH_DEFAULTS = tuple(
    (field.name, field.default_factory)
    for field in dataclasses.fields(RunResult)
    if field.default_factory is not dataclasses.MISSING
)


def _listed_result(values: dict[str, Any]) -> RunResult:
    """`RunResult.from_json(values)`, made by copying an empty one: building all of RunResult's fields one by one is
    most of a listing's time for ten thousand runs."""
    result = copy.copy(_EMPTY_RESULT)
    fresh = {name: factory() for name, factory in _FRESH_DEFAULTS}
    decoded = {key: RunResult.DECODERS.get(key, _same)(value) for key, value in values.items() if value is not None}
    result.__dict__.update(fresh, **decoded, json_keys=tuple(decoded))
    return result


def _same(value: Any) -> Any:
    return value


def stored_results(store: HistoryStore) -> dict[int, str]:
    """Every run's result as stored (JSON text), by run id, where it reads as written: valid, of a run that ended, not
    of the bands of before issue #30 (`anatomy.bands_of_one_moment`). A run not in it is read whole (`store.run`)."""
    rows = store._fetch(
        "SELECT id, result_json FROM runs WHERE status != 'running' AND result_json IS NOT NULL"
        " AND json_valid(result_json) AND (instr(result_json, '\"gradients_at_forward_end_bytes\"') = 0"
        " OR instr(result_json, '\"gradients_after_backward_bytes\"') > 0)"
    )
    return {run_id: text for run_id, text in rows}


def search_totals(store: HistoryStore) -> dict[int, int]:
    """Every search's trial count in the history, by its id, in one query."""
    if not store.keeps_tags:
        return {}
    rows = store._fetch("SELECT search_id, count(*) FROM runs WHERE search_id IS NOT NULL GROUP BY search_id")
    return {search_id: count for search_id, count in rows}
