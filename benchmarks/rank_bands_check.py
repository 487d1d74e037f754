"""Every rank's bands in `gpuanat watch PID --json` records of a job (a torchrun PID): each rank entry's stack against
the NVML reading of its GPU beside it, and each rank's last weights, optimizer state and gradients.

    python3 benchmarks/rank_bands_check.py RECORDS.jsonl
"""

from __future__ import annotations

import collections
import json
import sys

from gpuanat.core.measure.anatomy import stack_problems, stack_sum_error_percent


def main() -> None:
    with open(sys.argv[1]) as lines:
        records = [json.loads(line) for line in lines if line.strip()]
    by_rank: dict[int, list[dict]] = collections.defaultdict(list)
    for record in records:
        for rank in record.get("ranks") or []:
            if rank.get("bands") and rank.get("used_bytes"):
                by_rank[rank["rank"]].append(rank)
    print(
        f"{len(records)} records, {sum(bool(r.get('published')) for r in records)} published; ranks with bands "
        f"beside NVML: {sorted(by_rank)}"
    )
    for rank, entries in sorted(by_rank.items()):
        errors = [error for error in map(stack_sum_error_percent, entries) if error is not None]
        problems = [problem for entry in entries for problem in stack_problems(entry, f"rank {rank}")]
        last, bands = entries[-1], entries[-1]["bands"]
        print(
            f"  rank {rank} on GPU {last.get('gpu_index')}: {len(entries)} records, max |sum - NVML| "
            f"{max(map(abs, errors)) if errors else float('nan'):.4f}%, {len(problems)} problems {problems[:2]}; at "
            f"step {last.get('step')}: used {last['used_bytes']:,} B, weights {bands.get('weights_bytes') or 0:,}, "
            f"optimizer {bands.get('optimizer_state_bytes') or 0:,}, gradients after backward "
            f"{last.get('gradients_after_backward_bytes') or 0:,}"
        )


if __name__ == "__main__":
    main()
