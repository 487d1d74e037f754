"""The largest batch that trains: the search itself, and the search with real trial runs."""

from __future__ import annotations

import pytest
from conftest import cli_env

from gpuanat.core.run.fit import find_largest_batch, run_fit
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.searches import best_trial, start_search
from gpuanat.core.vocabulary.config import RunConfig


@pytest.mark.parametrize(
    ("largest_that_fits", "start"), [(120, 85), (120, 200), (5, 1), (1, 4), (0, 4), (64, 64), (800, 100), (120, 118)]
)
def test_search_finds_the_boundary(largest_that_fits, start):
    largest, trials = find_largest_batch(lambda batch: batch <= largest_that_fits, start, limit=4096)
    assert largest == largest_that_fits
    tried = {trial.batch_size: trial.trained for trial in trials}
    if largest:
        assert tried[largest] is True
    assert tried.get(largest + 1, False) is False
    assert len(trials) <= 2 + 2 * max(1, largest_that_fits).bit_length()


def test_a_good_prediction_costs_five_trials():
    largest, trials = find_largest_batch(lambda batch: batch <= 120, 118, limit=4096)
    assert largest == 120 and [(trial.batch_size, trial.trained) for trial in trials] == [
        (118, True),
        (126, False),
        (122, False),
        (120, True),
        (121, False),
    ]


def test_search_stops_at_the_limit():
    largest, trials = find_largest_batch(lambda batch: True, 3, limit=20)
    assert largest == 20 and [trial.batch_size for trial in trials] == [3, 11, 20]


def test_fit_confirms_with_real_runs(db_path):
    # `gpuanat fit` refuses the CPU (tests/test_cli_bad_input.py), and CI has no GPU: the search runs here with
    # real CPU trials in which the child raises torch.OutOfMemoryError for batches above 6 (the test hook in
    # tests/fault_injection); the trial runs, the search and the history are the real ones.
    base = RunConfig(preset="tiny", device="cpu", seq_len=16, batch_size=2)
    with HistoryStore(db_path) as store:
        fit = run_fit(
            base,
            store=store,
            log_dir=db_path.parent / "logs",
            start=2,
            trial_steps=2,
            max_batch=64,
            env=cli_env(db_path, fault="oom-above@6"),
            search_id=start_search(store, "fit", base),
        )
        runs = store.runs()
    assert fit.failure is None
    assert fit.largest_batch_size == 6
    assert [(trial.batch_size, trial.trained) for trial in fit.trials] == [
        (2, True),
        (10, False),
        (6, True),
        (8, False),
        (7, False),
    ]
    assert [(run.name, run.status) for run in runs] == [
        ("fit batch 2", "ok"),
        ("fit batch 10", "oom"),
        ("fit batch 6", "ok"),
        ("fit batch 8", "oom"),
        ("fit batch 7", "oom"),
    ]
    assert all(run.result.steps == 2 for run in runs if run.status == "ok")
    # every trial recorded under its search, whose best is the largest batch that trained
    assert {(run.search.kind, run.search.name) for run in runs if run.search is not None} == {("fit", "fit tiny")}
    assert all(run.search == runs[0].search for run in runs)
    assert best_trial("fit", runs).name == "fit batch 6"
