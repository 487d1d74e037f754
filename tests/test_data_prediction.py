"""Every prediction of a --data run at the data's real length (`gpuanat.core.memory.data_length`), as `gpuanat
predict` makes it: the prediction a run stores and its error, the dashboard's techniques panel after `d`, fit's first
batch and tune's refusals. Real CLI runs and the real TUI, with the tiny decoder and a tokenizer built by the tests
(`text_data`): the data's rows are shorter than --seq-len, so the two lengths differ.
"""

from __future__ import annotations

import json
from pathlib import Path

from conftest import last_json, start_cli
from text_data import texts, write_jsonl

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
    _, predict_stderr = finished(
        start_cli(["predict", *TINY_DECODER, *data, "--gpu-memory", "80GiB", "--json"], None, extra_env=env), "predict"
    )
    assert f"gpuanat: predict: at seq {max(LENGTHS)}, the longest of --data's 6 rows" in predict_stderr
    processes = {
        "run": start_cli(["run", *TINY_DECODER, "--device", "cpu", *data, "--json"], tmp_path / "a.sqlite", extra_env=env),
        "random": start_cli(["run", *TINY_DECODER, "--device", "cpu", "--json"], tmp_path / "b.sqlite", extra_env=env),
        "predict": start_cli(
            ["predict", *TINY_DECODER, *data, "--gpu-memory", "80GiB", "--json"], None, extra_env=env
        ),
        "predict on the cpu": start_cli(
            ["predict", *TINY_DECODER, "--device", "cpu", *data, "--json"], None, extra_env=env
        ),
    }
    outputs = {name: finished(process, name)[0] for name, process in processes.items()}
    run, random = last_json(outputs["run"]), last_json(outputs["random"])
    predicted, on_the_cpu = json.loads(outputs["predict"]), json.loads(outputs["predict on the cpu"])
    assert run["status"] == "ok" and random["status"] == "ok", (run["error"], random["error"])
    # a CPU run stores the GPU's prediction (`predict` without --device cpu), at the data's length: every key the same
    assert run["predicted"] == {key: predicted[key] for key in run["predicted"]}
    assert run["predicted"]["seq_len"] == predicted["config"]["seq_len"] == max(LENGTHS)
    assert on_the_cpu["seq_len"] == max(LENGTHS) and on_the_cpu["logits_bytes"] == run["predicted"]["logits_bytes"]
    # the same run on --seq-len's random rows: predicted at --seq-len, larger, with no seq_len of its own
    assert "seq_len" not in random["predicted"]
    assert random["predicted"]["logits_bytes"] == run["predicted"]["logits_bytes"] * SEQ_LEN // max(LENGTHS)
    assert random["predicted"]["peak_allocated_bytes"] > run["predicted"]["peak_allocated_bytes"]
