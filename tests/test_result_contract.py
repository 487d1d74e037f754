"""The typed result keeps the JSON contract byte for byte.

Every result committed from real GPU runs (benchmarks/results, tests/data: `gpuanat run --json` outputs, results
inside sweep, tune and check files, the H100 history's stored results) reads into a `RunResult` and writes back to
the same bytes, key order included — results of older gpuanat versions with their missing and retired keys among
them. Fresh results of real CPU runs are compared with what gpuanat printed before the result was typed in the
tests that run them (`result_golden.assert_as_recorded`: test_run_cpu, test_failures, test_distributed_cpu); here,
a result rebuilt from steps and predictions, against what the code wrote then (tests/data/result_golden.json).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from result_golden import GOLDEN_PATH

from gpuanat.core.measure.loss_curve import LOSS_FIELDS, NO_LOSS_REASON
from gpuanat.core.memory.predict import prediction
from gpuanat.core.store.interrupted import interrupted_result, result_from_steps
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import Bands, RankResult, RunError, RunResult

REPO = Path(__file__).resolve().parent.parent
COMMITTED = [REPO / "benchmarks" / "results", REPO / "tests" / "data"]
HISTORY = REPO / "tests" / "data" / "h100_history_tf32.sqlite"


def _documents(path: Path) -> Iterator[Any]:
    text = path.read_text()
    if path.suffix == ".jsonl":
        for line in text.splitlines():
            if line.strip():
                yield json.loads(line)
    else:
        yield json.loads(text)


def _results_in(value: Any, where: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """The results inside a JSON document, found by their shape: an object with a run id, a status, a config and
    bands (as every `gpuanat run --json` and stored result since the first has)."""
    if isinstance(value, dict):
        if {"run_id", "status", "config", "bands"} <= value.keys():
            yield where, value
        for key, item in value.items():
            yield from _results_in(item, f"{where}/{key}")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _results_in(item, f"{where}[{index}]")


def committed_results() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for root in COMMITTED:
        for path in sorted(root.rglob("*")):
            if path.suffix in (".json", ".jsonl"):
                for document in _documents(path):
                    found.extend(_results_in(document, str(path.relative_to(REPO))))
    return found


def stored_results() -> list[tuple[str, dict[str, Any]]]:
    with sqlite3.connect(f"file:{HISTORY}?mode=ro", uri=True) as db:
        rows = db.execute("SELECT id, result_json FROM runs WHERE result_json IS NOT NULL").fetchall()
    return [(f"{HISTORY.name} run {run_id}", json.loads(text)) for run_id, text in rows]


COMMITTED_RESULTS = committed_results()
STORED_RESULTS = stored_results()


def test_the_committed_results_are_found():
    # every `gpuanat run --json` output and result kept in other files since the first H100 runs, and the history's
    assert len(COMMITTED_RESULTS) >= 237
    assert len({where.split("/")[0] for where, _ in COMMITTED_RESULTS}) >= 1
    assert len(STORED_RESULTS) >= 1


def test_every_committed_and_stored_result_reads_and_writes_back_byte_for_byte():
    different = [
        where
        for where, result in [*COMMITTED_RESULTS, *STORED_RESULTS]
        if json.dumps(RunResult.from_json(result).to_json()) != json.dumps(result)
    ]
    assert not different, f"{len(different)} results differ, e.g. {different[:3]}"


def test_the_committed_results_read_as_typed_values():
    for where, raw in [*COMMITTED_RESULTS, *STORED_RESULTS]:
        result = RunResult.from_json(raw)
        assert result.status == raw["status"], where
        assert result.bands is None or isinstance(result.bands, Bands | dict), where
        if isinstance(raw.get("error"), dict):
            assert isinstance(result.error, RunError) and result.error.kind == raw["error"]["kind"], where
        for rank, raw_rank in zip(result.ranks, raw.get("ranks") or [], strict=True):
            assert isinstance(rank, RankResult) and rank.rank == raw_rank["rank"], where
        if isinstance(raw.get("bands"), dict) and "weights_bytes" in raw["bands"]:
            assert isinstance(result.bands, Bands) and result.bands.weights_bytes == raw["bands"]["weights_bytes"]


def test_a_missing_key_reads_as_none_and_is_not_written_back():
    older = {"run_id": 3, "status": "ok", "config": {}, "bands": {"weights_bytes": 8}}
    result = RunResult.from_json(older)
    assert result.mfu is None and result.ranks == [] and result.error is None and result.predicted is None
    assert result.bands is not None and result.bands.gradients_bytes is None
    assert json.dumps(result.to_json()) == json.dumps(older)


def test_an_unknown_key_is_kept_in_its_place():
    written_elsewhere = {"run_id": 3, "retired_bytes": 1, "status": "ok", "bands": {"x_bytes": 2, "weights_bytes": 8}}
    result = RunResult.from_json(written_elsewhere)
    assert result.extra == {"retired_bytes": 1}
    assert json.dumps(result.to_json()) == json.dumps(written_elsewhere)


def test_assigning_a_key_the_object_lacks_adds_it_at_the_end():
    result = RunResult.from_json({"run_id": 3, "status": "ok"})
    result.history_error = None
    result.status = "failed"
    assert json.dumps(result.to_json()) == json.dumps({"run_id": 3, "status": "failed", "history_error": None})


@pytest.mark.parametrize("cls", [RunResult, RankResult, Bands, RunError])
def test_a_built_record_writes_its_default_keys_in_order(cls):
    assert tuple(cls().to_json()) == cls.default_keys()


def test_a_result_rebuilt_from_steps_writes_what_gpuanat_wrote_before_it_was_typed():
    """`result_from_steps` and `interrupted_result` at commit 29594be, on these steps and this partial result
    (tests/data/result_golden.json, "interrupted"): the same bytes now."""
    recorded = json.loads(GOLDEN_PATH.read_text())["interrupted"]
    rebuilt = result_from_steps({"batch_size": 4}, recorded["steps"], run_id=7, recorder_pid=4242)
    assert json.dumps(_before_the_loss(rebuilt.to_json())) == json.dumps(recorded["rebuilt"])
    assert json.dumps(_before_the_loss(result_from_steps({}, []).to_json())) == json.dumps(recorded["empty"])
    merged = interrupted_result(recorded["stored"], rebuilt)
    assert json.dumps(_before_the_loss(merged.to_json())) == json.dumps(recorded["merged"])
    # the steps recorded then carry no step of their logged loss: each loss is placed at the first step that carried it
    assert rebuilt.loss_curve == [[1, 3.0], [2, 2.0]] and (rebuilt.final_loss, rebuilt.min_loss) == (2.0, 2.0)
    assert "final_loss" not in rebuilt.unavailable
    nothing_logged = result_from_steps({}, [{**step, "loss": None} for step in recorded["steps"]])
    assert nothing_logged.final_loss is None and nothing_logged.unavailable["final_loss"] == NO_LOSS_REASON


def _before_the_loss(result: dict) -> dict:
    """A rebuilt result without the keys issue #52 appended (the loss, and the reasons of its missing values)."""
    return {key: value for key, value in result.items() if key not in (*LOSS_FIELDS, "unavailable")}


def test_the_prediction_embedded_in_a_result_writes_what_gpuanat_wrote_before_it_was_typed():
    """`prediction_json` at commit 29594be for these configurations, checked and with caveats, one GPU and several
    (tests/data/result_golden.json, "predictions"): the same bytes from `prediction` now — but for the peak reserved
    and device memory of a decoder on one GPU, which issue #50 derives anew (the replayed allocation stream)."""
    for recorded in json.loads(GOLDEN_PATH.read_text())["predictions"]:
        predicted = prediction(RunConfig(**recorded["config"]))
        assert predicted is not None and json.dumps(predicted.to_json()) == json.dumps(recorded["predicted"])
