"""The history's tables: the schema of version SCHEMA_VERSION, the upgrades from versions 1 to 4, what a version-1
file holds exactly (an earlier gpuanat's, which carries no application_id), and the columns a runs row is read with.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

SCHEMA_VERSION = 5
"""PRAGMA user_version. 1: the first schema (its files carry no application_id); 2: runs also keep their
recorder's start time and the time of their last recorded write, to finalise runs whose recorder is gone; 3: runs
also keep their GPU's activity and energy (`ACTIVITY_COLUMNS`) as columns, for queries across runs; 4: runs carry
tags (`run_tags`), and the trials of a `tune` or `fit` the search they belong to (`searches`, `runs.search_id`); 5: runs
also keep the result's values a listing shows (`LISTED_COLUMNS`), so a listing of ten thousand runs reads no result."""
APPLICATION_ID = int.from_bytes(b"GANT", "big")
"""PRAGMA application_id of every history gpuanat creates (0x47414E54, ASCII 'GANT')."""

SEARCH_TABLES = """
CREATE TABLE IF NOT EXISTS searches (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    name TEXT,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS run_tags (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    tag TEXT NOT NULL,
    PRIMARY KEY (run_id, tag)
);
CREATE INDEX IF NOT EXISTS run_tags_by_tag ON run_tags(tag);
"""
"""Version 4's tables. `searches`: one row per `tune` or `fit` (kind "tune" or "fit"), whose trials name it in
`runs.search_id`; `run_tags`: a run's tags, user text kept as given."""

SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    kind TEXT NOT NULL,
    name TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    finished_at REAL,
    config_json TEXT NOT NULL,
    environment_json TEXT,
    result_json TEXT,
    log_path TEXT,
    recorder_pid INTEGER,
    recorder_started_at REAL,
    last_recorded_at REAL,
    sm_active_percent REAL,
    sm_occupancy_percent REAL,
    tensor_active_percent REAL,
    dram_bandwidth_percent REAL,
    average_power_w REAL,
    energy_joules REAL,
    joules_per_sample REAL,
    joules_per_token REAL,
    search_id INTEGER REFERENCES searches(id),
    gpu_name,
    device_name,
    train_runtime_s,
    samples_per_second,
    steady_samples_per_second,
    final_loss,
    peak_allocated_bytes,
    device_memory_used_bytes,
    achieved_tflops,
    mfu,
    prediction_error_percent,
    diagnosis_json TEXT,
    operations_anatomy_json TEXT,
    result_listed INTEGER
);
CREATE TABLE IF NOT EXISTS steps (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    step INTEGER NOT NULL,
    elapsed_s REAL NOT NULL,
    record_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS steps_by_run ON steps(run_id, step);
CREATE TABLE IF NOT EXISTS samples (
    run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
    t_s REAL NOT NULL,
    sample_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS samples_by_run ON samples(run_id, t_s);
"""
    + SEARCH_TABLES
)
"""Schema version 5. `recorder_started_at`: the recorder's process start time (Unix time, psutil);
`last_recorded_at`: Unix time of the last write of steps or samples, the end of a run whose recorder died.
The activity columns (`ACTIVITY_COLUMNS`) repeat the stored result's values of their names (NULL where it has none),
so a query can sort and filter runs by them: `SELECT id, joules_per_sample FROM runs ORDER BY joules_per_sample`.
The listed columns (`LISTED_COLUMNS`, `LISTED_JSON_COLUMNS`) likewise repeat the values a listing shows, and
`result_listed` says they do (1 or LISTED_BEFORE_30; NULL where the run stored no result, or a damaged one)."""

ACTIVITY_COLUMNS = (
    *("sm_active_percent", "sm_occupancy_percent", "tensor_active_percent", "dram_bandwidth_percent"),
    *("average_power_w", "energy_joules", "joules_per_sample", "joules_per_token"),
)
"""The result's GPU activity and energy (`measure.activity`) that version 3 keeps as columns of runs."""

LISTED_COLUMNS = (
    *("gpu_name", "device_name", "train_runtime_s", "samples_per_second", "steady_samples_per_second"),
    *("final_loss", "peak_allocated_bytes", "device_memory_used_bytes", "achieved_tflops", "mfu"),
    "prediction_error_percent",
)
"""The result's values of these names that version 5 keeps as columns of runs, for listings (`history_listing`; with
the activity columns `tensor_active_percent` and `joules_per_sample`). Declared without a type, so each value keeps
its JSON type: an integer stays one, as the stored result has it."""
LISTED_JSON_COLUMNS = {"diagnosis_json": "diagnosis", "operations_anatomy_json": "operations_anatomy"}
"""The result's values that version 5 keeps as JSON text, by column: a listing shows a little of each."""
LISTED_BEFORE_30 = 2
"""`result_listed` of a result whose bands were written before issue #30 (`anatomy.bands_of_one_moment`): its listed
columns hold its values, and it is read whole where the whole result is shown. 1: listed, and the stored text is
the result as it reads now; NULL: no result stored, or a damaged one."""


def listed_from_result(result: str) -> str:
    """`column = value` for each listed column of version 5, its value read from the JSON text `result` (an SQL
    expression), and `result_listed`: all NULL where `result` is NULL or not valid JSON."""
    valid = f"json_valid({result})"
    scalars = [
        f"{column} = CASE WHEN {valid} THEN json_extract({result}, '$.{column}') END" for column in LISTED_COLUMNS
    ]
    objects = [
        f"{column} = CASE WHEN {valid} AND json_type({result}, '$.{key}') != 'null'"
        f" THEN json_quote(json_extract({result}, '$.{key}')) END"
        for column, key in LISTED_JSON_COLUMNS.items()
    ]
    before_30 = (
        f"json_type({result}, '$.gradients_at_forward_end_bytes') IS NOT NULL"
        f" AND json_type({result}, '$.gradients_after_backward_bytes') IS NULL"
    )
    listed = f"result_listed = CASE WHEN {valid} THEN CASE WHEN {before_30} THEN {LISTED_BEFORE_30} ELSE 1 END END"
    return ", ".join([*scalars, *objects, listed])


MIGRATION_FROM_1 = (
    "ALTER TABLE runs ADD COLUMN recorder_started_at REAL",
    "ALTER TABLE runs ADD COLUMN last_recorded_at REAL",
)
MIGRATION_FROM_2 = (
    *(f"ALTER TABLE runs ADD COLUMN {column} REAL" for column in ACTIVITY_COLUMNS),
    # the results a gpuanat of schema 2 already wrote with these values: a damaged result_json stays as it is, NULL
    "UPDATE runs SET "
    + ", ".join(
        f"{column} = CASE WHEN json_valid(result_json) THEN json_extract(result_json, '$.{column}') END"
        for column in ACTIVITY_COLUMNS
    ),
)
"""Version 2 to 3: the activity columns, filled from the results stored."""
MIGRATION_FROM_3 = (
    *(statement.strip() for statement in SEARCH_TABLES.split(";") if statement.strip()),
    "ALTER TABLE runs ADD COLUMN search_id INTEGER REFERENCES searches(id)",
)
"""Version 3 to 4: the searches and tags tables, and each run's search (none for the runs recorded before)."""
MIGRATION_FROM_4 = (
    *(f"ALTER TABLE runs ADD COLUMN {column}" for column in LISTED_COLUMNS),
    *(f"ALTER TABLE runs ADD COLUMN {column} TEXT" for column in LISTED_JSON_COLUMNS),
    "ALTER TABLE runs ADD COLUMN result_listed INTEGER",
    # the results stored, read once: a damaged result_json stays as it is, its columns NULL (a listing reads it whole
    # and says it is damaged)
    "UPDATE runs SET " + listed_from_result("result_json") + " WHERE result_json IS NOT NULL",
)
"""Version 4 to 5: the listed columns, filled from the results stored."""


def upgrade_statements(version: int) -> tuple[str, ...]:
    """What brings a history of schema `version` (1 to SCHEMA_VERSION - 1) to SCHEMA_VERSION, in order."""
    steps = {1: MIGRATION_FROM_1, 2: MIGRATION_FROM_2, 3: MIGRATION_FROM_3, 4: MIGRATION_FROM_4}
    return tuple(statement for step in range(max(version, 1), SCHEMA_VERSION) for statement in steps[step])


V1_TABLES = {
    "runs": (
        "id",
        "kind",
        "name",
        "status",
        "created_at",
        "finished_at",
        "config_json",
        "environment_json",
        "result_json",
        "log_path",
        "recorder_pid",
    ),
    "steps": ("run_id", "step", "elapsed_s", "record_json"),
    "samples": ("run_id", "t_s", "sample_json"),
}
"""The tables of a version-1 history, which carries no application_id: a file must have exactly these."""
V1_INDEXES = {"steps_by_run", "samples_by_run"}
RUN_COLUMNS = (
    "id, kind, name, status, created_at, finished_at, config_json, environment_json, result_json,"
    " log_path, recorder_pid, recorder_started_at, last_recorded_at, search_id"
)
"""The columns of a runs row as `HistoryStore._row`, `_gone` and `finalise_interrupted` read it (by name)."""
