"""Issue #50's out-of-memory edge, held against runs on the H100 (80 GB, NVML total 81,559 MiB): for each configuration
`gpuanat predict` names the largest batch that fits; `gpuanat run` trained at that batch, and at one more it ran out of
memory — or, where the replay is cautious, trained too (benchmarks/oom/edge_check.sh; the runs in
benchmarks/results/h100/oom_edge/). What must never happen is the dangerous side: a batch predicted to fit that ran out
of memory. The verdicts are today's `predict`, the outcomes the recorded runs'."""

from __future__ import annotations

import json
import shlex

from conftest import REPO, run_cli

EDGE_RUNS = REPO / "benchmarks" / "results" / "h100" / "oom_edge"
H100_NVML_TOTAL = "81559MiB"
HOLDS = {
    "--preset qwen2.5-0.5b --precision bf16 --seq-len 2048",
    "--preset llama-3.2-1b --precision bf16 --seq-len 2048",
    "--model benchmarks/configs/gemma-3-1b/config.json --precision bf16 --seq-len 1024 --lora 16",
    "--model benchmarks/configs/smollm2-360m/config.json --precision bf16 --seq-len 2048",
    "--model benchmarks/configs/qwen3-0.6b/config.json --precision bf16 --seq-len 2048 --lora 16",
}
"""Where the edge is exact: the predicted largest batch trained and one more ran out of memory."""


def recorded_outcomes() -> dict[str, dict[int, str]]:
    outcomes: dict[str, dict[int, str]] = {}
    for path in sorted(EDGE_RUNS.glob("edge_*.jsonl")):
        for line in path.read_text().splitlines():
            run = json.loads(line)
            outcomes.setdefault(run["config"], {})[run["batch"]] = run["status"]
    return outcomes


def test_the_largest_batch_predicted_trained_on_the_h100_and_one_more_did_not(db_path):
    outcomes = recorded_outcomes()
    assert len(outcomes) == 8
    exact = []
    for config, by_batch in outcomes.items():
        completed = run_cli(["predict", *shlex.split(config), "--gpu-memory", H100_NVML_TOTAL, "--json"], db_path)
        assert completed.returncode == 0, completed.stderr
        largest = json.loads(completed.stdout)["max_batch_size"]
        assert by_batch.get(largest) == "ok", (
            config,
            largest,
            by_batch,
        )  # never predicted to fit and then out of memory
        assert all(status == "ok" for batch, status in by_batch.items() if batch <= largest), (config, by_batch)
        if by_batch.get(largest + 1) == "oom":
            exact.append(config)
    assert set(exact) == HOLDS, exact
