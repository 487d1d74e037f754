"""The whole model compiled (`--compile`) is not predicted (issue #50, point 4): on the H100 bert-large bf16 at batch 64
took 1.7x eager's memory compiled, where the bytes model said eager's 36.65 GiB with no caveat. `predict` refuses its
activations, peaks and largest batch with the reason; the fit ladder, `tune` and `fit` never propose or start from a
compiled model's memory read from the eager model; the dashboard says why it has no prediction. Its regions compiled
(`--compile-regions`, measured as eager) stay predicted."""

from __future__ import annotations

import io
import json

import pytest
from conftest import run_cli
from recorded_backend import TRACE, RecordedRunBackend, recorded_config
from rich.console import Console
from test_dashboard_gpus import make_app
from test_recorded_run import NVML as RECORDED_NVML
from test_recorded_run import wait_until
from test_tune_search import H100, H100_NVML_TOTAL_BYTES, FakeTrials, tune

from gpuanat.cli.run import out_of_memory_hint
from gpuanat.core.measure.explain import explain_run
from gpuanat.core.measure.replay import ReplaySource
from gpuanat.core.memory.allocation_templates import largest_batch
from gpuanat.core.memory.fit_ladder import REGIONS_FLAGS, fit_ladder, what_would_fit
from gpuanat.core.memory.predict import estimate_memory, fits_in, peak_device_bytes, prediction
from gpuanat.core.run.fit import fit_start
from gpuanat.core.run.tune.candidates import Predictor, Search
from gpuanat.core.run.tune.space import search_space
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.vocabulary.techniques import compile_mode, with_compile_mode
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.widgets.memory_bar import MemoryBar
from gpuanat.tui.widgets.techniques_panel import TechniquesPanel

GIB = 1024**3
BS64 = ["--precision", "bf16", "--batch-size", "64", "--gpu-memory", "80GiB"]
COMPILED_BS64 = RunConfig(precision="bf16", batch_size=64, compile=True)


def test_predict_refuses_the_compiled_models_peaks_and_batch_with_the_reason(db_path):
    """The issue's command: no 36.65 GiB, but what is exact (the model's state), and for the rest why not, in the
    table and in --json; exit 2 as for a config it cannot describe. Its regions compiled are predicted as eager."""
    table = run_cli(["predict", "--compile", *BS64], db_path)
    assert table.returncode == 2, table.stderr
    assert "--compile" in table.stderr and len(table.stderr.splitlines()) == 1
    assert "36.65 GiB" not in table.stdout
    rows = {line.strip().split("  ")[0]: line for line in table.stdout.splitlines() if line.startswith("  ")}
    assert "1.25 GiB" in rows["weights"] and "2.50 GiB" in rows["optimizer state"]
    for band in ("activations", "peak allocated", "peak device"):
        assert "—  (not predicted: the whole model compiled)" in rows[band], rows[band]
    assert "inductor's partitioner" in table.stdout and "68.1 GB allocated against eager's 39.4 GB" in table.stdout
    assert "largest batch that fits: — (not predicted" in table.stdout

    as_json = run_cli(["predict", "--compile", *BS64, "--json"], db_path)
    assert as_json.returncode == 2
    result = json.loads(as_json.stdout)
    for key in ("activations_bytes", "peak_allocated_bytes", "peak_reserved_bytes", "peak_device_bytes"):
        assert result[key] is None and "materialises the attention matrices" in result["unavailable"][key]
    assert result["max_batch_size"] is None and "1.7x" in result["unavailable"]["max_batch_size"]
    assert result["weights_bytes"] == estimate_memory(COMPILED_BS64).weights_bytes  # exact: compiling changes none
    assert result["confidence"] == "unchecked"

    regions = run_cli(["predict", "--compile-regions", *BS64, "--json"], db_path)
    eager = run_cli(["predict", *BS64, "--json"], db_path)
    assert regions.returncode == eager.returncode == 0
    regions_result, eager_result = json.loads(regions.stdout), json.loads(eager.stdout)
    assert regions_result["peak_allocated_bytes"] == eager_result["peak_allocated_bytes"] > 36 * GIB
    assert "unavailable" not in regions_result and regions_result["max_batch_size"] == eager_result["max_batch_size"]


def test_the_fit_ladder_of_a_compiled_model_begins_with_its_regions_and_never_reads_its_memory():
    """At batch 256 nothing compiled is predicted: the ladder's first step compiles the regions in its place
    (predicted as eager), the next ones keep them; no step's peak is a compiled model's. A run that ran out of memory
    compiled is told no flags "predicted to fit", but why, and the regions as an idea."""
    config = COMPILED_BS64.replace(batch_size=256)
    ladder = fit_ladder(config, 80 * GIB)
    assert ladder[0].flags == REGIONS_FLAGS and ladder[0].refused is None
    regions = with_compile_mode(config, "regions")
    assert ladder[0].peak_device_bytes == peak_device_bytes(estimate_memory(regions))
    assert not ladder[0].fits and ladder[1].flags == "--grad-checkpointing" and ladder[1].fits
    checkpointed = regions.replace(grad_checkpointing=True)
    assert ladder[1].peak_device_bytes == peak_device_bytes(estimate_memory(checkpointed))
    assert fits_in(estimate_memory(checkpointed), 80 * GIB)
    # where its regions fit as given, the ladder still says so rather than "fits as given" of the compiled model
    assert [step.flags for step in fit_ladder(COMPILED_BS64, 80 * GIB)] == [REGIONS_FLAGS]

    suggestion = what_would_fit(config, 80 * GIB)
    assert suggestion.flags == () and suggestion.max_batch_size is None
    assert suggestion.not_predicted is not None and "partitioner" in suggestion.not_predicted
    assert "--compile-regions in place of --compile (predicted as eager)" in suggestion.ideas
    hint = out_of_memory_hint(config, 80 * GIB)
    assert "predicted to fit" not in hint and "--compile-regions" in hint


def test_tune_never_proposes_the_whole_model_compiled():
    """The compile move tries eager and compiled regions only, from any center; a whole tune from a GPU-bound run
    (compile first) neither runs nor prunes a compiled model."""
    space = search_space(RunConfig(), H100, set(), gpu_memory_bytes=H100_NVML_TOTAL_BYTES)
    search = Search(RunConfig(), space, Predictor(space))
    start = search.largest_fitting_rung(search.start(), powers_only=True)
    assert start is not None
    for center in (start, with_compile_mode(start, "regions")):
        modes = {compile_mode(candidate) for candidate in search.alternatives("compile", center)}
        assert modes == {"off", "regions"} - {compile_mode(center)}
    trials = FakeTrials(bottleneck=lambda config: "gpu-bound", speedup=lambda config: 1.1)
    _, result = tune(trials)
    assert any(trial.dimension == "compile" for trial in result.trials)
    assert not [config for config in trials.configs if config.compile]
    assert not [pruned for pruned in result.pruned if pruned.config.compile]


def test_fit_starts_a_compiled_model_from_eagers_prediction_and_says_it_bounds_nothing():
    start = fit_start(COMPILED_BS64, 80 * GIB)
    assert start.predicted is None and start.method == "eager"
    assert start.batch_size == largest_batch(COMPILED_BS64.replace(compile=False), 80 * GIB).batch_size > 64
    assert "bounds nothing" in start.words() and "not predicted" in start.words()
    eager = fit_start(COMPILED_BS64.replace(compile=False), 80 * GIB)
    assert eager.predicted == eager.batch_size and eager.words() == " (the prediction)"


def panel_text(app) -> str:
    console = Console(width=200, record=True, file=io.StringIO())
    console.print(app.query_one(TechniquesPanel).render())
    return console.export_text()


@pytest.mark.asyncio
async def test_the_dashboard_says_why_a_compiled_model_has_no_prediction(tmp_path):
    """On an H200 (its capabilities and NVML as recorded), c to "model": the techniques panel's prediction line says
    why there is none, the memory bar has no predicted column; c again (eager): a predicted peak again."""
    app = make_app(tmp_path / "h.sqlite", RunConfig(precision="bf16", batch_size=64), gpu_names=("NVIDIA H200",))
    async with app.run_test(size=(200, 60)) as pilot:
        while app.dashboard.capabilities is None:
            await pilot.pause()
        await pilot.pause()
        assert "predicted peak: 37.65 GiB" in panel_text(app)
        await pilot.press("c", "c")
        await pilot.pause()
        assert app.dashboard.config.compile
        text = panel_text(app)
        assert "predicted peak: none — the whole model compiled is not predicted" in text, text
        assert "1.7× eager's memory" in text and "37.65" not in text
        assert app.query_one(MemoryBar)._predicted is None
        assert "no prediction: the whole model compiled (--compile) is not predicted" in str(
            app.query_one(TechniquesPanel).tooltip
        )
        await pilot.press("c")
        await pilot.pause()
        assert compile_mode(app.dashboard.config) == "off" and "predicted peak: 37.65 GiB" in panel_text(app)


def test_explain_says_why_a_compiled_run_that_ran_out_of_memory_had_no_predicted_peak():
    """A compiled run's recorded prediction holds no peak: `explain` says why, and what would fit is not a ladder's
    flags but the reason and the ideas."""
    config = COMPILED_BS64.replace(batch_size=128)
    predicted = prediction(config)
    assert predicted is not None and predicted.peak_allocated_bytes is None
    result = RunResult.from_json(
        {
            "status": "oom",
            "config": config.to_json(),
            "predicted": predicted.to_json(),
            "device_memory_total_bytes": H100_NVML_TOTAL_BYTES,
        }
    )
    explanation = explain_run(1, None, "launched", "oom", result)
    assert explanation.prediction is None
    assert explanation.missing["prediction"].startswith("no peak was predicted: the whole model compiled")
    assert explanation.would_fit is not None and explanation.would_fit.flags == ()
    assert "--compile-regions in place of --compile (predicted as eager)" in explanation.would_fit.ideas


@pytest.mark.asyncio
async def test_f_on_a_compiled_model_starts_from_eagers_prediction_and_says_it_bounds_nothing(db_path):
    """The dashboard's f over the H100's recorded run, the whole model compiled: its first notice names eager's
    predicted batch as a start that bounds nothing (the recorded backend then refuses to search)."""
    config = with_compile_mode(recorded_config(), "model")
    app = GpuAnatApp(
        config,
        db_path=db_path,
        backend=RecordedRunBackend(),
        sampler_factory=lambda: (ReplaySource(TRACE), RECORDED_NVML),
        sample_interval_s=None,
        paint_interval_s=0.05,
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_until(pilot, lambda: app.dashboard.capabilities is not None, "the capabilities")
        await pilot.press("f")
        await wait_until(pilot, lambda: any("fit stopped" in n.message for n in app.notices), "fit's end")
    eager = largest_batch(config.replace(compile=False), app.dashboard.painter.gpu_total_bytes() or 0).batch_size
    (starting,) = [notice.message for notice in app.notices if notice.message.startswith("fit: trials")]
    assert f"from batch {eager} (eager's prediction: the whole model compiled is not predicted, no bound)" in starting
