"""The operations anatomy of a tune's best trial (profiled inside the search, `tune --profile-ops`' default) and of
its start, from the search's history, beside the paper's BERT-large table and the model's FLOPs against the
profiler's: one JSON document.

    python3 benchmarks/tune54/winner_anatomy.py tune.json history.sqlite > winner_operations.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuanat.core.operations.anatomy import PAPER, PAPER_SOURCE
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import RunConfig

GROUPS = ("contractions", "elementwise", "normalizations", "optimizer", "memory_copies", "other")


def trial_anatomy(store: HistoryStore, trial: dict) -> dict:
    row = store.run(trial["run_id"])
    assert row is not None and row.result is not None, trial["run_id"]
    anatomy = row.result.operations_anatomy or {}
    config = RunConfig.from_json(trial["config"])
    samples = (anatomy.get("profiled_steps") or 0) * config.batch_size * config.grad_accum
    return {
        "trial": trial["name"],
        "run_id": trial["run_id"],
        "steady_samples_per_second": trial["steady_samples_per_second"],
        "mfu": row.result.mfu,
        "flops_per_sample_gpuanat": row.result.flops_per_sample,
        "flops_per_sample_profiler": anatomy["flops"] / samples if samples and anatomy.get("flops") else None,
        "profiled_steps": anatomy.get("profiled_steps"),
        "busy_share": anatomy.get("busy_share"),
        "groups": {
            group: {
                key: (anatomy.get(group) or {}).get(key)
                for key in ("time_share", "flop_share", "tflops_per_s", "gb_per_s", "time_s", "calls")
            }
            for group in GROUPS
        },
        "top_kernels": {group: (anatomy.get(group) or {}).get("top_kernels", [])[:3] for group in GROUPS},
    }


def main(tune_path: str, history_path: str) -> dict:
    summary = json.loads(Path(tune_path).read_text())
    store = HistoryStore(history_path, read_only=True)
    start = next(trial for trial in summary["trials"] if trial["dimension"] == "start")
    return {
        "best": trial_anatomy(store, summary["best"]),
        "start": trial_anatomy(store, start),
        "paper": {"source": PAPER_SOURCE, "flop_and_runtime_share": PAPER},
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2]), indent=1))
