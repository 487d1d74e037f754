"""One `gpuanat run --json` result kept and said in a line, for the GPU check scripts (liger_check.sh,
any_model_check.sh, loop_probes_check.sh): the result is appended, with the check's name, to a JSON-lines file, and
one line printed — status and steps, the peak allocated against the prediction the result carries, how far the bands
are from NVML's device used, the steady rate, TFLOP/s and MFU, and what the probe cost.

    python3 benchmarks/run_line.py RESULT_OUTPUT NAME RESULTS.jsonl

RESULT_OUTPUT is the run's stdout: its last line is the result. A run that printed none is said as such.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpuanat.core.measure.anatomy import stack_problems, stack_sum_error_percent

GIB = 2**30


def line(name: str, result: dict) -> str:
    peak = result.get("peak_allocated_bytes")
    predicted = (result.get("predicted") or {}).get("peak_allocated_bytes")
    error = result.get("prediction_error_percent")
    bands = stack_sum_error_percent(result)
    return (
        f"{name:<20} {result['status']:<6} steps {result.get('steps')!s:>4}  peak "
        f"{peak / GIB if peak else 0:6.2f} GiB predicted {predicted / GIB if predicted else 0:6.2f} "
        f"({'—' if error is None else f'{error:+.1f}%'})  bands {'—' if bands is None else f'{bands:+.3f}%'} of "
        f"NVML {stack_problems(result) or ''} steady {result.get('steady_samples_per_second')} TFLOP/s "
        f"{result.get('achieved_tflops')} MFU {result.get('mfu')} probe {result.get('probe_cost_percent')}%"
    )


def main() -> None:
    output, name, results = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
    lines = output.read_text(errors="replace").strip().splitlines() if output.exists() else []
    try:
        result = json.loads(lines[-1])
    except (IndexError, ValueError):
        print(f"{name:<20} no result")
        return
    with results.open("a") as kept:
        kept.write(json.dumps({**result, "check": name}) + "\n")
    print(line(name, result))


if __name__ == "__main__":
    main()
