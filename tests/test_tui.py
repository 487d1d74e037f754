"""The real dashboard, headless (App.run_test + Pilot), driving real tiny-BERT runs on the CPU.

The sampler is the real HostOnlySource (this machine has no NVIDIA driver); the capability probe is
the real subprocess; runs are real children recorded in a throwaway history.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import re
import statistics
import threading
import time

import psutil
import pytest
from rich.console import Console
from test_first_minute import screen_text

from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.percent import percent_delta
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.protocol import MODULES_REST, NO_MODULE
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.vocabulary.techniques import TECHNIQUES
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.run_backend import LocalRunBackend
from gpuanat.tui.screens.compare import CompareScreen
from gpuanat.tui.screens.confirm import ConfirmScreen
from gpuanat.tui.screens.history import HistoryScreen
from gpuanat.tui.screens.modules import COLUMNS as MODULE_COLUMNS
from gpuanat.tui.screens.modules import ModulesScreen
from gpuanat.tui.widgets.techniques_panel import ROWS, TechniquesPanel

TINY = RunConfig(preset="tiny", device="cpu", seq_len=32, samples=32, batch_size=4)


def make_app(db_path, config: RunConfig = TINY) -> GpuAnatApp:
    return GpuAnatApp(config, db_path=db_path, sampler_factory=lambda: open_source(prefer_nvml=False))


async def wait_for(pilot, condition, timeout_s: float = 120.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await pilot.pause(0.1)


async def run_to_completion(app: GpuAnatApp, pilot) -> RunResult:
    previous = app.dashboard.last_result
    await pilot.press("r")
    await wait_for(
        pilot,
        lambda: app.dashboard.run_in_progress is None and app.dashboard.last_result is not previous,
        what="the run to finish",
    )
    return app.dashboard.last_result


async def start_run_until_it_trains(app: GpuAnatApp, pilot) -> None:
    """r, once the machine is probed; returns when the run has made two training steps."""
    await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
    await pilot.press("r")
    await wait_for(
        pilot,
        lambda: (
            app.dashboard.run_in_progress is not None
            and app.dashboard.run_in_progress.last_step is not None
            and app.dashboard.run_in_progress.last_step.step >= 2
        ),
        what="two training steps",
    )


def assert_the_child_gone_and_its_run_stopped(child: psutil.Process, db_path) -> None:
    """After the dashboard left during its one run: the training process is gone and the run recorded as stopped."""
    assert not child.is_running() or child.status() == psutil.STATUS_ZOMBIE
    with HistoryStore(db_path) as store:
        (run,) = store.runs()
    assert run.status == "stopped"


@pytest.mark.asyncio
async def test_keys_change_the_config_the_child_receives(db_path):
    app = make_app(db_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        await pilot.press("g", "p", "p", "plus", "a", "o", "o", "o", "e")
        assert (
            app.dashboard.config.grad_checkpointing,
            app.dashboard.config.precision,
            app.dashboard.config.batch_size,
            app.dashboard.config.grad_accum,
            app.dashboard.config.optim,
            app.dashboard.config.attn,
        ) == (True, "bf16", 8, 2, "sgd", "eager")
        await pilot.press("A")
        assert app.dashboard.config.grad_accum == 1
        # ] and [ step the run's length through the ladder: 32 → 64 → 128 → 64 (issue #48, point 9)
        await pilot.press("right_square_bracket", "right_square_bracket", "left_square_bracket")
        assert app.dashboard.config.samples == 64
        result = await run_to_completion(app, pilot)
    assert result.status == "ok", result.error
    with HistoryStore(db_path) as store:
        run = store.run(result.run_id)
    received = run.environment["config_received"]
    assert (
        received["grad_checkpointing"],
        received["precision"],
        received["batch_size"],
        received["optim"],
        received["attn"],
        received["samples"],
    ) == (True, "bf16", 8, "sgd", "eager", 64)
    assert result.steps == 8  # 64 samples / batch 8
    assert result.bands.optimizer_state_bytes == 0  # SGD keeps no state


@pytest.mark.asyncio
async def test_a_run_from_the_dashboard_samples_through_the_dashboards_sampler(db_path, monkeypatch):
    """Issue #18: the dashboard's own run read NVML and the process tree twice at every tick (the dashboard's
    sampler and the run's, at 0.25 s). The run now listens to the dashboard's: one source opened, the run's samples
    in the history at the dashboard's pace (0.1 s here), and nothing left attached once it ends."""
    sources_opened = []
    started: list[Sampler] = []
    listeners: list = []
    tracked: set[int] = set()
    start, add_listener, remove_listener = Sampler.start, Sampler.add_listener, Sampler.remove_listener
    track, untrack = Sampler.track, Sampler.untrack

    def starting(sampler):
        started.append(sampler)
        start(sampler)

    def adding(sampler, listener):
        listeners.append(listener)
        add_listener(sampler, listener)

    def removing(sampler, listener):
        listeners.remove(listener)
        remove_listener(sampler, listener)

    def tracking(sampler, pid):
        tracked.add(pid)
        track(sampler, pid)

    def untracking(sampler, pid):
        tracked.discard(pid)
        untrack(sampler, pid)

    for name, wrapper in [
        ("start", starting),
        ("add_listener", adding),
        ("remove_listener", removing),
        ("track", tracking),
        ("untrack", untracking),
    ]:
        monkeypatch.setattr(Sampler, name, wrapper)

    def sampler_factory():
        sources_opened.append(threading.current_thread().name)
        return open_source(prefer_nvml=False)

    app = GpuAnatApp(TINY, db_path=db_path, sampler_factory=sampler_factory, sample_interval_s=0.1)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        result = await run_to_completion(app, pilot)
        assert result.status == "ok", result.error
        assert [sampler.running for sampler in started] == [True]  # the dashboard's, still sampling
        assert listeners == []
        assert tracked == set()
    assert sources_opened == [threading.main_thread().name]  # the dashboard's, at mount; none for the run
    with HistoryStore(db_path) as store:
        samples = store.samples(result.run_id)
    assert len(samples) >= 3
    assert max(sample["host"]["rss_bytes"] or 0 for sample in samples) > 100 * 1024 * 1024  # the child, torch loaded
    gaps_s = [later["t_s"] - earlier["t_s"] for earlier, later in itertools.pairwise(samples)]
    assert statistics.median(gaps_s) < 0.2  # a sampler of the run's own would take one every 0.25 s


@pytest.mark.asyncio
async def test_c_cycles_compile_off_regions_model_and_the_panel_says_which(db_path):
    app = make_app(db_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        shown = []
        for _ in range(3):
            await pilot.press("c")
            await pilot.pause()
            console = Console(width=120, record=True, file=io.StringIO())
            console.print(app.query_one(TechniquesPanel).render())
            (line,) = [line for line in console.export_text().splitlines() if " compile " in f" {line} "]
            shown.append((line.split()[-1], app.dashboard.config.compile_regions, app.dashboard.config.compile))
    assert shown == [("regions", True, False), ("model", False, True), ("off", False, False)]


@pytest.mark.asyncio
async def test_without_cuda_the_dashboard_trains_on_the_cpu_with_the_default_allocator(db_path):
    """Started for CUDA with expandable segments (say from the user's PYTORCH_CUDA_ALLOC_CONF) on a machine
    without CUDA, the next run is a CPU run that can start."""
    app = make_app(db_path, TINY.replace(device="cuda", expandable_segments=True))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        await pilot.pause()
        assert (app.dashboard.config.device, app.dashboard.config.expandable_segments) == ("cpu", False)
        console = Console(width=120, record=True, file=io.StringIO())
        console.print(app.query_one(TechniquesPanel).render())
        assert "unavailable" not in console.export_text()


@pytest.mark.asyncio
async def test_every_key_the_techniques_panel_shows_is_an_active_binding(db_path):
    """The panel's keys are the ones the footer, the help panel and the command palette list."""
    app = make_app(db_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        bindings = app.screen.active_bindings
        for field, shown, _label in ROWS:
            for key in shown.split("/"):
                binding = bindings[{"+": "plus", "-": "minus"}.get(key, key)].binding
                assert field in binding.action, (key, binding.action)
        assert bindings["x"].binding.description == "Expandable segments"


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("key", "changed", "reason"),
    [
        ("p", {"precision": "fp16"}, "fp16 needs a CUDA GPU"),
        ("x", {"expandable_segments": True}, "expandable segments are an option of the CUDA allocator"),
    ],
)
async def test_a_cuda_only_technique_on_the_cpu_is_refused_with_the_reason(db_path, key, changed, reason):
    app = make_app(db_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        await pilot.press(key)
        assert {field: getattr(app.dashboard.config, field) for field in changed} == changed
        console = Console(width=120, record=True, file=io.StringIO())
        console.print(app.query_one(TechniquesPanel).render())
        assert f"unavailable: {reason}" in console.export_text().replace("\n", " ")
        await pilot.press("r")
        await pilot.pause(0.2)
        assert app.dashboard.run_in_progress is None
        notifications = [notification.message for notification in app.notices]
        assert any(reason in message for message in notifications)


async def assert_b_lists_memory_by_module(app: GpuAnatApp, pilot, result: RunResult) -> None:
    """`b` lists the modules of `result`'s run, each as the probe measured it (largest first, "(the rest)" last), with
    its total; `b` again closes the view."""
    await pilot.press("b")
    await pilot.pause()
    screen = app.screen
    assert isinstance(screen, ModulesScreen) and f"run {result.run_id} (ok)" in screen.shown.title
    assert result.modules and len(result.modules) > 2
    measured = {row["module"]: row for row in result.modules}
    rows = screen.rows
    assert sorted(row["module"] for row in rows) == sorted(measured)
    for row in rows:
        assert {key: row[key] for key in measured[row["module"]]} == measured[row["module"]]
        assert row["total_bytes"] == sum(row[key] for key, _ in MODULE_COLUMNS)
    named = [row for row in rows if row["module"] not in (MODULES_REST, NO_MODULE)]
    assert named == sorted(named, key=lambda row: -row["total_bytes"]) and rows[len(named) :] == [
        row for row in rows if row["module"] in (MODULES_REST, NO_MODULE)
    ]
    assert result.bands is not None  # the parameters column adds up to the weights band
    assert sum(row["parameters_bytes"] for row in rows) == result.bands.weights_bytes
    shown = screen_text(app)
    assert named[0]["module"].split(".")[-1] in shown and "(the rest)" in shown
    await pilot.press("b")
    await pilot.pause()
    assert not isinstance(app.screen, ModulesScreen)


@pytest.mark.asyncio
async def test_a_run_streams_lands_in_history_and_compares(db_path):
    app = make_app(db_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        first = await run_to_completion(app, pilot)
        assert len(app.dashboard.series["throughput"]) >= 1
        await assert_b_lists_memory_by_module(app, pilot, first)
        await pilot.press("plus")
        second = await run_to_completion(app, pilot)
        assert (first.status, second.status) == ("ok", "ok")
        await pilot.press("h")
        assert isinstance(app.screen, HistoryScreen)
        table = app.screen.query_one("#history-table")
        assert table.row_count == 2
        await assert_b_lists_memory_by_module(app, pilot, second)  # the run under the history's cursor
        assert isinstance(app.screen, HistoryScreen)
        await pilot.press("up", "space", "space", "enter")
        await pilot.pause(0.2)
        assert isinstance(app.screen, CompareScreen)
        comparison = app.screen.comparison
        assert comparison.run_ids == (first.run_id, second.run_id)
        assert dict(comparison.differing)["batch_size"] == (4, 8)
        rows = {row.key: row for row in comparison.metrics}
        assert rows["samples_per_second"].deltas_percent[1] == percent_delta(
            second.samples_per_second, first.samples_per_second
        )
        assert rows["activations_bytes"].values == (
            first.bands.activations_bytes,
            second.bands.activations_bytes,
        )
        # no NVML here: the memory chart can never fill and says why, from the runs' own record (issue #48, 11)
        with HistoryStore(db_path, read_only=True) as store:
            reason = store.run(first.run_id).environment["nvml"]["reason"]
        shown = " ".join(screen_text(app).split())
        assert f"no GPU samples: {reason}" in shown and "waiting for" not in shown, shown
        await pilot.press("escape")
        assert not isinstance(app.screen, CompareScreen)


@pytest.mark.asyncio
async def test_quitting_during_a_run_stops_the_child(db_path):
    app = make_app(db_path, TINY.replace(samples=100_000))
    async with app.run_test(size=(120, 40)) as pilot:
        await start_run_until_it_trains(app, pilot)
        child = psutil.Process(app.dashboard.run_in_progress.pid)
        # memory by module of the run in progress, following it while open: its bands are measured at steps 1-3
        await pilot.press("b")
        assert isinstance(app.screen, ModulesScreen) and "in progress, at step" in app.screen.shown.title

        def step_shown() -> int:  # the view follows the run's measured steps: 1-3, then every 50th
            found = re.search(r"at step (\d+)'s peak", app.screen.shown.title)
            return int(found.group(1)) if found else 0

        first = step_shown()
        # (under load the painter may take steps 3 to 50 in one batch: the view then shows 50)
        await wait_for(pilot, lambda: step_shown() > first, what="a later measured step's modules")
        bands = app.dashboard.run_in_progress.probe_bands
        assert bands is not None and bands.measured_at_step >= step_shown() > first and bands.modules
        assert sorted(row["module"] for row in app.screen.rows) == sorted(row.module for row in bands.modules)
        await pilot.press("b")
        await pilot.press("q")
        assert isinstance(app.screen, ConfirmScreen)
        await pilot.press("y")
        await wait_for(pilot, lambda: not app.is_running, timeout_s=60, what="the app to exit")
    await asyncio.sleep(0)
    assert_the_child_gone_and_its_run_stopped(child, db_path)


@pytest.mark.asyncio
async def test_f_on_a_cpu_run_is_refused_with_the_reason(db_path):
    """fit finds the largest batch that fits GPU memory; on the CPU it would climb to its cap. (The search with
    real trials is tested in tests/test_fit.py.)"""
    app = make_app(db_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        await pilot.press("f")
        await pilot.pause(0.2)
        assert app.dashboard.run_in_progress is None
        errors = [n.message for n in app.notices if n.severity == "error"]
        assert any(
            message.startswith("fit needs a CUDA GPU") and "gpuanat predict --gpu-memory" in message
            for message in errors
        ), errors
    if db_path.exists():
        with HistoryStore(db_path, read_only=True) as store:
            assert store.runs() == []


@pytest.mark.asyncio
async def test_a_run_shows_its_step_time_by_phase_and_t_tunes_from_the_current_set(db_path):
    from gpuanat.tui.widgets.step_strip import StepStrip

    app = make_app(db_path, TINY.replace(samples=64))
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        strip = app.query_one(StepStrip)
        assert not strip.display  # nothing to show before a run
        result = await run_to_completion(app, pilot)
        assert result.status == "ok"
        shown = str(strip.render())
        assert strip.display
        step_ms = round(1000 * result.step_time_breakdown["step_s"])
        assert shown.startswith(f"step {step_ms} ms ") and "fwd" in shown and "bwd" in shown, shown
        # T: a real search of short runs from the current set; s stops it and the best found so far becomes current
        await pilot.press("T")
        await wait_for(
            pilot,
            lambda: any(n.message.startswith("tune 1: ") for n in app.notices),
            what="the first tune trial",
        )
        # its time left: no compiled trial timed yet, so what the eager trials left take at least (issue #48, 5)
        (first,) = [n.message for n in app.notices if n.message.startswith("tune 1: ")]
        assert re.search(r"· estimating… at least \S+ left \(\d+ trials; a trial with compiled regions", first), first
        # the start's profiled steps order the round: what its operations anatomy found is said (issue #54)
        await wait_for(
            pilot,
            lambda: any(n.message.startswith("tune: moves from tune 1: ") for n in app.notices),
            what="the first round's order",
        )
        await pilot.press("s")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen), what="the stop question")
        await pilot.press("y")
        await wait_for(pilot, lambda: app.dashboard.run_in_progress is None, what="the search to stop")
        finished = [n.message for n in app.notices if n.message.startswith("tune: ")]
        assert finished and "It is the current set now" in finished[-1], finished
    with HistoryStore(db_path, read_only=True) as store:
        trials = [run for run in store.runs() if (run.name or "").startswith("tune ")]
    ok = [run for run in trials if run.status == "ok"]
    assert ok and ok[0].name.startswith("tune 1: ")  # the strong start trained
    assert len({run.search for run in trials}) == 1 and trials[0].search.kind == "tune"  # one search, in the history
    best = max(ok, key=lambda run: run.result.steady_samples_per_second or run.result.samples_per_second)
    lasting = ("samples", "epochs", "max_steps")
    assert {key: value for key, value in app.dashboard.config.to_json().items() if key not in lasting} == {
        key: value for key, value in best.config.items() if key not in lasting
    }
    assert app.dashboard.config.samples == 64  # the workload's length stays the user's, not the trial's


EVERY_FIELD = frozenset(technique.field for technique in TECHNIQUES)
NO_CUDA = Capabilities(torch_version="2.13.0+cpu", cuda_available=False, reason="a CPU-only build")
WITH_CUDA = Capabilities(
    torch_version="2.11.0",
    cuda_available=True,
    cuda_device_name="NVIDIA H100",
    cuda_compute_capability=(9, 0),
    cuda_total_memory_bytes=80 * 1024**3,
)


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("capabilities", "given", "expected", "note"),
    [
        (
            NO_CUDA,
            {},
            {"device": "cpu", "preset": "tiny", "seq_len": 64, "samples": 2048},
            "training the tiny preset, seq 64, 2048 samples",
        ),
        (
            NO_CUDA,
            {"seq_len": 128},
            {"device": "cpu", "preset": "tiny", "seq_len": 128, "samples": 2048},
            "training the tiny preset, seq 128, 2048 samples",
        ),
        (
            NO_CUDA,
            {"preset": "bert-base"},
            {"device": "cpu", "preset": "bert-base", "seq_len": 512, "samples": 512},
            None,
        ),
        (WITH_CUDA, {}, {"device": "cuda", "preset": "bert-large", "seq_len": 512, "samples": 512}, None),
    ],
)
async def test_without_cuda_the_workload_left_to_the_defaults_is_the_cpus(db_path, capabilities, given, expected, note):
    """As `gpuanat` started with these flags: what the user did not give is the capability probe's to settle."""
    app = GpuAnatApp(
        RunConfig(**given),
        db_path=db_path,
        sampler_factory=lambda: open_source(prefer_nvml=False),
        backend=LocalRunBackend(db_path, capabilities_probe=lambda: capabilities),
        untouched_fields=EVERY_FIELD - set(given),
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        await pilot.pause()
        assert {field: getattr(app.dashboard.config, field) for field in expected} == expected
        messages = [n.message for n in app.notices]
        if note is None:
            assert not any("preset" in message for message in messages), messages
        else:
            (message,) = [message for message in messages if note in message]
            assert message.startswith("No CUDA here (a CPU-only build); runs train on the CPU.")
            assert message.endswith("([ and ]: the run's length; M: the model).")
        console = Console(width=120, record=True, file=io.StringIO())
        console.print(app.query_one(TechniquesPanel).render())
        shown = console.export_text()
        assert expected["preset"] in shown


@pytest.mark.asyncio
async def test_a_stop_question_goes_away_when_its_run_ends(db_path):
    """Issue #17, point 5: a stop dialog must not outlive its run (y would then do nothing)."""
    app = make_app(db_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        await pilot.press("r")
        await wait_for(
            pilot,
            lambda: app.dashboard.run_in_progress is not None and app.dashboard.run_in_progress.run_id is not None,
            what="the run to start",
        )
        await pilot.press("s")
        assert isinstance(app.screen, ConfirmScreen)
        await wait_for(pilot, lambda: app.dashboard.run_in_progress is None, what="the run to finish on its own")
        await pilot.pause()
        assert not isinstance(app.screen, ConfirmScreen)
        assert app.dashboard.last_result.status == "ok"


@pytest.mark.asyncio
async def test_without_nvml_the_charts_show_the_runs_host_memory_and_cpu(db_path):
    """Issue #17, point 3: no NVML (this machine) — the charts chart what is measurable, a run's RSS and CPU,
    instead of waiting forever for GPU samples, and say once why."""
    from gpuanat.tui.widgets.line_chart import LineChart

    app = GpuAnatApp(
        TINY, db_path=db_path, sampler_factory=lambda: open_source(prefer_nvml=False), sample_interval_s=0.1
    )
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        memory_chart = app.query_one("#memory-chart", LineChart)
        assert memory_chart.title == "Host memory of the run (RSS)"
        assert app.query_one("#util-chart", LineChart).title == "Host CPU of the run (% of one core)"
        assert any("No GPU charts" in notification.message for notification in app.notices)
        result = await run_to_completion(app, pilot)
        assert result.status == "ok"
        assert (
            len(app.dashboard.series["host_rss"]) > 0 and app.dashboard.series["host_rss"].max > 100 * 1024 * 1024
        )  # torch alone
        assert len(app.dashboard.series["host_cpu"]) > 0


@pytest.mark.asyncio
async def test_a_lora_run_shows_its_trainable_weights_and_its_logits_in_the_memory_bar(db_path):
    """llama-tiny with LoRA on the CPU, started from the dashboard: the weights row gains "of which trainable" (the
    fp32 adapters, measured from the run's counts and predicted from the adapter shapes, equal) and the logits
    (4 × 32 × 32,000 fp32) show as a band of their own."""
    from gpuanat.core.memory.shapes import lora_shapes
    from gpuanat.core.vocabulary.presets import PRESETS
    from gpuanat.tui.widgets.memory_bar import MemoryBar

    config = RunConfig(preset="llama-tiny", device="cpu", seq_len=32, samples=32, batch_size=4, lora=8)
    app = make_app(db_path, config)
    async with app.run_test(size=(120, 50)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        bar = app.query_one(MemoryBar)
        adapters = 4 * lora_shapes(PRESETS["llama-tiny"], config).params
        assert bar.trainable == (None, adapters)  # before any run: the prediction only
        result = await run_to_completion(app, pilot)
        assert result.status == "ok" and result.trainable_params < result.params
        assert bar.trainable == (adapters, adapters) and adapters == 4 * result.trainable_params
        assert bar.logits[0] == result.logits_bytes == 4 * 32 * 32_000 * 4
        rows = [bar.render_line(y).text for y in range(bar.size.height)]
        assert any("of which trainable" in row for row in rows) and any("of which logits" in row for row in rows)


@pytest.mark.asyncio
async def test_every_chart_of_a_run_shares_one_time_axis(db_path):
    """The throughput comes on the run's own clock (its steps' elapsed seconds); the charts put it on the sampler's,
    so the memory, CPU and throughput of a run read against one time axis (issue #17: 49 s above 12 s)."""
    from gpuanat.tui.widgets.line_chart import LineChart

    app = make_app(db_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        await run_to_completion(app, pilot)
        await pilot.pause(0.3)
        charts = [chart for chart in app.query(LineChart) if chart.shares_time_axis]  # the loss's axis is steps
        assert len(charts) == 3 and len({chart.window for chart in charts}) == 1
        start_s, end_s = charts[0].window
        throughput, rss = app.dashboard.series["throughput"], app.dashboard.series["host_rss"]
        assert throughput and rss
        # the run's steps fall inside the span its process was sampled in, not at 0 s of the chart
        assert start_s <= rss.first_t_s <= throughput.first_t_s <= throughput.last_t_s <= end_s
        assert throughput.first_t_s > start_s
        # the same end label on every x-axis: read between two repaints (the idle sampler moves the window on every
        # second, and a chart repainted after a sample came reads one second later than one repainted before)
        for _ in range(20):
            axes = {chart.render_line(chart.size.height - 1).text.split()[-1] for chart in charts}
            if len(axes) == 1:
                break
            await pilot.pause(0.05)
        assert len(axes) == 1, axes
        # the model FLOPs the run achieved at the plotted rate, live (no MFU on a CPU: no peak known)
        title = app.query_one("#throughput-chart", LineChart).title
        assert "FLOP/s" in title and "MFU" not in title
