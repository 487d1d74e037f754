"""`gpuanat history --prune`: delete many runs at once by what they are — older than a time (`--older-than 30d`),
beyond the newest N (`--keep 1000`), tagged (`--tagged X`), of a status (`--status failed`) — after showing what
goes (how many, a few of them) and asking, as `--delete` does (`history_edit.confirm_and_delete`: one transaction,
gpuanat's own logs removed too). The criteria combine: a run goes when it meets every one given; `--keep N` keeps
the newest N of the runs the tag and status pick. A run being recorded is never pruned. A bad value is refused in
one line with exit 2 before anything is read."""

from __future__ import annotations

import argparse
import re
import time

from gpuanat.cli.common import EXIT_OK, fail_usage, open_store
from gpuanat.cli.history_edit import EDITS, LISTING_FLAGS, confirm_and_delete, existing_history
from gpuanat.core.printable import printable
from gpuanat.core.store.history import ACTIVE_STATUSES
from gpuanat.core.store.history_listing import listed_runs

PRUNE_LISTED = 8
"""The most runs a prune's question lists one a line; more are counted."""
PRUNED_STATUSES = ("ok", "oom", "failed", "stopped", "interrupted", "exited", "detached")
"""The final statuses a run can have (`RunResult.status`); a running one is never pruned."""
DURATION_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


def duration_s(text: str) -> float:
    """`30d`, `12h`, `2w`, `90m`, `45s` in seconds; ValueError for anything else."""
    match = _DURATION.fullmatch(text.strip())
    if match is None or float(match.group(1)) <= 0:
        raise ValueError(text)
    return float(match.group(1)) * DURATION_UNITS_S[match.group(2)]


def _refuse_other_flags(args: argparse.Namespace) -> None:
    given = {"--format": args.format is not None, "--json": args.json, "--limit": args.limit is not None}
    given |= {"--name": args.name is not None, "--trials": args.trials}
    listing = [flag for flag in LISTING_FLAGS if given.get(flag)]
    if listing:
        fail_usage(f"--prune: {listing[0]} shapes a listing and does not apply to a prune; give --prune alone")
    edits = {"--rename": args.rename, "--tag": args.tag, "--untag": args.untag, "--delete": args.delete}
    others = [flag for flag in EDITS if edits[flag] is not None]
    if others:
        fail_usage(f"--prune: give {others[0]} in a command of its own")


def refuse_prune_options(args: argparse.Namespace) -> None:
    """Exit 2 where --older-than, --keep or --status comes without --prune."""
    for flag, value in (("--older-than", args.older_than), ("--keep", args.keep), ("--status", args.status)):
        if value is not None:
            fail_usage(f"{flag} chooses what --prune deletes; give it with --prune")


def command_prune(args: argparse.Namespace) -> int:
    """`--prune` with its criteria: show the runs that go, ask (or `--yes`), delete them in one transaction."""
    _refuse_other_flags(args)
    if args.older_than is None and args.keep is None and args.tagged is None and args.status is None:
        fail_usage(
            "--prune: say what to prune: --older-than AGE (e.g. 30d), --keep N (the newest N), --tagged NAME, "
            "--status STATUS (several narrow it)"
        )
    older_than_s = None
    if args.older_than is not None:
        try:
            older_than_s = duration_s(args.older_than)
        except ValueError:
            fail_usage(
                f"--older-than: give an age as a number and a unit s, m, h, d or w, e.g. 30d or 12h "
                f"(got {printable(args.older_than)})"
            )
    if args.keep is not None and args.keep < 0:
        fail_usage(f"--keep: must be an integer ≥ 0, the newest runs kept (got {args.keep})")
    if args.status is not None and args.status not in PRUNED_STATUSES:
        fail_usage(f"--status: one of {', '.join(PRUNED_STATUSES)} (got {printable(args.status)})")
    existing_history(args, "--prune")
    with open_store(args) as store:
        runs = [
            run
            for run in listed_runs(store, tagged=args.tagged)
            if (args.status is None or run.status == args.status) and run.status not in ACTIVE_STATUSES
        ]
        if args.keep is not None:
            runs = runs[: max(len(runs) - args.keep, 0)]
        if older_than_s is not None:
            cutoff = time.time() - older_than_s
            runs = [run for run in runs if run.created_at < cutoff]
        if not runs:
            print("Nothing to prune: no run meets all of the criteria given.")
            return EXIT_OK
        return confirm_and_delete(args, store, runs, "--prune", listed=PRUNE_LISTED)
