"""`gpuanat history --compare RUN_ID RUN_ID…`: recorded runs side by side, as the dashboard's compare view has them —
the techniques that differ, then every metric (time, rates, step phases, memory, the final and lowest loss) with its
Δ% against the first run; as a table, markdown, CSV or JSON (reads, never writes)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpuanat.cli.common import EXIT_OK, fail_usage, history_path, open_store, print_table
from gpuanat.core.printable import printable

COMPARE_LISTING_FLAGS = ("--limit", "--name", "--rename")
"""What shapes or replaces a listing: none of them applies to a comparison."""


def compared_run_ids(texts: list[str]) -> list[int]:
    """The runs' numbers, each once; exit 2 for fewer than two or one that is not a run's number."""
    run_ids = []
    for text in texts:
        if not text.isdigit() or int(text) < 1:
            fail_usage(
                f"--compare: RUN_ID must be a run's number, as `gpuanat history` lists it (got {printable(text)})"
            )
        if int(text) not in run_ids:
            run_ids.append(int(text))
    if len(run_ids) < 2:
        fail_usage("--compare: give two runs or more (e.g. --compare 3 7)")
    return run_ids


def command_compare(args: argparse.Namespace) -> int:
    from gpuanat.core.store.compare import compare_runs, format_metric
    from gpuanat.core.store.report import Column, render_csv, render_markdown

    given = [flag for flag in COMPARE_LISTING_FLAGS if getattr(args, flag.removeprefix("--")) is not None]
    if given:
        fail_usage(f"--compare: {given[0]} does not apply to a comparison; give --compare with --format or --json")
    run_ids = compared_run_ids(args.compare)
    db_path = history_path(args)
    if not db_path.exists():
        fail_usage(f"--compare: history {db_path} has no runs yet")
    with open_store(args, read_only=True) as store:
        runs = [store.run(run_id) for run_id in run_ids]
    missing = [run_id for run_id, run in zip(run_ids, runs, strict=True) if run is None]
    if missing:
        fail_usage(f"--compare: there is no run {missing[0]} in history {db_path} (`gpuanat history` lists the runs)")
    found = [run for run in runs if run is not None]
    comparison = compare_runs(run_ids, [run.config for run in found], [run.result for run in found])
    output_format = "json" if args.json else args.format or "table"
    if output_format == "json":
        print(json.dumps(_comparison_json(comparison), indent=2))
        return EXIT_OK
    columns = [Column("metric", "metric")]
    for index, run_id in enumerate(run_ids):
        columns.append(Column(f"run_{run_id}", f"run {run_id}", numeric=True))
        if index:
            columns.append(Column(f"run_{run_id}_delta", "Δ", numeric=True))
    rows: list[dict[str, Any]] = [
        {"metric": field, **{f"run_{run_id}": _text(value) for run_id, value in zip(run_ids, values, strict=True)}}
        for field, values in comparison.differing
    ]
    for metric in comparison.metrics:
        row: dict[str, Any] = {"metric": metric.label.strip() if output_format == "csv" else metric.label}
        for run_id, value, delta in zip(run_ids, metric.values, metric.deltas_percent, strict=True):
            row[f"run_{run_id}"] = value if output_format == "csv" else format_metric(metric.key, value)
            row[f"run_{run_id}_delta"] = delta
        rows.append(row)
    if output_format == "md":
        sys.stdout.write(render_markdown(columns, rows))
    elif output_format == "csv":
        sys.stdout.write(render_csv(columns, rows))
    else:
        print(f"Runs {', '.join(str(run_id) for run_id in run_ids)} — Δ% against run {run_ids[0]}")
        print_table(columns, rows)
    return EXIT_OK


def _text(value: object) -> str:
    """A technique's value as the compare view shows it: on/off, — for none."""
    if isinstance(value, bool):
        return "on" if value else "off"
    return "—" if value is None else str(value)


def _comparison_json(comparison: Any) -> dict[str, Any]:
    return {
        "run_ids": list(comparison.run_ids),
        "differing": {field: list(values) for field, values in comparison.differing},
        "metrics": [
            {
                "key": row.key,
                "label": row.label.strip(),
                "values": list(row.values),
                "deltas_percent": list(row.deltas_percent),
            }
            for row in comparison.metrics
        ],
    }
