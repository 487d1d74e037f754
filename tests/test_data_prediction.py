"""Every prediction of a --data run at the data's real length (`gpuanat.core.memory.data_length`), as `gpuanat
predict` makes it: the prediction a run stores and its error, the dashboard's techniques panel after `d`, fit's first
batch and tune's refusals. Real CLI runs and the real TUI, with the tiny decoder and a tokenizer built by the tests
(`text_data`): the data's rows are shorter than --seq-len, so the two lengths differ.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import last_json, start_cli
from test_first_minute import screen_text
from test_tui import make_app, run_to_completion, wait_for
from test_tune_search import H100
from text_data import texts, write_jsonl

from gpuanat.core.run.fit import fit_start
from gpuanat.core.run.tune.candidates import Predictor
from gpuanat.core.run.tune.space import search_space
from gpuanat.core.store.report import format_bytes
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.tui.screens.data import DataScreen

SEQ_LEN = 16
LENGTHS = [3, 9, 5, 11, 7, 2]
"""Words a row (one token each): the longest, 11, is under --seq-len."""
TINY_DECODER = ["--preset", "llama-tiny", "--seq-len", str(SEQ_LEN), "--samples", "6", "--batch-size", "6"]


def data_flags(tmp_path: Path, tokenizer: Path) -> list[str]:
    data = write_jsonl(tmp_path / "train.jsonl", [{"text": text} for text in texts(LENGTHS)])
    return ["--data", str(data), "--tokenizer", str(tokenizer)]


def finished(process, what: str) -> tuple[str, str]:
    stdout, stderr = process.communicate(timeout=240)
    assert process.returncode == 0, (what, stderr)
    return stdout, stderr


def test_a_data_runs_stored_prediction_is_predicts_at_the_datas_longest_row(tmp_path, word_tokenizer):
    env = {"HF_DATASETS_CACHE": str(tmp_path / "datasets-cache")}
    data = data_flags(tmp_path, word_tokenizer)
    # tokenized once, by predict, before the runs read the cache side by side
    predict_stdout, predict_stderr = finished(
        start_cli(["predict", *TINY_DECODER, *data, "--gpu-memory", "80GiB", "--json"], None, extra_env=env), "predict"
    )
    assert f"gpuanat: predict: at seq {max(LENGTHS)}, the longest of --data's 6 rows" in predict_stderr
    processes = {
        "run": start_cli(
            ["run", *TINY_DECODER, "--device", "cpu", *data, "--json"], tmp_path / "a.sqlite", extra_env=env
        ),
        "random": start_cli(["run", *TINY_DECODER, "--device", "cpu", "--json"], tmp_path / "b.sqlite", extra_env=env),
        "predict on the cpu": start_cli(
            ["predict", *TINY_DECODER, "--device", "cpu", *data, "--json"], None, extra_env=env
        ),
    }
    outputs = {name: finished(process, name)[0] for name, process in processes.items()}
    run, random = last_json(outputs["run"]), last_json(outputs["random"])
    predicted, on_the_cpu = json.loads(predict_stdout), json.loads(outputs["predict on the cpu"])
    assert run["status"] == "ok" and random["status"] == "ok", (run["error"], random["error"])
    # a CPU run stores the GPU's prediction (`predict` without --device cpu), at the data's length: every key the same
    assert run["predicted"] == {key: predicted[key] for key in run["predicted"]}
    assert run["predicted"]["seq_len"] == predicted["config"]["seq_len"] == max(LENGTHS)
    assert on_the_cpu["seq_len"] == max(LENGTHS) and on_the_cpu["logits_bytes"] == run["predicted"]["logits_bytes"]
    # the same run on --seq-len's random rows: predicted at --seq-len, larger, with no seq_len of its own
    assert "seq_len" not in random["predicted"]
    assert random["predicted"]["logits_bytes"] == run["predicted"]["logits_bytes"] * SEQ_LEN // max(LENGTHS)
    assert random["predicted"]["peak_allocated_bytes"] > run["predicted"]["peak_allocated_bytes"]


@pytest.mark.asyncio
async def test_the_dashboards_prediction_after_d_is_at_the_datas_length_and_so_is_its_runs(
    tmp_path, word_tokenizer, monkeypatch
):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    data, _, tokenizer = data_flags(tmp_path, word_tokenizer)[1:]
    app = make_app(
        tmp_path / "h.sqlite", RunConfig(preset="llama-tiny", device="cpu", seq_len=SEQ_LEN, samples=6, batch_size=6)
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        before = screen_text(app)
        assert "at seq" not in before
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, DataScreen), what="the data box")
        app.screen.query_one("#data-input").value = data
        app.screen.query_one("#tokenizer-input").value = tokenizer
        await pilot.press("enter")
        # the data is read in a worker; then the panel's line says the length, and the bar's predicted logits follow
        await wait_for(
            pilot,
            lambda: f"at seq {max(LENGTHS)}: --data's longest row" in screen_text(app),
            what="the prediction at the data's length",
        )
        after = screen_text(app)
        result = await run_to_completion(app, pilot)
    assert result.status == "ok", result.error
    # the run started from the dashboard stores the same prediction, at the data's length
    assert result.predicted is not None and result.predicted.seq_len == max(LENGTHS)
    logits_before, logits_after = (logits_row(screen) for screen in (before, after))
    assert logits_after != logits_before and format_bytes(result.predicted.logits_bytes) in logits_after


def logits_row(screen: str) -> str:
    (row,) = [line for line in screen.splitlines() if "of which logits" in line]
    return row


def test_fit_starts_and_tune_prunes_at_the_datas_length():
    """On an 8 GiB GPU the tiny decoder at seq 2048 fits a few rows a batch; rows of at most 100 tokens, many more."""
    config = RunConfig(preset="llama-tiny", seq_len=2048, data="train.jsonl", tokenizer="tokenizer")
    short = config.replace(seq_len=100)
    gpu = 8 * 1024**3
    assert fit_start(config, gpu, 100) == fit_start(short, gpu)
    assert fit_start(config, gpu, 100).batch_size > fit_start(config, gpu).batch_size
    space = search_space(config, H100, set(), gpu_memory_bytes=gpu)
    at_data_length, at_seq_len = Predictor(space, 100), Predictor(space)
    assert at_data_length.largest_fitting(config) == at_seq_len.largest_fitting(short)
    assert at_data_length.largest_fitting(config) > at_seq_len.largest_fitting(config)
    assert at_data_length.peak_device_bytes(config) == at_seq_len.peak_device_bytes(short)
    # --padding max and pack train every batch at --seq-len: predicted there
    for padding in ("max", "pack"):
        padded = config.replace(padding=padding)
        assert Predictor(space, 100).largest_fitting(padded) == at_seq_len.largest_fitting(padded)
        assert fit_start(padded, gpu, 100) == fit_start(padded, gpu)
