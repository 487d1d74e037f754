"""Every rank's anatomy in Prometheus (issue #33): a real Prometheus server (Debian's `prometheus`) scrapes a real CPU
run of `gpuanat run --metrics` and a real `torchrun --nproc-per-node=2` job whose probes serve `GPUANAT_METRICS`;
PromQL returns every rank's bands, equal to what gpuanat's own JSON says. Skipped where no `prometheus` binary is
installed (scripts/test_tools.sh installs Debian's)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from conftest import REPO, TINY_CPU, cli_env, last_json, run_cli, start_cli, start_torchrun_job
from prometheus_client.parser import text_string_to_metric_families

from gpuanat.core.export.metrics import RankSnapshot, metric_families, parse_address

PROMETHEUS = shutil.which("prometheus")
WATCH = [sys.executable, "-m", "gpuanat", "watch"]
needs_prometheus = pytest.mark.skipif(PROMETHEUS is None, reason="no prometheus binary (apt-get install prometheus)")
TENSOR_BANDS = ("weights_bytes", "gradients_bytes", "optimizer_state_bytes", "activations_bytes")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Prometheus:
    """A real Prometheus on a loopback port, scraping `targets` every 0.5 s."""

    def __init__(self, folder: Path, targets: list[str]) -> None:
        self.port = free_port()
        config = folder / "prometheus.yml"
        config.write_text(
            json.dumps(
                {  # YAML is a superset of JSON
                    "global": {"scrape_interval": "500ms", "scrape_timeout": "400ms"},
                    "scrape_configs": [
                        {"job_name": "gpuanat", "honor_labels": True, "static_configs": [{"targets": targets}]}
                    ],
                }
            )
        )
        self.process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={folder / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=1)
                return
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"prometheus did not start: {self.process.stderr.read()[-2000:]}") from None
                time.sleep(0.2)

    def query(self, promql: str) -> list[dict]:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(url, timeout=5) as response:
            answer = json.load(response)
        assert answer["status"] == "success", answer
        return answer["data"]["result"]

    def wait_for_scraping(self, target: str) -> None:
        """Until Prometheus has tried `target` once (up 0 or 1): its scrape loop runs."""
        deadline = time.monotonic() + 30
        while not self.query(f'up{{instance="{target}"}}'):
            assert time.monotonic() < deadline, "prometheus never tried the target"
            time.sleep(0.2)

    def scrapes_of(self, target: str) -> int:
        counted = self.query(f'count_over_time(up{{instance="{target}"}}[5m])')
        return sum(int(float(entry["value"][1])) for entry in counted)

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def bands_by_rank(prometheus: Prometheus, selector: str) -> dict[int, dict[str, float]]:
    """rank → band → bytes, the last value Prometheus holds of each series."""
    found: dict[int, dict[str, float]] = {}
    for entry in prometheus.query(f"last_over_time(gpuanat_memory_band_bytes{{{selector}}}[5m])"):
        labels = entry["metric"]
        found.setdefault(int(labels["rank"]), {})[labels["band"] + "_bytes"] = float(entry["value"][1])
    return found


@needs_prometheus
def test_prometheus_scrapes_a_run_and_its_bands_equal_the_result(tmp_path):
    port = free_port()
    prometheus = Prometheus(tmp_path, [f"127.0.0.1:{port}"])
    try:
        prometheus.wait_for_scraping(f"127.0.0.1:{port}")
        run = start_cli(
            ["run", *TINY_CPU, "--samples", "400", "--json", "--metrics", f"127.0.0.1:{port}", "--name", "scraped"],
            tmp_path / "history.sqlite",
        )
        stdout, stderr = run.communicate(timeout=300)
        assert run.returncode == 0, stderr[-3000:]
        assert f"gpuanat: Prometheus metrics at http://127.0.0.1:{port}/metrics" in stderr
        result = last_json(stdout)
        assert prometheus.scrapes_of(f"127.0.0.1:{port}") >= 3
        exported = bands_by_rank(prometheus, 'job="scraped"')
        steps = prometheus.query('last_over_time(gpuanat_step{job="scraped"}[5m])')
        rates = prometheus.query('max_over_time(gpuanat_samples_per_second{job="scraped"}[5m])')
    finally:
        prometheus.close()
    assert list(exported) == [0]  # one rank: the run's own
    for band in TENSOR_BANDS:  # on the CPU the tensor bands are the whole anatomy
        assert exported[0][band] == result["bands"][band], (band, exported[0], result["bands"])
    assert 1 <= float(steps[0]["value"][1]) <= result["steps"]
    assert steps[0]["metric"]["run_id"] == str(result["run_id"])
    assert float(rates[0]["value"][1]) > 0


@needs_prometheus
def test_prometheus_scrapes_every_rank_of_a_torchrun_job_through_its_probes_and_its_watch(tmp_path):
    """GPUANAT_METRICS in a torchrun job gpuanat did not start: each rank's probe serves its own series on the port
    plus its LOCAL_RANK; `gpuanat watch PID --json --metrics` serves the same ranks from its records. The bands
    Prometheus holds per rank, from either, are those the watch's JSON records say."""
    base = free_port()
    while True:  # two consecutive free ports
        try:
            with socket.socket() as second:
                second.bind(("127.0.0.1", base + 1))
            break
        except OSError:
            base = free_port()
    watch_port = free_port()
    targets = [f"127.0.0.1:{base}", f"127.0.0.1:{base + 1}", f"127.0.0.1:{watch_port}"]
    prometheus = Prometheus(tmp_path, targets)
    for target in targets:
        prometheus.wait_for_scraping(target)
    job, env = start_torchrun_job(
        tmp_path,
        REPO / "tests" / "scripts" / "tiny_plain_loop.py",
        "--probe",
        "--samples",
        "4000",
        "--hold-s",
        "1",
        job_env={"GPUANAT_METRICS": f"127.0.0.1:{base}", "GPUANAT_METRICS_JOB": "ddp-job"},
    )
    try:
        watch = subprocess.run(
            [*WATCH, str(job.pid), "--json", "--duration", "5", "--metrics", f"127.0.0.1:{watch_port}"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        records = [json.loads(line) for line in watch.stdout.splitlines()]
        deadline = time.monotonic() + 30
        while not all(prometheus.scrapes_of(target) >= 2 for target in targets) and time.monotonic() < deadline:
            time.sleep(0.5)
        from_probes = bands_by_rank(prometheus, 'job="ddp-job"')
        from_watch = bands_by_rank(prometheus, f'job="watch {job.pid}"')
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(timeout=60)
        prometheus.close()
    assert f"Prometheus metrics at http://127.0.0.1:{watch_port}/metrics" in watch.stderr
    watched = next(record for record in reversed(records) if len(record.get("ranks") or []) == 2)
    assert sorted(from_probes) == sorted(from_watch) == [0, 1]
    for entry in watched["ranks"]:
        for band in ("weights_bytes", "optimizer_state_bytes", "activations_bytes"):
            assert from_probes[entry["rank"]][band] == entry["bands"][band], (entry["rank"], band)
            assert from_watch[entry["rank"]][band] == entry["bands"][band], (entry["rank"], band)


def test_the_exposition_parses_with_prometheus_client_and_labels_match_dcgm():
    snapshot = RankSnapshot(
        rank=1,
        run_id="7",
        gpu_index=3,
        gpu_uuid="GPU-abc",
        bands={"weights_bytes": 100, "gradients_bytes": 0, "free_bytes": None},
        samples_per_second=2.5,
        step_phase_seconds={"forward": 0.1, "gpu wait": 0.0},
        model="bert-large",
        techniques="bs4 bf16",
    )
    from prometheus_client import CollectorRegistry, generate_latest

    class Source:
        def collect(self):
            return metric_families([snapshot], hostname="node-7", job="j")

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Source())
    families = {family.name: family for family in text_string_to_metric_families(generate_latest(registry).decode())}
    bands = {sample.labels["band"]: sample.value for sample in families["gpuanat_memory_band_bytes"].samples}
    assert bands == {"weights": 100.0, "gradients": 0.0}  # a band not known now is no sample, never 0
    labels = families["gpuanat_memory_band_bytes"].samples[0].labels
    assert {key: labels[key] for key in ("gpu", "UUID", "Hostname", "rank", "job", "run_id")} == {
        "gpu": "3",
        "UUID": "GPU-abc",
        "Hostname": "node-7",
        "rank": "1",
        "job": "j",
        "run_id": "7",
    }
    assert families["gpuanat_step_phase_seconds"].samples[1].labels["phase"] == "gpu wait"
    assert families["gpuanat_run_status"].samples[0].labels["status"] == "training"


@pytest.mark.parametrize(
    ("text", "expected"), [("9400", ("127.0.0.1", 9400)), ("0.0.0.0:9400", ("0.0.0.0", 9400)), ("[::1]:0", ("::1", 0))]
)
def test_addresses(text, expected):
    assert parse_address(text) == expected


@pytest.mark.parametrize("text", ["", "x", "70000", "host:", "-1"])
def test_a_bad_address_is_refused_at_the_command_line(text, tmp_path):
    completed = subprocess.run(
        [sys.executable, "-m", "gpuanat", "run", "--metrics", text],
        env=cli_env(None),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 2 and "--metrics" in completed.stderr and "[HOST:]PORT" in completed.stderr


def test_a_port_taken_is_a_clear_error(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        completed = subprocess.run(
            [sys.executable, "-m", "gpuanat", "run", *TINY_CPU, "--metrics", str(port)],
            env=cli_env(tmp_path / "h.sqlite"),
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert completed.returncode == 2
    assert f"--metrics: cannot listen on 127.0.0.1:{port}" in completed.stderr


def test_the_grafana_dashboard_queries_only_what_gpuanat_exports():
    dashboard = json.loads((REPO / "deploy" / "grafana" / "gpuanat.json").read_text())
    queried = set(re.findall(r"gpuanat_[a-z_]+", json.dumps(dashboard)))
    families = metric_families(
        [
            RankSnapshot(
                rank=0,
                bands={"weights_bytes": 1},
                gradients_after_backward_bytes=1,
                device_used_bytes=1,
                device_total_bytes=1,
                gpu_util_percent=1,
                step=1,
                total_steps=1,
                samples_per_second=1,
                tokens_per_second=1,
                achieved_tflops=1,
                mfu=0.1,
                step_phase_seconds={"data": 1},
                predicted_peak_bytes=1,
            )
        ],
        hostname="h",
        job="j",
    )
    exported = {family.name for family in families}
    assert queried and queried <= exported, queried - exported
    assert {"gpuanat_memory_band_bytes", "gpuanat_mfu_ratio", "gpuanat_step_phase_seconds"} <= queried


@pytest.mark.asyncio
async def test_the_dashboard_tells_its_metrics_about_its_runs(db_path):
    """The dashboard's --metrics source follows the runs it starts: once one ends, the result's own bands and status."""
    from test_tui import TINY, run_to_completion, wait_for

    from gpuanat.core.export.run_metrics import RunMetrics
    from gpuanat.core.measure.nvml_source import open_source
    from gpuanat.tui.app import GpuAnatApp
    from gpuanat.tui.run_backend import LocalRunBackend

    metrics = RunMetrics()
    app = GpuAnatApp(
        TINY,
        db_path=db_path,
        sampler_factory=lambda: open_source(prefer_nvml=False),
        backend=LocalRunBackend(db_path, metrics=metrics),
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        assert metrics.snapshots() == []
        result = await run_to_completion(app, pilot)
    (snapshot,) = metrics.snapshots()
    assert (snapshot.rank, snapshot.run_id, snapshot.status) == (0, str(result.run_id), "ok")
    assert snapshot.bands == result.ranks[0].bands.values()
    assert snapshot.step == result.steps and snapshot.model == "tiny"


def test_a_script_run_with_metrics_has_its_probe_serve_them(tmp_path):
    port = free_port()
    completed = run_cli(
        [
            "run",
            "--json",
            "--metrics",
            f"127.0.0.1:{port}",
            "--name",
            "served script",
            "--script",
            str(REPO / "tests" / "scripts" / "tiny_plain_loop.py"),
            "--",
            "--probe",
        ],
        tmp_path / "history.sqlite",
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    log = Path(last_json(completed.stdout)["log_path"]).read_text()
    assert f"gpuanat: rank 0 metrics at http://127.0.0.1:{port}/metrics" in log
