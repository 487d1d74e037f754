"""A `tune` or `fit` records 5 to 20 trial runs: the history shows each search as one line — its best trial, and how
many trials it ran — so that the runs a person made stay in view. `history --trials` and the dashboard's expanded
search show every trial.

The best trial: of a fit, the largest batch that trained; of a tune, the trial that trained fastest (steady
samples/s, else samples/s, the rate its search moves by by default); a search none of whose trials trained, its
last trial.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpuanat.core.store.history import HistoryStore, RunRow, SearchRef
from gpuanat.core.store.history_errors import write_with_backoff
from gpuanat.core.store.recording import FINAL_WRITE_DEADLINE_S
from gpuanat.core.vocabulary.config import RunConfig

TRAINED = "ok"
"""The status of a trial that trained."""


@dataclass(frozen=True)
class SearchLine:
    """One search as the history lists it: its trials shown (oldest first) and the best of them."""

    search: SearchRef
    trials: tuple[RunRow, ...]
    best: RunRow
    total_trials: int
    """How many trials the search has in the history (more than `trials` when a filter left some out)."""

    @property
    def key(self) -> str:
        """How a command names it: "s" and its id (`history --delete s3`)."""
        return search_key(self.search.id)

    def words(self) -> str:
        """`tune tiny · 7 trials, best: run 41`; made printable by whoever shows it."""
        shown = len(self.trials)
        count = f"{shown} of {self.total_trials} trials" if shown < self.total_trials else _trials(shown)
        return f"{self.search.name or self.search.kind} · {count}, best: run {self.best.id}"


def start_search(store: HistoryStore, kind: str, base: RunConfig) -> int:
    """A new search of `kind` ("tune", "fit") from `base`, named after its workload ("tune tiny"), retried while the
    history is busy; its id, for each trial's `execute_run(search_id=…)`."""
    name = f"{kind} {base.model or base.preset}"
    return write_with_backoff(lambda: store.create_search(kind, name), deadline_s=FINAL_WRITE_DEADLINE_S)


def search_key(search_id: int) -> str:
    return f"s{search_id}"


def _trials(count: int) -> str:
    return f"{count} trial" if count == 1 else f"{count} trials"


def best_trial(kind: str, trials: Sequence[RunRow]) -> RunRow:
    """The best of a search's `trials` (see the module docstring)."""
    trained = [trial for trial in trials if trial.status == TRAINED]
    if not trained:
        return trials[-1]
    if kind == "fit":
        return max(trained, key=lambda trial: (int(trial.config.get("batch_size") or 0), trial.id))

    def rate(trial: RunRow) -> float:
        result = trial.result
        return result.steady_samples_per_second or result.samples_per_second or 0.0

    return max(trained, key=lambda trial: (rate(trial), -trial.id))


def fold_searches(runs: Sequence[RunRow], totals: dict[int, int] | None = None) -> list[RunRow | SearchLine]:
    """`runs` (oldest first) with each search's trials folded into one `SearchLine`, where its first trial stood.
    `totals`: each search's trial count in the whole history (default: those among `runs`)."""
    trials: dict[int, list[RunRow]] = {}
    for run in runs:
        if run.search is not None:
            trials.setdefault(run.search.id, []).append(run)
    lines: list[RunRow | SearchLine] = []
    for run in runs:
        if run.search is None:
            lines.append(run)
        elif trials[run.search.id][0] is run:
            found = tuple(trials[run.search.id])
            lines.append(
                SearchLine(
                    run.search,
                    found,
                    best_trial(run.search.kind, found),
                    max(len(found), (totals or {}).get(run.search.id, 0)),
                )
            )
    return lines
