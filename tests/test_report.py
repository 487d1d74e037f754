"""Tables: % deltas against vanilla and the export formats."""

from __future__ import annotations

import csv
import io

from gpuanat.core.store.report import SWEEP_COLUMNS, format_bytes, render_csv, render_markdown, sweep_rows

RESULTS = [
    {
        "name": "vanilla",
        "status": "ok",
        "train_runtime_s": 60.0,
        "samples_per_second": 8.0,
        "steady_samples_per_second": 9.0,
        "device_memory_used_bytes": 15_000 * 1024**2,
        "peak_allocated_bytes": 1,
    },
    {
        "name": "fp16",
        "status": "ok",
        "train_runtime_s": 30.0,
        "samples_per_second": 16.0,
        "steady_samples_per_second": 18.9,
        "device_memory_used_bytes": 12_000 * 1024**2,
        "peak_allocated_bytes": 1,
    },
    {"name": "8-bit adam", "status": "skipped", "reason": "8-bit Adam needs bitsandbytes"},
]


def test_deltas_against_vanilla():
    vanilla, fp16, skipped = sweep_rows(RESULTS)
    assert vanilla["time_delta"] == 0.0
    assert fp16["time_delta"] == -50.0 and fp16["samples_per_second_delta"] == 100.0
    assert round(fp16["steady_delta"], 6) == 110.0
    assert fp16["memory_delta"] == -20.0
    assert skipped["time_delta"] is None and skipped["reason"] == "8-bit Adam needs bitsandbytes"


def test_no_deltas_when_vanilla_did_not_run():
    rows = sweep_rows([{**RESULTS[0], "status": "oom"}, RESULTS[1]])
    assert rows[1]["time_delta"] is None


def test_markdown_and_csv():
    rows = sweep_rows(RESULTS)
    markdown = render_markdown(SWEEP_COLUMNS, rows).splitlines()
    assert markdown[0].startswith("| experiment | status | Time s |")
    assert "| fp16 | ok | 30.00 | -50.0% | 16.00 | +100.0% |" in markdown[3]
    assert markdown[3].count("| 12000 |") == 1
    parsed = list(csv.DictReader(io.StringIO(render_csv(SWEEP_COLUMNS, rows))))
    assert parsed[1]["samples_per_second_delta"] == "100.0" and parsed[2]["time_s"] == ""


def test_sizes_print_in_the_largest_unit_that_is_at_least_one():
    assert [
        format_bytes(value) for value in (None, 512 * 1024**2, 80 * 1024**3, 1023 * 1024**3, 1024**4, 114 * 1024**4)
    ] == ["—", "512 MiB", "80.00 GiB", "1023.00 GiB", "1.00 TiB", "114.00 TiB"]


def test_the_history_names_a_run_only_with_what_says_something():
    """Issue #17: every unnamed run from the dashboard read `launched` in the name column. A name given (a sweep
    experiment, a script) shows; a watched session says so; a plain run has no name ("—")."""
    from gpuanat.core.store.history import RunRow
    from gpuanat.core.store.report import display_value, history_rows
    from gpuanat.core.vocabulary.result import RunResult

    def row(run_id: int, kind: str, name: str | None) -> RunRow:
        return RunRow(
            id=run_id,
            kind=kind,
            name=name,
            status="ok",
            created_at=1_795_294_194.0,
            finished_at=None,
            config={"preset": "tiny", "device": "cpu"},
            environment={},
            result=RunResult(),
            log_path=None,
        )

    rows = history_rows([row(1, "launched", None), row(2, "launched", "bf16"), row(3, "watched", None)])
    assert [display_value("name", entry["name"]) for entry in rows] == ["—", "bf16", "watched"]
