"""`--data`: real runs on local jsonl, parquet and csv files, tokenized with a real tokenizer built by the test
(`text_data`); the padding share checked against a count made here, outside gpuanat; packing; the tokens cached
between runs; bad data refused in one line with exit 2; predict at the data's lengths; the dashboard's d and P keys.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from conftest import last_json, run_cli, start_cli
from test_first_minute import screen_text
from test_tui import make_app, run_to_completion, wait_for
from text_data import texts, token_lengths, write_jsonl

from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.dataset.load import length_histogram
from gpuanat.tui.screens.data import DataScreen

SEQ_LEN = 16
LENGTHS = [3, 9, 14, 5, 20, 7, 11, 2, 16, 6, 4, 12]
"""Words a row (one token each); 20 is past --seq-len 16, truncated when padded."""
LLAMA_CPU = ["--preset", "llama-tiny", "--device", "cpu", "--seq-len", str(SEQ_LEN)]


def data_env(tmp_path: Path) -> dict[str, str]:
    """datasets' cache in the test's own folder: a first run tokenizes, whatever ran before."""
    return {"HF_DATASETS_CACHE": str(tmp_path / "datasets-cache")}


def padding_of(lengths: list[int], batch_size: int, width: int | None) -> float:
    """The padding share of batches of `batch_size` rows in the order given, each padded to its longest row
    (`width` None) or to `width`, rows truncated at SEQ_LEN: counted here as the DataLoader batches them."""
    clipped = [min(length, SEQ_LEN) for length in lengths]
    positions = real = 0
    for start in range(0, len(clipped), batch_size):
        batch = clipped[start : start + batch_size]
        positions += len(batch) * (width or max(batch))
        real += sum(batch)
    return 100 * (positions - real) / positions


def test_a_jsonl_run_trains_on_its_rows_padding_counted_exactly_and_a_second_run_reuses_the_tokens(
    tmp_path, word_tokenizer
):
    rows = texts(LENGTHS)
    data = write_jsonl(tmp_path / "train.jsonl", [{"text": text, "source": "test"} for text in rows])
    lengths = token_lengths(word_tokenizer, rows)  # counted with the tokenizer itself, outside gpuanat
    assert lengths == LENGTHS
    common = [*LLAMA_CPU, "--data", str(data), "--tokenizer", str(word_tokenizer), "--samples", "12", "--json"]
    # one batch of every row: padded to the longest row, whatever order the Trainer's shuffle gave them
    first = run_cli(["run", *common, "--batch-size", "12"], tmp_path / "h.sqlite", extra_env=data_env(tmp_path))
    assert first.returncode == 0, first.stderr
    longest = last_json(first.stdout)
    assert longest["status"] == "ok", longest["error"]
    assert longest["samples"] == 12 and longest["steps"] == 1
    assert longest["padding_percent"] == pytest.approx(padding_of(lengths, 12, None), abs=1e-9)
    assert longest["length_histogram"] == {"1-2": 1, "3-4": 2, "5-8": 3, "9-16": 5, "17+": 1}
    assert longest["length_histogram"] == length_histogram(lengths, SEQ_LEN)
    assert longest["real_tokens_per_second"] == pytest.approx(
        longest["samples_per_second"] * sum(min(length, SEQ_LEN) for length in lengths) / 12
    )
    assert longest["config"]["data"] == str(data) and longest["config"]["padding"] == "longest"
    assert "gpuanat: --data: 12 rows of 'text', tokenized into the cache" in first.stderr
    (cache_file,) = (tmp_path / "datasets-cache" / "gpuanat-tokenized").glob("*.arrow")
    written = cache_file.stat().st_mtime_ns

    # every row padded to --seq-len, 3 batches: the order does not change the count
    second = run_cli(
        ["run", *common, "--batch-size", "4", "--padding", "max"], tmp_path / "h.sqlite", extra_env=data_env(tmp_path)
    )
    assert second.returncode == 0, second.stderr
    padded = last_json(second.stdout)
    assert padded["status"] == "ok", padded["error"]
    assert padded["samples"] == 12 and padded["steps"] == 3
    assert padded["padding_percent"] == pytest.approx(padding_of(lengths, 4, SEQ_LEN), abs=1e-9)
    assert "gpuanat: --data: 12 rows of 'text', read back from the cache (tokenized by an earlier run)" in second.stderr
    assert "tokenized rows read back from the cache" in Path(padded["log_path"]).read_text()  # and the child's
    assert cache_file.stat().st_mtime_ns == written  # read, not tokenized again


def test_packing_a_parquet_file_trains_no_padding_and_more_real_tokens_a_second(tmp_path, word_tokenizer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    lengths = [3 + index % 4 for index in range(256)]  # short rows: mostly padding at --seq-len 32
    data = tmp_path / "train.parquet"
    pq.write_table(pa.table({"content": texts(lengths)}), data)  # found by its name: content
    common = [
        *("--preset", "llama-tiny", "--device", "cpu", "--seq-len", "32", "--batch-size", "4", "--samples", "256"),
        *("--data", str(data), "--tokenizer", str(word_tokenizer), "--json"),
    ]
    env = data_env(tmp_path)
    processes = {
        padding: start_cli(["run", *common, "--padding", padding], tmp_path / f"{padding}.sqlite", extra_env=env)
        for padding in ("max", "pack")
    }
    results = {}
    for padding, process in processes.items():
        stdout, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        results[padding] = last_json(stdout)
        assert results[padding]["status"] == "ok", results[padding]["error"]
    total = sum(lengths)
    assert results["max"]["padding_percent"] == pytest.approx(100 * (256 * 32 - total) / (256 * 32), abs=1e-9)
    assert results["pack"]["padding_percent"] == 0
    assert results["pack"]["samples"] == total // 32  # whole blocks of --seq-len; the remainder is dropped
    pack_log = Path(results["pack"]["log_path"]).read_text()
    assert "packing: attention kept within each row" in pack_log
    # the same shape a step, about 7 times the real tokens in it
    assert results["pack"]["steady_real_tokens_per_second"] > results["max"]["steady_real_tokens_per_second"]


def test_an_encoder_trains_on_a_csv_files_text_and_labels(tmp_path, word_tokenizer):
    lengths = [4, 7, 2, 9, 5, 3, 8, 6]
    data = tmp_path / "train.csv"
    data.write_text("sentence,label\n" + "".join(f"{text},{index % 2}\n" for index, text in enumerate(texts(lengths))))
    completed = run_cli(
        [
            "run",
            *("--preset", "tiny", "--device", "cpu", "--seq-len", str(SEQ_LEN), "--batch-size", "4"),
            *("--data", str(data), "--tokenizer", str(word_tokenizer), "--padding", "max", "--json"),
        ],
        tmp_path / "h.sqlite",
        extra_env=data_env(tmp_path),
    )
    assert completed.returncode == 0, completed.stderr
    result = last_json(completed.stdout)
    assert result["status"] == "ok", result["error"]
    assert result["samples"] == 8
    assert result["padding_percent"] == pytest.approx(padding_of(lengths, 4, SEQ_LEN), abs=1e-9)


def test_random_data_says_why_it_has_no_padding_share(tmp_path):
    from gpuanat.core.measure.data_rates import DATA_FIELDS, data_rates

    rates = data_rates(RunConfig(device="cpu"), None, None)
    assert all(rates.values[name] is None for name in DATA_FIELDS)
    assert rates.unavailable["padding_percent"].startswith("synthetic data")


def test_packed_rows_keep_their_attention_to_themselves(word_tokenizer):
    """A packed block of two rows gives each row the logits it has alone: transformers' mask from the restarting
    position_ids; the second row's first token is no label. A BERT packs plainly."""
    import torch

    from gpuanat.worker.batches import IGNORE_INDEX, packed_rows, packs_within_rows
    from gpuanat.worker.model import build_model

    model = build_model(RunConfig(preset="llama-tiny", device="cpu", attn="sdpa")).eval()
    assert packs_within_rows(model)
    assert not packs_within_rows(build_model(RunConfig(preset="tiny", device="cpu")))
    model.config.use_cache = False
    first, second = [5, 6, 7, 8, 9], [10, 11, 12]
    (block,) = packed_rows([(first, 0), (second, 0)], 8, within_rows=True, causal_lm=True)
    assert block["position_ids"].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]
    assert block["labels"].tolist() == [5, 6, 7, 8, 9, IGNORE_INDEX, 11, 12]
    with torch.no_grad():
        packed = model(input_ids=block["input_ids"][None], position_ids=block["position_ids"][None]).logits[0]
        alone = [model(input_ids=torch.tensor([row])).logits[0] for row in (first, second)]
    torch.testing.assert_close(packed[:5], alone[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(packed[5:], alone[1], rtol=1e-4, atol=1e-5)


def test_predict_takes_the_datas_longest_row_and_renders_chat_messages(tmp_path, word_tokenizer):
    conversations = [
        [{"role": "user", "content": " ".join(texts([3]))}, {"role": "assistant", "content": text}]
        for text in texts([2, 6, 4])
    ]
    data = write_jsonl(tmp_path / "chat.jsonl", [{"messages": messages} for messages in conversations])
    # the tokenizer has no chat template: "role: content" lines, counted here the same way
    rendered = ["\n".join(f"{m['role']}: {m['content']}" for m in messages) for messages in conversations]
    longest = max(token_lengths(word_tokenizer, rendered))
    args = ["predict", *LLAMA_CPU[:4], "--seq-len", "64", "--data", str(data), "--tokenizer", str(word_tokenizer)]
    completed = run_cli([*args, "--json"], None, extra_env=data_env(tmp_path))
    assert completed.returncode == 0, completed.stderr
    assert f"gpuanat: predict: at seq {longest}, the longest of --data's 3 rows (--padding longest)" in completed.stderr
    assert json.loads(completed.stdout)["config"]["seq_len"] == longest
    from datasets import Dataset

    saved = tmp_path / "saved"  # a saved dataset directory reads the same way
    Dataset.from_dict({"text": texts([5, 11, 7])}).save_to_disk(saved)
    from_disk = run_cli([*args[:-4], "--data", str(saved), *args[-2:]], None, extra_env=data_env(tmp_path))
    assert from_disk.returncode == 0, from_disk.stderr
    assert "gpuanat: predict: at seq 11, the longest of --data's 3 rows" in from_disk.stderr
    # a tokenizer with a chat template renders the messages with it
    from transformers import AutoTokenizer

    templated = AutoTokenizer.from_pretrained(word_tokenizer)
    templated.chat_template = "{% for m in messages %}<{{ m['role'] }}> {{ m['content'] }} [EOS] {% endfor %}"
    templated.save_pretrained(tmp_path / "templated")
    rendered_by_template = [templated.apply_chat_template(messages, tokenize=False) for messages in conversations]
    longest_templated = max(
        len(templated(text, add_special_tokens=False)["input_ids"]) for text in rendered_by_template
    )
    assert longest_templated != longest
    chat = run_cli([*args[:-2], "--tokenizer", str(tmp_path / "templated")], None, extra_env=data_env(tmp_path))
    assert chat.returncode == 0, chat.stderr
    assert f"gpuanat: predict: at seq {longest_templated}, the longest of --data's 3 rows" in chat.stderr
    packed = run_cli([*args, "--padding", "pack", "--json"], None, extra_env=data_env(tmp_path))
    assert "at seq 64, --seq-len: --padding pack" in packed.stderr
    assert json.loads(packed.stdout)["config"]["seq_len"] == 64


def test_bad_data_is_refused_in_one_line_before_anything_trains(tmp_path, word_tokenizer):
    good = write_jsonl(tmp_path / "good.jsonl", [{"text": "the cat"}])
    (tmp_path / "notes.txt").write_text("the cat sat\n")
    fieldless = write_jsonl(tmp_path / "qa.jsonl", [{"question": "the cat", "answer": "a mat"}])
    not_text = write_jsonl(tmp_path / "numbers.jsonl", [{"text": "the cat"}, {"text": 5}])
    (tmp_path / "broken.jsonl").write_text('{"text": "the cat"}\n{"text": "a mat\n')
    tokenizer = ["--tokenizer", str(word_tokenizer)]
    cases = {
        "missing file": (
            [*tokenizer, "--data", str(tmp_path / "missing.jsonl")],
            "--data: no such file or directory: ",
        ),
        "unknown format": ([*tokenizer, "--data", str(tmp_path / "notes.txt")], "--data: unknown format .txt of "),
        "no text field": ([*tokenizer, "--data", str(fieldless)], "its columns: question, answer: name the one"),
        "not text": ([*tokenizer, "--data", str(not_text)], "is int, not text"),
        "does not decode": ([*tokenizer, "--data", str(tmp_path / "broken.jsonl")], "--data: cannot read "),
        "given field missing": ([*tokenizer, "--data", str(good), "--text-field", "body"], "--text-field: 'body' is"),
        "tokenizer directory": (["--data", str(good), "--tokenizer", str(tmp_path / "nowhere")], "--tokenizer: no "),
        "tokenizer not cached": (["--data", str(good), "--tokenizer", "nobody/no-such-tokenizer"], "--tokenizer: no "),
        "preset, no tokenizer": (["--data", str(good)], "--tokenizer: a --preset has no tokenizer"),
        "hub dataset not cached": (
            [*tokenizer, "--data", "nobody/no-such-dataset"],
            "no Hub dataset in the local cache",
        ),
    }
    processes = {
        name: start_cli(
            ["run", *LLAMA_CPU, *args], tmp_path / "h.sqlite", offline_hub=True, extra_env=data_env(tmp_path)
        )
        for name, (args, _) in cases.items()
    }
    for name, process in processes.items():
        _, stderr = process.communicate(timeout=240)
        expected = cases[name][1]
        assert process.returncode == 2, (name, stderr)
        lines = [line for line in stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("gpuanat: error: ") and expected in lines[0], (name, stderr)
    assert not (tmp_path / "h.sqlite").exists()  # nothing started: no run recorded


@pytest.mark.asyncio
async def test_the_dashboards_d_chooses_the_data_and_p_its_padding(tmp_path, word_tokenizer, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    lengths = [3, 9, 5, 12, 7, 2, 10, 4]
    data = write_jsonl(tmp_path / "train.jsonl", [{"text": text} for text in texts(lengths)])
    app = make_app(tmp_path / "h.sqlite", RunConfig(preset="llama-tiny", device="cpu", seq_len=SEQ_LEN, samples=8))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        await pilot.press("d")
        await wait_for(pilot, lambda: isinstance(app.screen, DataScreen), what="the data box")
        app.screen.query_one("#data-input").value = str(data)
        app.screen.query_one("#tokenizer-input").value = str(word_tokenizer)
        await pilot.press("enter")
        await wait_for(pilot, lambda: not isinstance(app.screen, DataScreen), what="the data box to close")
        assert (app.dashboard.config.data, app.dashboard.config.tokenizer) == (str(data), str(word_tokenizer))
        await pilot.press("P")
        assert app.dashboard.config.padding == "max"
        await pilot.pause()
        screen = screen_text(app)  # the panel shows the data and its padding once chosen, with their keys
        assert re.search(r"d *data *train\.jsonl", screen) and re.search(r"P *padding *max", screen), screen
        result = await run_to_completion(app, pilot)
    assert result.status == "ok", result.error
    assert result.config["data"] == str(data) and result.config["padding"] == "max"
    assert result.padding_percent == pytest.approx(padding_of(lengths, 4, SEQ_LEN), abs=1e-9)


def test_a_data_runs_summary_says_its_real_tokens_and_padding():
    from gpuanat.cli.data import data_line
    from gpuanat.core.vocabulary.result import RunResult

    result = RunResult(padding_percent=41.07, real_tokens_per_second=747.4, steady_real_tokens_per_second=874.5)
    assert data_line(result) == "Real tokens/second: 747.40 (steady 874.50); padding 41.1% of the tokens trained"
