"""`gpuanat history --tag/--untag ID… NAME` and `--delete ID…`: the history's writes beside `--rename`.

An ID is a run's number as `gpuanat history` lists it, or `sN`, search N (a tune or fit): all of its trials. Anything
else, or a run or search that is not there, is refused in one line with exit 2 before anything is written. A delete
shows what it will delete and asks on a terminal; elsewhere it wants `--yes`. Each write is one transaction, retried
while another process holds the history (`write_with_backoff`): a delete interrupted by a signal deletes nothing.
"""

from __future__ import annotations

import argparse
import sys
from datetime import datetime

from gpuanat.cli.common import EXIT_OK, fail_usage, history_path, open_store
from gpuanat.cli.parser import tag_text
from gpuanat.core.printable import printable
from gpuanat.core.store.history import RENAME_DEADLINE_S, HistoryStore, RunRow
from gpuanat.core.store.history_errors import write_with_backoff
from gpuanat.core.store.searches import search_key

LISTING_FLAGS = ("--format", "--json", "--limit", "--name", "--tagged", "--trials")
"""What shapes a listing: none of them applies to a rename, a tag or a delete."""
EDITS = ("--rename", "--tag", "--untag", "--delete")


def refuse_listing_flags(args: argparse.Namespace, flag: str) -> None:
    """Exit 2 when `flag` (one of EDITS) comes with a listing's flag, another edit, or --yes where it means nothing."""
    given = {
        "--format": args.format is not None,
        "--json": args.json,
        "--limit": args.limit is not None,
        "--name": args.name is not None,
        "--tagged": args.tagged is not None,
        "--trials": args.trials,
    }
    what = {"--rename": "a rename", "--tag": "a tag", "--untag": "a tag", "--delete": "a delete"}[flag]
    listing = [name for name in LISTING_FLAGS if given[name]]
    if listing:
        fail_usage(f"{flag}: {listing[0]} shapes a listing and does not apply to {what}; give {flag} alone")
    edits = {"--rename": args.rename, "--tag": args.tag, "--untag": args.untag, "--delete": args.delete}
    others = [name for name in EDITS if name != flag and edits[name] is not None]
    if others:
        fail_usage(f"{flag}: give {others[0]} in a command of its own")
    if args.yes and flag != "--delete":
        fail_usage(f"--yes answers --delete's question; {flag} asks none")


def _resolve(store: HistoryStore, words: list[str], flag: str) -> list[RunRow]:
    """The runs `words` name (run numbers and sN), in the history's order; exit 2 for anything else."""
    run_ids: list[int] = []
    for word in words:
        search = word[1:] if word[:1] in ("s", "S") else None
        digits = search if search is not None else word
        if not digits.isascii() or not digits.isdigit() or int(digits) < 1:
            fail_usage(
                f"{flag}: {printable(word)!s} is not a run's number or a search (sN), as `gpuanat history` lists them"
            )
        if search is None:
            run_ids.append(int(digits))
            continue
        trials = store.search_trials(int(digits))
        if not trials:
            fail_usage(f"{flag}: there is no search {search_key(int(digits))} in history {store.path}")
        run_ids.extend(trials)
    runs = []
    for run_id in dict.fromkeys(run_ids):
        run = store.run(run_id)
        if run is None:
            fail_usage(f"{flag}: there is no run {run_id} in history {store.path} (`gpuanat history` lists the runs)")
        runs.append(run)
    return sorted(runs, key=lambda run: run.id)


def existing_history(args: argparse.Namespace, flag: str) -> None:
    db_path = history_path(args)
    if not db_path.exists():  # an edit creates no history: there is nothing in it
        fail_usage(f"{flag}: history {db_path} has no runs yet")


def command_tag(args: argparse.Namespace) -> int:
    """`--tag ID… NAME` / `--untag ID… NAME`: one line saying which runs carry the tag now, or no longer."""
    flag, words = ("--tag", args.tag) if args.tag is not None else ("--untag", args.untag)
    refuse_listing_flags(args, flag)
    if len(words) < 2:
        fail_usage(f"{flag}: give the runs and then the tag: {flag} ID [ID ...] NAME (e.g. {flag} 12 13 baseline)")
    try:
        tag = tag_text(words[-1])
    except argparse.ArgumentTypeError as error:
        fail_usage(f"{flag}: {error}")
    existing_history(args, flag)
    with open_store(args) as store:
        runs = _resolve(store, words[:-1], flag)
        tagging = flag == "--tag"
        changed = write_with_backoff(
            lambda: store.tag_runs([run.id for run in runs], tag, tagged=tagging), deadline_s=RENAME_DEADLINE_S
        )
    listed = ", ".join(str(run.id) for run in runs)
    noun = "Run" if len(runs) == 1 else "Runs"
    if tagging:
        print(f"{noun} {listed} tagged “{printable(tag)}” ({changed} newly).")
    else:
        print(f"{noun} {listed} not tagged “{printable(tag)}” now ({changed} had it).")
    return EXIT_OK


def describe(run: RunRow) -> str:
    """One line naming a run to be deleted: id, date, name, status, search; made printable."""
    when = datetime.fromtimestamp(run.created_at).strftime("%Y-%m-%d %H:%M")
    name = f"“{run.name}”" if run.name is not None else "(no name)"
    search = f" · trial of {search_key(run.search.id)} ({run.search.kind})" if run.search is not None else ""
    return printable(f"run {run.id} · {when} · {name} · {run.status}{search}")


def command_delete(args: argparse.Namespace) -> int:
    """`--delete ID…`: show the runs, ask (or `--yes`), delete them in one transaction; one line per log removed."""
    refuse_listing_flags(args, "--delete")
    existing_history(args, "--delete")
    with open_store(args) as store:
        runs = _resolve(store, args.delete, "--delete")
        return confirm_and_delete(args, store, runs, "--delete")


def confirm_and_delete(
    args: argparse.Namespace, store: HistoryStore, runs: list[RunRow], flag: str, *, listed: int | None = None
) -> int:
    """Show `runs` (the first `listed` of them one a line, the rest counted; all when None), ask on a terminal
    unless `--yes`, and delete them in one transaction; one line per log removed. Exit 2 where one is being
    recorded, or where it cannot ask and `--yes` is not given."""
    busy = store.in_progress([run.id for run in runs])
    if busy:
        fail_usage(
            f"{flag}: run {', '.join(map(str, busy))} {'is' if len(busy) == 1 else 'are'} still being recorded "
            "by another process; stop it (or let it end), then delete it"
        )
    count = f"{len(runs)} run" if len(runs) == 1 else f"{len(runs)} runs"
    if not args.yes and not sys.stdin.isatty():
        ids = ", ".join(str(run.id) for run in runs[: listed or len(runs)]) + (
            ", …" if listed is not None and len(runs) > listed else ""
        )
        fail_usage(
            f"{flag}: it asks before it deletes, and stdin is not a terminal; add --yes to delete {count} ({ids}) "
            "without asking"
        )
    print(f"Deleting {count} with their steps, samples, tags and logs:")
    shown = runs if listed is None or len(runs) <= listed else runs[: listed - 1]
    for run in shown:
        print(f"  {describe(run)}")
    if len(shown) < len(runs):
        print(f"  … and {len(runs) - len(shown)} more (run {runs[len(shown)].id} to run {runs[-1].id})")
    if not args.yes:
        print(f"Delete {'it' if len(runs) == 1 else 'them'}? [y/N] ", end="", flush=True)
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            print("Nothing deleted.")
            return EXIT_OK
    deleted = write_with_backoff(lambda: store.delete_runs([run.id for run in runs]), deadline_s=RENAME_DEADLINE_S)
    print(f"Deleted {len(deleted.run_ids)} run{'' if len(deleted.run_ids) == 1 else 's'}.")
    for log in deleted.log_paths:
        print(f"  removed its log {printable(log)}")
    return EXIT_OK
