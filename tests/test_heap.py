"""The freed heap handed back to the system (`core/heap.py`): what keeps a monitor open for days at a flat RSS."""

from __future__ import annotations

import json
import subprocess
import sys

from gpuanat.core.heap import TRIM_EVERY_S, HeapTrimmer, _glibc

FRAGMENTED_HEAP = r"""
import json, psutil
from gpuanat.core.heap import trim_heap
process = psutil.Process()
blocks = [bytearray(1500) for _ in range(100_000)]  # past pymalloc's 512 bytes: glibc's heap, 150 MB
kept = blocks[::64]  # one block in 64 stays: the heap's free pages lie between live blocks, not at its top
del blocks
before = process.memory_info().rss
trimmed = trim_heap()
after = process.memory_info().rss
print(json.dumps({"before": before, "after": after, "trimmed": trimmed, "kept": len(kept)}))
"""


def test_a_trim_hands_back_the_free_pages_between_live_blocks() -> None:
    """A real process frees 148 of 150 MB in blocks between ones it keeps: glibc keeps those pages (they are not
    at the heap's top) until `trim_heap`, which gives them back."""
    done = subprocess.run([sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    measured = json.loads(done.stdout)
    assert measured["trimmed"] is (_glibc() is not None)
    if measured["trimmed"]:
        assert measured["before"] > 120e6  # the freed blocks were still resident
        assert measured["before"] - measured["after"] > 100e6


def test_the_trimmer_trims_once_per_interval_of_sample_time() -> None:
    trimmer = HeapTrimmer()
    for index in range(4 * 3600 + 1):  # an hour of 4 Hz samples
        trimmer.after_sample(index * 0.25)
    expected = round(3600 / TRIM_EVERY_S) if _glibc() is not None else 0  # no malloc_trim: nothing to call
    assert trimmer.trims == expected
    assert TRIM_EVERY_S < 3600 / 2  # an hour's samples trim more than once
    for index in range(4 * 60):  # a replay's clock starting again from zero: counted afresh, no trim at once
        trimmer.after_sample(index * 0.25)
    assert trimmer.trims == expected
