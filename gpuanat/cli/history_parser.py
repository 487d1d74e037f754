"""`gpuanat history`'s command line: listing, compare, and the forms that write (rename, tag, delete, prune)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def history_subparser(
    commands: Any,
    add_common: Callable[[argparse.ArgumentParser], None],
    run_name: Callable[[str], str],
    tag_text: Callable[[str], str],
) -> argparse.ArgumentParser:
    """The `history` subcommand of the parser's `commands`, with its flags; `add_common` adds the flags every command
    has, `run_name` and `tag_text` check a name and a tag as the other commands do."""
    history: argparse.ArgumentParser = commands.add_parser(
        "history",
        help="list recorded runs; compare, rename, tag or delete them",
        description="List recorded runs, oldest first (reading the history, never writing it); a tune's or fit's\n"
        "trials show as one line, its search (id sN: the best trial, how many trials), unless --trials.\n"
        "With --compare, show runs side by side. Or change it: --rename one run, --tag/--untag runs,\n"
        "--delete runs, or --prune them by age, count, tag or status (each shows what it will delete and\n"
        "asks first; --yes for scripts). An ID is a run's\n"
        "number, or sN for all of search N's trials.",
        epilog="Examples:\n  gpuanat history --format md\n  gpuanat history --name bf16 --limit 5\n"
        "  gpuanat history --tagged baseline --json\n  gpuanat history --trials\n"
        "  gpuanat history --compare 3 7\n"
        '  gpuanat history --rename 12 "bf16, batch 16"\n  gpuanat history --rename 12 ""   # no name\n'
        "  gpuanat history --tag 12 13 baseline\n  gpuanat history --untag 13 baseline\n"
        "  gpuanat history --delete 14 s3        # run 14, and search 3's trials\n"
        "  gpuanat history --delete 14 --yes  # without asking (scripts)\n"
        "  gpuanat history --prune --older-than 30d --keep 1000   # shows what goes, then asks",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common(history)
    history.add_argument(
        "--format", choices=("table", "md", "csv", "json"), default=None, help="table (default), md, csv or json"
    )
    history.add_argument("--json", action="store_true", help="same as --format json")
    history.add_argument("--limit", type=int, default=None, metavar="N", help="only the last N runs")
    history.add_argument(
        "--name",
        type=run_name,
        default=None,
        metavar="TEXT",
        help="only the runs whose name contains TEXT (in any case)",
    )
    history.add_argument(
        "--tagged", type=tag_text, default=None, metavar="NAME", help="only the runs tagged NAME (exactly)"
    )
    history.add_argument(
        "--trials",
        action="store_true",
        help="list every trial of a tune or fit, each with its search, instead of one line per search",
    )
    history.add_argument(
        "--rename",
        nargs=2,
        default=None,
        metavar=("RUN_ID", "NAME"),
        help="name run RUN_ID NAME instead of listing (an empty or blank NAME removes its name); the "
        "name is kept as given and shown with any control characters escaped",
    )
    history.add_argument(
        "--tag",
        nargs="+",
        default=None,
        metavar="ID",
        help="--tag ID [ID ...] NAME: tag these runs NAME (the last word is the tag); sN tags search N's trials",
    )
    history.add_argument(
        "--untag", nargs="+", default=None, metavar="ID", help="--untag ID [ID ...] NAME: take the tag NAME away"
    )
    history.add_argument(
        "--delete",
        nargs="+",
        default=None,
        metavar="ID",
        help="delete these runs (sN: search N and its trials) with their steps, samples, tags and the logs gpuanat "
        "wrote for them; shows them and asks (y/N) first",
    )
    history.add_argument("--yes", action="store_true", help="with --delete or --prune: delete without asking (scripts)")
    history.add_argument(
        "--prune",
        action="store_true",
        help="delete the runs that meet every criterion given (--older-than, --keep, --tagged, --status) with their "
        "steps, samples, tags and logs; shows how many and a few of them, and asks (y/N) first",
    )
    history.add_argument(
        "--older-than", default=None, metavar="AGE", help="with --prune: runs started more than AGE ago (30d, 12h, 2w)"
    )
    history.add_argument(
        "--keep", type=int, default=None, metavar="N", help="with --prune: keep the newest N runs (of those picked)"
    )
    history.add_argument(
        "--status", default=None, metavar="STATUS", help="with --prune: runs of this status (failed, oom, interrupted…)"
    )
    history.add_argument(
        "--compare",
        nargs="+",
        default=None,
        metavar="RUN_ID",
        help="compare these runs instead of listing: the techniques that differ and every metric (the final and "
        "lowest loss among them) with its Δ%% against the first run",
    )
    return history
