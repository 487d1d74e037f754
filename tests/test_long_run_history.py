"""A long run's rows in a real history file stay bounded (`core/store/sample_thinning`): the recent minutes at full
rate, older samples thinned per bucket with the rows holding each bucket's extremes, so a peak survives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.recording import PendingWrites
from gpuanat.core.store.sample_thinning import SAMPLE_THINNING, STEP_THINNING, Thinning, sample_readings

TRACE = Path(__file__).parent / "data" / "nvml_trace_h100.jsonl"
RATE_HZ = 4
PEAK_BYTES = 81_000_000_000
"""Above anything in the recorded H100 trace: a spike put into the replayed samples one hour before the end."""


def replayed_samples(hours: float) -> list[dict[str, Any]]:
    """The recorded H100 trace cycled over `hours` at 4 Hz, timestamps accelerated; one spike of memory and
    utilization an hour before the end."""
    recorded = [json.loads(line) for line in TRACE.read_text().splitlines() if line.strip()]
    count = int(hours * 3600 * RATE_HZ)
    samples = []
    for index in range(count):
        sample = json.loads(json.dumps(recorded[index % len(recorded)]))
        sample["t_s"] = 1000.0 + index / RATE_HZ
        samples.append(sample)
    spike = samples[count - 3600 * RATE_HZ]
    spike["gpus"][0]["used_bytes"] = PEAK_BYTES
    spike["gpus"][0]["gpu_util_percent"] = 100.0
    return samples


def record(store: HistoryStore, samples: list[dict[str, Any]], thinnings: tuple[Thinning, ...]) -> int:
    """Write `samples` through the recorder's `PendingWrites`, one flush a simulated minute; the run's id."""
    run_id = store.create_run({"model": "replayed"}, kind="watch", name="long")
    pending = PendingWrites(store, run_id, thinnings)
    per_flush = 60 * RATE_HZ
    for start in range(0, len(samples), per_flush):
        pending.add_samples(samples[start : start + per_flush])
        assert pending.flush()
    return run_id


def used(sample: dict[str, Any]) -> int:
    return sample["gpus"][0]["used_bytes"]


def test_two_hours_of_samples_thinned_with_recent_minutes_at_full_rate_and_every_buckets_peak(
    db_path: Path,
) -> None:
    samples = replayed_samples(2.0)
    store = HistoryStore(db_path)
    run_id = record(store, samples, (STEP_THINNING, SAMPLE_THINNING))
    stored = store.samples(run_id)
    latest_s = samples[-1]["t_s"]

    assert len(samples) == 28_800
    assert len(stored) < 2_400 + 240 * 9  # recent 10 min at 4 Hz + at most 9 rows per 30 s bucket, far below
    recent = [sample["t_s"] for sample in samples if sample["t_s"] > latest_s - SAMPLE_THINNING.full_rate]
    assert set(recent) <= {sample["t_s"] for sample in stored}, "the recent minutes are kept at full rate"
    assert max(used(sample) for sample in stored) == PEAK_BYTES
    assert any(sample["gpus"][0]["gpu_util_percent"] == 100.0 for sample in stored)
    # Every bucket's extremes survive: the stored rows hold each 30 s bucket's min and max of every reading.
    origin = samples[0]["t_s"]

    def extremes(rows: list[dict[str, Any]]) -> dict[tuple[int, str], tuple[float, float]]:
        found: dict[tuple[int, str], tuple[float, float]] = {}
        for row in rows:
            bucket = int((row["t_s"] - origin) // SAMPLE_THINNING.first_bucket)
            for name, value in sample_readings(row):
                if value is not None:
                    low, high = found.get((bucket, name), (value, value))
                    found[(bucket, name)] = (min(low, value), max(high, value))
        return found

    assert extremes(stored) == extremes(samples)
    assert stored[0]["t_s"] == origin and stored[-1]["t_s"] == latest_s, "the stored run still spans the whole run"
    store.close()


def test_rows_stay_bounded_as_the_run_grows_the_buckets_widening(db_path: Path) -> None:
    """Small buckets so that two hours outgrow them many times over: the width doubles, the rows stay bounded."""
    small = Thinning("samples", "t_s", sample_readings, full_rate=60.0, first_bucket=5.0, max_buckets=16)
    samples = replayed_samples(2.0)
    store = HistoryStore(db_path)
    run_id = record(store, samples, (small,))
    stored = store.samples(run_id)

    rows_per_bucket = 2 + 2 * 4  # first, last, and min and max of 4 readings (one GPU)
    assert len(stored) <= (60 + 5) * RATE_HZ + (small.max_buckets + 1) * rows_per_bucket
    assert max(used(sample) for sample in stored) == PEAK_BYTES
    with HistoryStore(db_path) as reread:
        assert len(reread.samples(run_id)) == len(stored)
    store.close()


def test_steps_thinned_keep_the_last_step_and_the_losses_extremes(db_path: Path) -> None:
    store = HistoryStore(db_path)
    run_id = store.create_run({"model": "replayed"}, kind="watch", name="steps")
    pending = PendingWrites(store, run_id)
    steps = [
        {"step": step, "elapsed_s": step * 0.1, "samples": step * 8, "loss": 2.0 + (step % 97) / 97, "rank": 0}
        for step in range(1, 30_001)
    ]
    steps[1_234]["loss"] = 0.01
    for start in range(0, len(steps), 500):
        pending.add_steps(steps[start : start + 500])
        assert pending.flush()
    stored = store.steps(run_id)

    assert len(stored) < 6_000 + 512 * 6
    assert stored[-1] == steps[-1], "the last step, with its counts, is what an interrupted run is rebuilt from"
    assert min(step["loss"] for step in stored) == 0.01
    assert max(step["loss"] for step in stored) == max(step["loss"] for step in steps)
    store.close()
