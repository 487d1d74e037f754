"""gpuanat's own sampler (`NvmlSource`, every --interval s) recorded as JSON lines with the wall time, until killed:
the trace issue #51's checks replay (tests/data/) and compare with benchmarks/gpm/independent_gpm.py's.

    python benchmarks/gpm/record_gpm.py --out FILE.jsonl [--interval 0.25]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gpuanat.core.measure.nvml_source import NvmlSource


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    source = NvmlSource()
    with open(args.out, "w") as out:
        while True:
            started = time.perf_counter()
            sample = source.read([])
            record = {"wall_s": time.time(), "read_s": time.perf_counter() - started, **sample.to_json()}
            out.write(json.dumps(record) + "\n")
            out.flush()
            time.sleep(max(0.0, args.interval - (time.perf_counter() - started)))


if __name__ == "__main__":
    raise SystemExit(main())
