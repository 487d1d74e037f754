"""The loss pane (issue #52, item 3) in the real dashboards, headless: the launching dashboard after real CPU runs —
its chart, the compare view's overlay of two runs' curves, and the same loss scraped from its Prometheus endpoint —
and the watch dashboard watching a real HF Trainer script with the probe's one-line callback."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import time
import urllib.request

import pytest
from conftest import REPO, cli_env
from prometheus_client.parser import text_string_to_metric_families
from test_first_minute import screen_text
from test_tui import TINY, run_to_completion, wait_for

from gpuanat.core.export.metrics import MetricsServer
from gpuanat.core.export.run_metrics import RunMetrics
from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.measure.process_tree import HostOnlySource
from gpuanat.core.measure.samples import NvmlStatus
from gpuanat.core.watch.target import resolve_target
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.run_backend import LocalRunBackend
from gpuanat.tui.screens.compare import CompareScreen
from gpuanat.tui.watch_app import WatchApp
from gpuanat.tui.widgets.loss_chart import LossChart

LOGGED = TINY.replace(samples=120)
"""30 steps of 4: the Trainer logs at 10, 20 and 30; with batches of 8, 15 steps and a log at 10."""


WATCHED_TRAINER = ["--callback", "--samples", "80", "--hold-s", "3"]
"""3 epochs of 20 steps (Trainer's default epochs), logged every 5 (tiny_trainer.py's logging_steps), the last log at
the last step; then 3 s alive for the watch to read the end."""


def scraped(url: str) -> dict[str, float]:
    """The endpoint's samples, parsed by prometheus_client: name -> value (one rank)."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return {sample.name: sample.value for family in text_string_to_metric_families(text) for sample in family.samples}


@pytest.mark.asyncio
async def test_the_dashboard_charts_the_loss_compares_two_curves_and_serves_the_latest(db_path):
    metrics = RunMetrics()
    server = MetricsServer(("127.0.0.1", 0), metrics.snapshots, job="loss")
    app = GpuAnatApp(
        LOGGED,
        db_path=db_path,
        sampler_factory=lambda: open_source(prefer_nvml=False),
        backend=LocalRunBackend(db_path, metrics=metrics),
    )
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
            chart = app.dashboard.query_one("#loss-chart", LossChart)
            assert not chart.display and "Loss by step" not in screen_text(app)  # no room taken before a log
            first = await run_to_completion(app, pilot)
            await pilot.pause(0.3)
            assert first.loss_curve is not None and [step for step, _ in first.loss_curve] == [10, 20, 30]
            assert chart.display and chart.region.height >= 4
            assert chart.curves == {"loss": [(step, loss) for step, loss in first.loss_curve]}
            shown = screen_text(app)
            title = next(line for line in shown.splitlines() if "Loss by step" in line)
            assert "lr " in title and "grad norm " in title, title  # the Trainer logs both
            assert f"{first.final_loss:.4g}" in title  # the legend's latest loss
            assert "step 10" in shown
            # the endpoint serves the last logged loss, as the result has it
            served = scraped(server.url)
            assert served["gpuanat_loss"] == first.final_loss
            assert served["gpuanat_learning_rate"] > 0 and served["gpuanat_grad_norm"] > 0
            # at 80x24 the dashboard folds: the chart keeps its title line, with the latest values
            await pilot.resize_terminal(80, 24)
            await pilot.pause(0.3)
            assert chart.display and chart.region.height >= 3, chart.region
            assert "Loss by step" in screen_text(app)
            await pilot.resize_terminal(120, 40)
            await pilot.press("plus")
            second = await run_to_completion(app, pilot)
            assert second.loss_curve is not None and [step for step, _ in second.loss_curve] == [10]
            await pilot.press("enter")
            await pilot.pause(0.3)
            assert isinstance(app.screen, CompareScreen)
            overlay = app.screen.query_one("#compare-loss", LossChart)
            assert overlay.curves == {
                f"run {run.run_id}": [(step, loss) for step, loss in run.loss_curve] for run in (first, second)
            }
            rows = {row.key: row for row in app.screen.comparison.metrics}
            assert set(rows["final_loss"].values) == {first.final_loss, second.final_loss}
            shown = screen_text(app)
            assert "Loss of each run by" in shown  # its title cut short, as its neighbours'
            assert f"{first.final_loss:.4g}" in shown and f"{second.final_loss:.4g}" in shown  # the table's rows
    finally:
        server.close()


@pytest.mark.asyncio
async def test_the_watch_dashboard_charts_the_loss_a_watched_trainer_logs(tmp_path, monkeypatch):
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime_dir))
    env = {**cli_env(tmp_path / "history.sqlite", offline_hub=True), "XDG_RUNTIME_DIR": str(runtime_dir)}
    printed = tmp_path / "trainer.out"
    with printed.open("w") as out:
        trainer = subprocess.Popen(
            [sys.executable, str(REPO / "tests" / "scripts" / "tiny_trainer.py"), *WATCHED_TRAINER],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
        )
    nvml = NvmlStatus(
        available=False, reason="no NVML here", driver_version=None, cuda_driver_version=None, gpu_names=()
    )
    try:
        app = WatchApp(
            resolve_target(trainer.pid),
            db_path=tmp_path / "history.sqlite",
            interval_s=0.1,
            paint_interval_s=0.1,
            sampler_factory=lambda: (HostOnlySource(per_process=True), nvml),
        )
        async with app.run_test(size=(120, 40)) as pilot:
            chart = app.dashboard.query_one("#loss-chart", LossChart)
            deadline = time.monotonic() + 180
            while not (app.dashboard.last_record or {}).get("training_done"):
                assert trainer.poll() is None or time.monotonic() < deadline, printed.read_text()[-2000:]
                assert time.monotonic() < deadline, "the watch never saw the training end"
                await pilot.pause(0.1)
            await pilot.pause(0.3)
            # what the Trainer printed (f"{v:.4g}"), at each logging step (5, 10, …, 60)
            logs = [ast.literal_eval(found) for found in re.findall(r"\{'loss': [^}]*\}", printed.read_text())]
            by_step = {5 * (index + 1): log for index, log in enumerate(logs)}
            assert max(by_step) == 60
            (points,) = chart.curves.values()
            assert points and points[-1][0] == 60, points  # the last log, which only `done` carries
            for step, loss in points:  # each point one the Trainer logged, as it printed it
                assert f"{loss:.4g}" == by_step[step]["loss"], (step, loss, by_step[step])
            assert f"{app.dashboard.loss.learning_rate:.4g}" == by_step[60]["learning_rate"]
            assert f"{app.dashboard.loss.grad_norm:.4g}" == by_step[60]["grad_norm"]
            title = next(line for line in screen_text(app).splitlines() if "Loss by step" in line)
            assert chart.display and "lr " in title and "grad norm " in title, title
    finally:
        trainer.kill()
        trainer.wait(timeout=30)
