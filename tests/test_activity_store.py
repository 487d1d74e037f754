"""A run's GPU activity and energy (issue #51) beyond the run: stored as columns of the history (schema 3, to which
version-1 and version-2 files are upgraded), shown by `gpuanat history` and the sweep table, compared, and exported to
Prometheus. GPU values come from the H100 recording (tests/data/gpm_h100_*.jsonl) through `steady_activity`, the code
a run's result uses; CPU values from real CPU runs, where each is None with its reason."""

from __future__ import annotations

import csv
import io
import json
import shutil
import sqlite3
import urllib.request
from contextlib import closing
from pathlib import Path

import pytest
from conftest import REPO, TINY_CPU, run_cli
from prometheus_client.parser import text_string_to_metric_families

from gpuanat.core.export.metrics import MetricsServer
from gpuanat.core.export.run_metrics import RunMetrics
from gpuanat.core.measure.activity import ACTIVITY_FIELDS, steady_activity
from gpuanat.core.measure.gpus import Gpu
from gpuanat.core.measure.samples import Sample
from gpuanat.core.store.compare import compare_runs
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.history_schema import ACTIVITY_COLUMNS, SCHEMA_VERSION
from gpuanat.core.store.report import HISTORY_COLUMNS, history_rows, render_csv, sweep_rows, unavailable_notes
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import RunResult

DATA = REPO / "tests" / "data"
RECORDED_V1 = DATA / "h100_history_tf32.sqlite"
"""Schema version 1 (no application_id), written on an H100."""
RECORDED_V2 = DATA / "h200_oom_history.sqlite"
"""Schema version 2, written on an H200."""


def _lines(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


READINGS = [
    (line["wall_s"], Sample.from_json({k: v for k, v in line.items() if k != "wall_s"}))
    for line in _lines("gpm_h100_workloads.jsonl")
]
WINDOWS = {window["kind"]: window for window in _lines("gpm_h100_windows.jsonl")}


def h100_result(kind: str, steady_samples_per_second: float, name: str) -> RunResult:
    """A result with the activity of the recorded H100 step `kind` (its wall window less its first 2 s and last 1 s),
    at the steady rate given, as `measure.result` builds it from the run's samples."""
    window = WINDOWS[kind]
    start, end = window["start_wall_s"] + 2, window["end_wall_s"] - 1
    inside = [sample.t_s for wall, sample in READINGS if start <= wall <= end]
    activity = steady_activity(
        [(sample.t_s, sample.gpus[0]) for _wall, sample in READINGS],
        (min(inside), max(inside)),
        steady_samples_per_second,
        512,
    )
    assert activity.values["joules_per_sample"] is not None and activity.values["tensor_active_percent"] is not None
    return RunResult.from_json(
        {
            "name": name,
            "status": "ok",
            "steady_samples_per_second": steady_samples_per_second,
            **activity.values,
            "unavailable": activity.unavailable,
        }
    )


def _columns(db: Path) -> dict[int, dict[str, float | None]]:
    with closing(sqlite3.connect(f"file:{db}?mode=ro", uri=True)) as raw:
        raw.row_factory = sqlite3.Row
        return {
            row["id"]: {column: row[column] for column in ACTIVITY_COLUMNS}
            for row in raw.execute(f"SELECT id, {', '.join(ACTIVITY_COLUMNS)} FROM runs")
        }


def test_the_activity_columns_hold_the_results_values_and_sort_runs(tmp_path):
    db = tmp_path / "h.sqlite"
    gemm, elementwise = h100_result("gemm", 40.0, "gemm"), h100_result("elementwise", 40.0, "elementwise")
    with HistoryStore(db) as store:
        ids = []
        for result in (gemm, elementwise):
            run_id = store.create_run({"preset": "bert-large", "device": "cuda"}, name=result.name)
            store.update_result(run_id, result, status="ok")
            ids.append(run_id)
    stored = _columns(db)
    for run_id, result in zip(ids, (gemm, elementwise), strict=True):
        assert stored[run_id] == {column: getattr(result, column) for column in ACTIVITY_COLUMNS}
    with closing(sqlite3.connect(db)) as raw:
        by_tensor = [name for (name,) in raw.execute("SELECT name FROM runs ORDER BY tensor_active_percent DESC")]
    assert by_tensor == ["gemm", "elementwise"]  # the GEMM kept the tensor pipes busy, the element-wise step not


def test_history_shows_tensor_and_energy_per_sample_beside_mfu(tmp_path):
    db = tmp_path / "h.sqlite"
    gemm = h100_result("gemm", 40.0, "gemm")
    with HistoryStore(db) as store:
        store.update_result(store.create_run({"preset": "bert-large"}, name="gemm"), gemm, status="ok")
        (run,) = store.runs()
    (row,) = history_rows([run])
    keys = [column.key for column in HISTORY_COLUMNS]
    assert keys.index("mfu") + 1 == keys.index("tensor_active_percent") == keys.index("joules_per_sample") - 1
    (written,) = csv.DictReader(io.StringIO(render_csv(HISTORY_COLUMNS, [row])))
    assert float(written["tensor_active_percent"]) == gemm.tensor_active_percent
    assert float(written["joules_per_sample"]) == gemm.joules_per_sample
    listed = run_cli(["history", "--format", "md"], db)
    assert listed.returncode == 0, listed.stderr
    header, _rule, line = listed.stdout.splitlines()
    cells = dict(zip(header.split(" | "), line.split(" | "), strict=True))
    assert cells["tensor %"] == f"{gemm.tensor_active_percent:.1f}%"
    assert float(cells["J/sample"]) == pytest.approx(gemm.joules_per_sample, abs=0.05)  # one decimal above 10 J
    (shown,) = json.loads(run_cli(["history", "--json"], db).stdout)
    assert {field: shown["result"][field] for field in ACTIVITY_FIELDS} == {
        field: getattr(gemm, field) for field in ACTIVITY_FIELDS
    }


def test_compare_gives_activity_and_energy_per_sample_with_deltas():
    gemm, elementwise = h100_result("gemm", 40.0, "gemm"), h100_result("elementwise", 40.0, "elementwise")
    comparison = compare_runs([1, 2], [{"step": "gemm"}, {"step": "elementwise"}], [gemm, elementwise])
    rows = {row.key: row for row in comparison.metrics}
    for key in ("sm_active_percent", "tensor_active_percent", "dram_bandwidth_percent", "average_power_w"):
        assert rows[key].values == (getattr(gemm, key), getattr(elementwise, key))
    energy = rows["joules_per_sample"]
    assert "lower is better" in energy.label
    assert energy.deltas_percent[1] == pytest.approx(
        100 * (elementwise.joules_per_sample - gemm.joules_per_sample) / gemm.joules_per_sample
    )
    cpu = RunResult.from_json({"status": "ok", "unavailable": dict.fromkeys(ACTIVITY_FIELDS, "CPU run")})
    without = {row.key for row in compare_runs([1, 2], [{}, {}], [cpu, cpu]).metrics}
    assert not without & {"tensor_active_percent", "joules_per_sample"}  # no rows of dashes for CPU runs


def test_the_sweep_rows_give_energy_per_sample_with_its_delta_and_say_why_one_is_missing():
    vanilla = h100_result("gemm", 40.0, "vanilla").to_json()
    faster = h100_result("gemm", 80.0, "bf16").to_json()  # twice the rate at the same power: half the energy
    cpu = {"name": "adafactor", "status": "ok", "unavailable": dict.fromkeys(ACTIVITY_FIELDS, "CPU run: no GPU")}
    skipped = {"name": "fp16", "status": "skipped", "reason": "fp16 needs a CUDA GPU"}
    rows = sweep_rows([vanilla, faster, cpu, skipped])
    assert rows[0]["joules_per_sample_delta"] == 0.0
    assert rows[1]["joules_per_sample_delta"] == pytest.approx(-50.0)
    assert rows[2]["joules_per_sample"] is None and rows[2]["joules_per_sample_delta"] is None
    assert unavailable_notes([vanilla, faster, cpu, skipped]) == [
        "“—” in Tensor %, J/sample (1 experiment: adafactor): CPU run: no GPU"
    ]


@pytest.mark.timeout(300)
def test_a_cpu_sweep_and_its_history_show_dashes_with_the_reason(db_path):
    """A real CPU run through `gpuanat sweep`: the table's tensor % and J/sample are "—", and a line under it says
    why; the history stores NULL in their columns and its JSON keeps the reasons."""
    completed = run_cli(["sweep", *TINY_CPU, "--only", "vanilla"], db_path, timeout_s=300)
    assert completed.returncode == 0, completed.stderr[-3000:]
    lines = completed.stdout.splitlines()
    header = next(line for line in lines if "experiment" in line)
    assert "Tensor %" in header and "J/sample" in header and "Δ J/sample" in header
    (row,) = [line for line in lines if line.split() and line.split()[0] == "vanilla"]
    cells = row.split()
    assert cells[cells.index("ok") + 1 :].count("—") >= 2
    (run,) = json.loads(run_cli(["history", "--json"], db_path).stdout)
    reason = run["result"]["unavailable"]["joules_per_sample"]
    assert run["result"]["joules_per_sample"] is None and reason
    assert f"“—” in Tensor %, J/sample (1 experiment: vanilla): {reason}" in lines
    assert _columns(db_path) == {run["id"]: dict.fromkeys(ACTIVITY_COLUMNS)}


def test_a_version_2_history_is_read_as_it_is_and_upgraded_with_its_results_values(tmp_path):
    db = tmp_path / "history.sqlite"
    shutil.copy(RECORDED_V2, db)
    gemm = h100_result("gemm", 40.0, "gemm")
    with closing(sqlite3.connect(db, isolation_level=None)) as raw:  # a result a schema-2 gpuanat wrote with them
        (first_id, stored), *_ = raw.execute("SELECT id, result_json FROM runs ORDER BY id").fetchall()
        values = {field: getattr(gemm, field) for field in ACTIVITY_FIELDS}
        raw.execute(
            "UPDATE runs SET result_json = ? WHERE id = ?", (json.dumps({**json.loads(stored), **values}), first_id)
        )
        assert raw.execute("PRAGMA user_version").fetchone()[0] == 2
    before = db.read_bytes()
    with HistoryStore(db, read_only=True) as reader:
        recorded = reader.runs()
        assert recorded[0].result.joules_per_sample == gemm.joules_per_sample
    assert db.read_bytes() == before  # a read-only open upgrades nothing
    with HistoryStore(db) as store:
        assert store.runs() == recorded
    with closing(sqlite3.connect(db, isolation_level=None)) as raw:
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 5
    stored_columns = _columns(db)
    assert stored_columns[first_id] == values
    assert all(
        columns == dict.fromkeys(ACTIVITY_COLUMNS) for run_id, columns in stored_columns.items() if run_id != first_id
    )


def test_a_version_1_history_is_upgraded_to_the_activity_columns(tmp_path):
    db = tmp_path / "history.sqlite"
    shutil.copy(RECORDED_V1, db)
    with HistoryStore(db, read_only=True) as reader:
        recorded = reader.runs()
    with HistoryStore(db) as store:
        assert store.runs() == recorded
        run_id = store.create_run({"preset": "bert-large"})
        store.update_result(run_id, h100_result("elementwise", 40.0, "new"), status="ok")
    stored = _columns(db)
    assert stored[recorded[0].id] == dict.fromkeys(ACTIVITY_COLUMNS)
    assert stored[run_id]["joules_per_sample"] == h100_result("elementwise", 40.0, "new").joules_per_sample


def _scrape(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def test_prometheus_serves_the_gpus_activity_energy_clocks_and_the_runs_energy_per_sample():
    """`RunMetrics` fed the recorded H100 samples (the GEMM step), as `execute_run` feeds it, scraped over HTTP."""
    window = WINDOWS["gemm"]
    busy = [sample for wall, sample in READINGS if window["start_wall_s"] + 2 <= wall <= window["end_wall_s"] - 1]
    gpu = busy[-1].gpus[0]
    metrics = RunMetrics()
    metrics.run_started(
        RunConfig(device="cuda"), 7, 4242, [Gpu(gpu.index, "GPU-recorded", gpu.name, gpu.total_bytes, 0, 1)]
    )
    for sample in busy:
        metrics.observe_sample(sample)
    server = MetricsServer(("127.0.0.1", 0), metrics.snapshots, job="j", hostname="node-1")
    try:
        training = _scrape(server.url)
        gemm = h100_result("gemm", 40.0, "gemm")
        metrics.run_ended(gemm)
        ended = _scrape(server.url)
    finally:
        server.close()

    def value(families: dict, name: str) -> float:
        (sample,) = families[name].samples
        assert sample.labels["UUID"] == "GPU-recorded" and sample.labels["Hostname"] == "node-1"
        return sample.value

    assert value(training, "gpuanat_tensor_active_percent") == gpu.tensor_active_percent
    assert value(training, "gpuanat_sm_active_percent") == gpu.sm_active_percent
    assert value(training, "gpuanat_dram_bandwidth_percent") == gpu.dram_bandwidth_percent
    assert value(training, "gpuanat_gpu_power_watts") == gpu.power_w
    assert value(training, "gpuanat_sm_clock_hertz") == gpu.sm_clock_mhz * 1e6
    energy = next(s for s in training["gpuanat_gpu_energy_joules"].samples if s.name.endswith("_total"))
    assert energy.value == gpu.energy_mj / 1000
    assert training["gpuanat_gpu_energy_joules"].type == "counter"
    throttled = value(training, "gpuanat_clocks_throttled")
    reasons = {s.labels["reason"] for s in training["gpuanat_clocks_throttle_reason"].samples}
    assert throttled == (1.0 if reasons else 0.0)
    assert reasons == ({"software power cap"} if gpu.clocks_event_reasons & 0x4 else set())
    assert (
        "gpuanat_energy_per_sample_joules" not in training or not training["gpuanat_energy_per_sample_joules"].samples
    )  # the run's, once it has ended
    assert value(ended, "gpuanat_energy_per_sample_joules") == gemm.joules_per_sample


SAME_STEPS = Path(__file__).resolve().parent.parent / "benchmarks/results/h100x2/gpm_same_steps"


def _recorded(name: str) -> RunResult:
    return RunResult.from_json(json.loads((SAME_STEPS / name).read_text().splitlines()[-1]))


def test_a_runs_summary_says_how_busy_the_gpu_was_and_what_the_run_cost_in_energy():
    """`gpuanat run`'s text summary of two results recorded on the H100 x2: the GEMM loop held down by its power cap,
    bert-large through Trainer; and a CPU run's reasons."""
    from gpuanat.cli.run_text import activity_lines

    gemm = _recorded("run_gemm.json")
    activity, energy = activity_lines(gemm)
    assert activity == (
        f"GPU activity: tensor pipes {gemm.tensor_active_percent:.0f}%, SMs {gemm.sm_active_percent:.0f}%, "
        f"DRAM bandwidth {gemm.dram_bandwidth_percent:.0f}% (steady medians, NVML GPM); SM clock 1,395 MHz, "
        "throttled in 100% of the samples (software power cap)"
    )
    assert energy.startswith(f"Energy: {gemm.joules_per_sample:.3g} J/sample")
    assert f"the whole run {gemm.energy_joules / 3600:.3g} Wh" in energy
    bert = _recorded("run_bert.json")
    activity, energy = activity_lines(bert)
    assert "tensor pipes 30%" in activity and f"{bert.average_power_w:.0f} W average" in energy
    assert f"{bert.joules_per_token:.3g} J/token" in energy
    cpu = RunResult.from_json({"status": "ok", "unavailable": dict.fromkeys(ACTIVITY_FIELDS, "CPU run: no GPU")})
    assert activity_lines(cpu) == ["GPU activity: — (CPU run: no GPU)", "Energy: — (CPU run: no GPU)"]


def test_compare_gives_the_whole_runs_energy_in_wh():
    gemm, bert = _recorded("run_gemm.json"), _recorded("run_bert.json")
    rows = {row.key: row for row in compare_runs([1, 2], [{}, {}], [gemm, bert]).metrics}
    assert rows["energy_wh"].values == pytest.approx((gemm.energy_joules / 3600, bert.energy_joules / 3600))
