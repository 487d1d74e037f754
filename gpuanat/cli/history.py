"""`gpuanat history`: the recorded runs as a table, markdown, CSV or JSON (reads, never writes), a tune's or fit's
trials folded into one line per search unless `--trials`; `--rename` gives one run a new name; `--tag`/`--untag` tag
runs and `--delete` deletes them after showing them and asking (`history_edit`). Each write is retried while the
history is busy."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from gpuanat.cli.common import EXIT_OK, fail_usage, history_path, open_store, print_table
from gpuanat.cli.history_edit import command_delete, command_tag, refuse_listing_flags
from gpuanat.cli.history_prune import command_prune, refuse_prune_options
from gpuanat.cli.output import unguarded
from gpuanat.cli.parser import run_name
from gpuanat.core.printable import printable
from gpuanat.core.store.history import HistoryStore, RunRow
from gpuanat.core.store.history_listing import listed_runs, search_totals, stored_results
from gpuanat.core.store.searches import SearchLine, fold_searches


def command_history(args: argparse.Namespace) -> int:
    if args.prune:
        return command_prune(args)
    refuse_prune_options(args)
    if args.compare is not None:
        from gpuanat.cli.history_compare import command_compare

        return command_compare(args)
    if args.rename is not None:
        return command_rename(args)
    if args.tag is not None or args.untag is not None:
        return command_tag(args)
    if args.delete is not None:
        return command_delete(args)
    if args.yes:
        fail_usage("--yes answers --delete's question (and --prune's); give it with --delete or --prune")
    from gpuanat.core.store.report import (
        HISTORY_COLUMNS,
        TAGS_COLUMN,
        listing_rows,
        render_csv,
        render_markdown,
    )

    output_format = "json" if args.json else args.format or "table"
    if args.limit is not None and args.limit < 1:
        fail_usage(f"--limit: must be an integer ≥ 1 (got {args.limit})")
    with open_store(args, read_only=True) as store:
        # a search's line needs all its trials: the limit then applies to the lines, below
        runs = listed_runs(store, args.limit if args.trials else None, name_contains=args.name, tagged=args.tagged)
        lines: list[RunRow | SearchLine] = list(runs) if args.trials else fold_searches(runs, search_totals(store))
        if args.limit is not None:
            lines = lines[-args.limit :]
        if output_format == "json":
            _write_json(store, lines)
            return EXIT_OK
    rows = listing_rows(lines)
    # md and CSV escape each cell themselves (`report.display_value`, `printable`): written as they are, not escaped
    # a second time character by character (a quarter of a second for ten thousand runs)
    if output_format == "md":
        unguarded(sys.stdout).write(render_markdown((*HISTORY_COLUMNS, TAGS_COLUMN), rows))
    elif output_format == "csv":
        unguarded(sys.stdout).write(render_csv((*HISTORY_COLUMNS, TAGS_COLUMN), rows))
    elif not runs and (args.name is not None or args.tagged is not None):
        named = f"name contains “{printable(args.name)}”" if args.name is not None else None
        if args.tagged is None:
            print(f"No run's {named} (history: {history_path(args)}).")
        else:
            whose = f" whose {named}" if named else ""
            print(f"No run tagged “{printable(args.tagged)}”{whose} (history: {history_path(args)}).")
    elif not runs:
        print(f"No runs recorded yet. Start one with `gpuanat run` (history: {history_path(args)}).")
    else:
        tagged = any(row["tags"] for row in rows)
        print_table((*HISTORY_COLUMNS, TAGS_COLUMN) if tagged else HISTORY_COLUMNS, rows)
        folded = [line.key for line in lines if isinstance(line, SearchLine)]
        if folded:
            print(
                f"{', '.join(folded)}: {'a search' if len(folded) == 1 else 'searches'} (tune, fit) shown as "
                f"{'its' if len(folded) == 1 else 'their'} best trial; --trials lists every trial, "
                f"--delete {folded[-1]} deletes all of them"
            )
    return EXIT_OK


def _write_json(store: HistoryStore, lines: list[RunRow | SearchLine]) -> None:
    """The lines as a JSON array, each with its run's whole result: indented when it has up to PLAIN_FROM_ROWS
    entries; a longer one an entry a line, each stored result written as stored where it reads as gpuanat writes
    results now (`history_listing.stored_results`), so that ten thousand runs are printed in a blink."""
    from gpuanat.cli.plain_table import PLAIN_FROM_ROWS

    def whole(run: RunRow) -> dict[str, Any]:
        found = store.run(run.id)
        return (found or run).result.to_json()

    out = unguarded(sys.stdout)  # JSON escapes what is not printable itself
    if len(lines) <= PLAIN_FROM_ROWS:
        out.write(json.dumps([_json_entry(line, whole(_best(line))) for line in lines], indent=2) + "\n")
        return
    stored = stored_results(store)
    configs: dict[int, str] = {}
    """Each config's JSON by its dict: runs of one config share it (`listed_runs`), written once."""
    out.write("[\n")
    for index, line in enumerate(lines):
        best = _best(line)
        raw = stored.get(best.id)
        if raw is None:
            text = json.dumps(_json_entry(line, whole(best)))
        else:  # the entry's keys with its config and its result last, the result as stored
            config = configs.get(id(best.config))
            if config is None:
                config = configs[id(best.config)] = json.dumps(best.config)
            entry = _json_entry(line, None)
            del entry["config"], entry["result"]
            text = f'{json.dumps(entry)[:-1]}, "config": {config}, "result": {raw}}}'
        out.write(text + (",\n" if index < len(lines) - 1 else "\n"))
    out.write("]\n")


def _best(line: RunRow | SearchLine) -> RunRow:
    return line.best if isinstance(line, SearchLine) else line


def _run_json(run: RunRow, result: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "id": run.id,
        "kind": run.kind,
        "name": run.name,
        "status": run.status,
        "created_at": run.created_at,
        "finished_at": run.finished_at,
        "tags": list(run.tags),
        "search": None
        if run.search is None
        else {"id": run.search.id, "kind": run.search.kind, "name": run.search.name},
        "config": run.config,
        "result": result,
    }


def _json_entry(line: RunRow | SearchLine, result: dict[str, Any] | None) -> dict[str, Any]:
    """A run's object with its `result`; a folded search's is its best trial's, whose `search` also counts and lists
    the trials."""
    if isinstance(line, RunRow):
        return _run_json(line, result)
    entry = _run_json(line.best, result)
    entry["search"] = {
        **entry["search"],
        "trials": line.total_trials,
        "trial_ids": [trial.id for trial in line.trials],
    }
    return entry


def command_rename(args: argparse.Namespace) -> int:
    """`--rename RUN_ID NAME`: one line saying what the run is called now; exit 2 for a run that is not there."""
    from gpuanat.core.store.history import RENAME_DEADLINE_S
    from gpuanat.core.store.history_errors import write_with_backoff

    refuse_listing_flags(args, "--rename")
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
