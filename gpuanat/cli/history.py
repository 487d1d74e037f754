"""`gpuanat history`: the recorded runs as a table, markdown, CSV or JSON (reads, never writes)."""

from __future__ import annotations

import argparse
import json
import sys

from gpuanat.cli.common import EXIT_OK, fail_usage, open_store, print_table
from gpuanat.core.store.history_file import default_db_path


def command_history(args: argparse.Namespace) -> int:
    from gpuanat.core.store.report import HISTORY_COLUMNS, history_rows, render_csv, render_markdown

    output_format = "json" if args.json else args.format
    if args.limit is not None and args.limit < 1:
        fail_usage(f"--limit: must be an integer ≥ 1 (got {args.limit})")
    with open_store(args, read_only=True) as store:
        runs = store.runs(limit=args.limit)
    if output_format == "json":
        print(json.dumps([{"id": run.id, "kind": run.kind, "name": run.name, "status": run.status,
                           "created_at": run.created_at, "finished_at": run.finished_at, "config": run.config,
                           "result": run.result} for run in runs], indent=2))
        return EXIT_OK
    rows = history_rows(runs)
    if output_format == "md":
        sys.stdout.write(render_markdown(HISTORY_COLUMNS, rows))
    elif output_format == "csv":
        sys.stdout.write(render_csv(HISTORY_COLUMNS, rows))
    elif not runs:
        print("No runs recorded yet. Start one with `gpuanat run` (history: "
              f"{args.db or default_db_path()}).")
    else:
        print_table(HISTORY_COLUMNS, rows)
    return EXIT_OK
