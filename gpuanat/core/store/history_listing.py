"""The history as a listing reads it: every run's row with only what a listing shows, fast for ten thousand runs.

A run's stored result is some 9 KB of JSON; parsing each in Python and building its whole `RunResult` took most of
`gpuanat history`'s 8 s for 10,000 runs (benchmarks/history_scale.py). A listing shows a dozen of its values, which a
history of schema 5 keeps as columns of their own (`history_schema.LISTED_COLUMNS`): a listing reads those and never
the stored result; the environment is not read at all, and runs of one config share its parsed JSON. A file of an
earlier schema, read as it is, has SQLite pick the values out of the stored text (`json_extract`, in C). A run whose
result is damaged, or that its recorder left running (shown as interrupted, its result rebuilt from its steps), is
read whole, as `HistoryStore.runs` reads it. A search's trial counts come in one query.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from gpuanat.core.store.history import ACTIVE_STATUSES, HistoryStore, RunRow
from gpuanat.core.store.history_schema import LISTED_COLUMNS, LISTED_JSON_COLUMNS
from gpuanat.core.vocabulary.result import RunResult

LISTED_RESULT_KEYS = (
    *("gpu_name", "device_name", "train_runtime_s", "samples_per_second", "steady_samples_per_second"),
    *("final_loss", "peak_allocated_bytes", "device_memory_used_bytes", "achieved_tflops", "mfu"),
    *("tensor_active_percent", "joules_per_sample", "prediction_error_percent", "diagnosis", "operations_anatomy"),
)
"""The result's keys a listing shows (`report.history_rows`) or folds searches by (`searches.best_trial`)."""
_SCALAR_COLUMNS = (*LISTED_COLUMNS, "tensor_active_percent", "joules_per_sample")
"""The columns of schema 5 holding LISTED_RESULT_KEYS's plain values, named as the keys."""
_FROM_COLUMNS = (
    *_SCALAR_COLUMNS,
    *LISTED_JSON_COLUMNS,
    "CASE WHEN result_json IS NULL THEN 0 WHEN result_listed IS NOT NULL THEN 1 ELSE 2 END AS result_state",
)
"""What a listing selects of a history of schema 5 besides the run's own columns. result_state: 0 no result stored, 1
listed in the columns, 2 to be read whole (damaged: it says so)."""
_PATHS = ", ".join(f"'$.{key}'" for key in LISTED_RESULT_KEYS)
_FROM_RESULT = (
    f"CASE WHEN result_json IS NULL THEN NULL WHEN json_valid(result_json) THEN json_extract(result_json, {_PATHS})"
    " END AS listed_values",
    "CASE WHEN result_json IS NULL THEN 0 WHEN json_valid(result_json) THEN 1 ELSE 2 END AS result_state",
)
"""The same of an earlier history: the listed values as one JSON array, picked out of the stored result."""


def listed_runs(
    store: HistoryStore, limit: int | None = None, *, name_contains: str | None = None, tagged: str | None = None
) -> list[RunRow]:
    """`store.runs(limit, name_contains=…, tagged=…)`, oldest first, each run's `result` holding only
    LISTED_RESULT_KEYS and its `environment` empty: for listings (`history`, the dashboard's history screen). Read a
    run whole with `store.run(run_id)`. Runs whose config is the same text share one `config` dict: read, not
    changed."""
    columned = keeps_listed_columns(store)
    own = [column for column in store._run_columns.split(", ") if column not in ("result_json", "environment_json")]
    selected = [*own, *(_FROM_COLUMNS if columned else _FROM_RESULT)]
    rows = store._selected(", ".join(selected), limit, name_contains, tagged)
    at = {column.split(" AS ")[-1]: index for index, column in enumerate(selected)}  # rows are read by position
    first = at["listed_values"] if not columned else at[_SCALAR_COLUMNS[0]]
    scalars = slice(first, first + len(_SCALAR_COLUMNS))
    objects = [(at[column], key) for column, key in LISTED_JSON_COLUMNS.items()] if columned else []
    tags, searches = store._tags_and_searches()
    configs: dict[str, dict[str, Any]] = {}
    listed = []
    for row in reversed(rows):
        run_id, state, search_id = row[at["id"]], row[at["result_state"]], row[at["search_id"]]
        if state == 2 or (row[at["status"]] in ACTIVE_STATUSES and store._gone(row)):
            whole = store.run(run_id)
            if whole is not None:
                listed.append(whole)
            continue
        if state == 0:
            values: dict[str, Any] = {}
        elif columned:
            values = dict(zip(_SCALAR_COLUMNS, row[scalars], strict=True))
            for index, key in objects:
                values[key] = json.loads(row[index]) if row[index] is not None else None
        else:
            values = dict(zip(LISTED_RESULT_KEYS, json.loads(row[first]), strict=False))
        config_json = row[at["config_json"]]
        config = configs.get(config_json)
        if config is None:
            config = configs[config_json] = store._json(config_json, run_id)
        listed.append(
            RunRow(
                id=run_id,
                kind=row[at["kind"]],
                name=row[at["name"]],
                status=row[at["status"]],
                created_at=row[at["created_at"]],
                finished_at=row[at["finished_at"]],
                config=config,
                environment={},
                result=_listed_result(values),
                log_path=row[at["log_path"]],
                tags=tags.get(run_id, ()),
                search=searches.get(search_id) if search_id is not None else None,
            )
        )
    return listed


_EMPTY_FIELDS = dict(RunResult().__dict__)
_FRESH_DEFAULTS = tuple(
    (field.name, field.default_factory)
    for field in dataclasses.fields(RunResult)
    if field.default_factory is not dataclasses.MISSING
)


def _listed_result(values: dict[str, Any]) -> RunResult:
    """`RunResult.from_json(values)`, made from an empty one's fields: building all of RunResult's fields one by one
    is most of a listing's time for ten thousand runs."""
    result = RunResult.__new__(RunResult)
    decoded = {key: RunResult.DECODERS.get(key, _same)(value) for key, value in values.items() if value is not None}
    fields = result.__dict__
    fields.update(_EMPTY_FIELDS)
    for name, factory in _FRESH_DEFAULTS:
        fields[name] = factory()
    fields.update(decoded)
    fields["json_keys"] = tuple(decoded)
    return result


def _same(value: Any) -> Any:
    return value


def keeps_listed_columns(store: HistoryStore) -> bool:
    """Whether the history has schema 5's listed columns (a read-only open of an earlier file has not)."""
    return bool(store._fetch("SELECT 1 FROM pragma_table_info('runs') WHERE name = 'result_listed'"))


def stored_results(store: HistoryStore) -> dict[int, str]:
    """Every run's result as stored (JSON text), by run id, where it reads as written: valid, of a run that ended, not
    of the bands of before issue #30 (`anatomy.bands_of_one_moment`; of schema 5 `result_listed` says so). A run not in
    it is read whole (`store.run`): a damaged one then says so."""
    current = (
        "result_listed = 1"
        if keeps_listed_columns(store)
        else "(instr(result_json, '\"gradients_at_forward_end_bytes\"') = 0"
        " OR instr(result_json, '\"gradients_after_backward_bytes\"') > 0)"
    )
    rows = store._fetch(
        "SELECT id, result_json FROM runs WHERE status != 'running' AND result_json IS NOT NULL"
        f" AND {current} AND json_valid(result_json)"
    )
    return {run_id: text for run_id, text in rows}


def search_totals(store: HistoryStore) -> dict[int, int]:
    """Every search's trial count in the history, by its id, in one query."""
    if not store.keeps_tags:
        return {}
    rows = store._fetch("SELECT search_id, count(*) FROM runs WHERE search_id IS NOT NULL GROUP BY search_id")
    return {search_id: count for search_id, count in rows}
