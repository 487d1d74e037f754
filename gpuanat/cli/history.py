"""`gpuanat history`: the recorded runs as a table, markdown, CSV or JSON (reads, never writes); `--rename` gives one
run a new name (the one write, retried while the history is busy)."""

from __future__ import annotations

import argparse
import json
import sys

from gpuanat.cli.common import EXIT_OK, fail_usage, history_path, open_store, print_table
from gpuanat.cli.parser import run_name
from gpuanat.core.printable import printable

LISTING_FLAGS = ("--format", "--json", "--limit", "--name")
"""What shapes a listing: none of them applies to a rename."""


def command_history(args: argparse.Namespace) -> int:
    if args.compare is not None:
        from gpuanat.cli.history_compare import command_compare

        return command_compare(args)
    if args.rename is not None:
        return command_rename(args)
    from gpuanat.core.store.report import HISTORY_COLUMNS, history_rows, render_csv, render_markdown

    output_format = "json" if args.json else args.format or "table"
    if args.limit is not None and args.limit < 1:
        fail_usage(f"--limit: must be an integer ≥ 1 (got {args.limit})")
    with open_store(args, read_only=True) as store:
        runs = store.runs(limit=args.limit, name_contains=args.name)
    if output_format == "json":
        print(
            json.dumps(
                [
                    {
                        "id": run.id,
                        "kind": run.kind,
                        "name": run.name,
                        "status": run.status,
                        "created_at": run.created_at,
                        "finished_at": run.finished_at,
                        "config": run.config,
                        "result": run.result.to_json(),
                    }
                    for run in runs
                ],
                indent=2,
            )
        )
        return EXIT_OK
    rows = history_rows(runs)
    if output_format == "md":
        sys.stdout.write(render_markdown(HISTORY_COLUMNS, rows))
    elif output_format == "csv":
        sys.stdout.write(render_csv(HISTORY_COLUMNS, rows))
    elif not runs and args.name is not None:
        print(f"No run's name contains “{printable(args.name)}” (history: {history_path(args)}).")
    elif not runs:
        print(f"No runs recorded yet. Start one with `gpuanat run` (history: {history_path(args)}).")
    else:
        print_table(HISTORY_COLUMNS, rows)
    return EXIT_OK


def command_rename(args: argparse.Namespace) -> int:
    """`--rename RUN_ID NAME`: one line saying what the run is called now; exit 2 for a run that is not there."""
    from gpuanat.core.store.history import RENAME_DEADLINE_S
    from gpuanat.core.store.history_errors import write_with_backoff

    given = {
        "--format": args.format is not None,
        "--json": args.json,
        "--limit": args.limit is not None,
        "--name": args.name is not None,
    }
    listing = [flag for flag in LISTING_FLAGS if given[flag]]
    if listing:
        fail_usage(f"--rename: {listing[0]} shapes a listing and does not apply to a rename; give --rename alone")
    run_id_text, name_text = args.rename
    try:
        run_id = int(run_id_text)
    except ValueError:
        fail_usage(
            f"--rename: RUN_ID must be a run's number, as `gpuanat history` lists it (got {printable(run_id_text)})"
        )
    if run_id < 1:
        fail_usage(f"--rename: RUN_ID must be a run's number ≥ 1 (got {run_id})")
    try:
        name = run_name(name_text) if name_text.strip() else None
    except argparse.ArgumentTypeError as error:
        fail_usage(f"--rename: {error}")
    db_path = history_path(args)
    if not db_path.exists():  # a rename creates no history: there is no run to rename
        fail_usage(f"--rename: there is no run {run_id}: history {db_path} has no runs yet")
    with open_store(args) as store:
        renamed = write_with_backoff(lambda: store.set_name(run_id, name), deadline_s=RENAME_DEADLINE_S)
    if not renamed:
        fail_usage(f"--rename: there is no run {run_id} in history {db_path} (`gpuanat history` lists the runs)")
    print(f"Run {run_id} is named “{printable(name)}” now." if name is not None else f"Run {run_id} has no name now.")
    return EXIT_OK
