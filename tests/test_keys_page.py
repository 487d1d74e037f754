"""`?` opens gpuanat's own key page and `q`/`ctrl+c` quit, at any width (issue #17, points 2 and 9).

The dashboard runs headless on the H100 recordings (tests/test_app_snapshots.py's environment: no subprocess)."""

from __future__ import annotations

import pytest
from test_app_snapshots import h100_environment, make_app

from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.techniques import TECHNIQUES_BY_FIELD
from gpuanat.tui.screens.keys import KeysScreen, key_rows


def h100_app(tmp_path):
    """The dashboard on the H100 recordings, configured as the recorded run."""
    meta, _, _ = h100_environment()
    return make_app(tmp_path / "h.sqlite", RunConfig.from_json(meta["config"]))


async def until_probed(app, pilot) -> None:
    """Wait for the dashboard's capability probe (injected: it answers at once)."""
    while app.dashboard.capabilities is None:
        await pilot.pause()


@pytest.mark.asyncio
@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
async def test_question_mark_lists_every_key_grouped_with_what_each_technique_does(tmp_path, size):
    app = h100_app(tmp_path)
    async with app.run_test(size=size) as pilot:
        await until_probed(app, pilot)
        footer_keys = [binding.key for binding in app.BINDINGS if binding.show][:2]
        assert footer_keys == ["question_mark", "q"]  # first in the footer: shown at 80 columns
        await pilot.press("question_mark")
        assert isinstance(app.screen, KeysScreen)
        rows = app.screen.rows  # the dashboard's keys, read before the page covered it
        techniques = dict(rows["Techniques of the next run"])
        assert techniques["g"] == f"Checkpointing — {TECHNIQUES_BY_FIELD['grad_checkpointing'].help}"
        assert "L" in techniques and "G" in techniques and "D" in techniques and "M" in techniques
        views = {what: keys.split() for keys, what in rows["Views"]}
        assert views["Help"] == ["?"] and {"q", "^c"} <= set(views["Quit"])
        assert views["Memory by module"] == ["b"]
        assert not any("Scroll" in what for group in rows.values() for _, what in group)
        assert dict(rows["Runs"])["r"] == "Run"
        await pilot.press("question_mark")
        assert not isinstance(app.screen, KeysScreen)


@pytest.mark.asyncio
async def test_the_key_page_says_how_to_remap_without_pointing_at_docs_a_pip_install_lacks(tmp_path):
    """Issue #48, point 12: the page pointed at docs/dashboard.md, which a pip install does not have."""
    from test_first_minute import screen_text

    app = h100_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await until_probed(app, pilot)
        await pilot.press("question_mark")
        await pilot.press("end")  # the page scrolls: its last lines
        await pilot.pause()
        shown = " ".join(screen_text(app).split())
    assert "docs/" not in shown
    assert "Keys can be remapped in $XDG_CONFIG_HOME/gpuanat/config.toml" in shown, shown
    assert 'run = "f5"' in shown and "samples_up/samples_down" in shown, shown


@pytest.mark.asyncio
async def test_keys_the_history_filter_types_are_not_advertised_while_it_has_the_focus(tmp_path):
    """Issue #48, point 12: the footer showed `+ Batch+ - Batch-` while typing in the history's filter, where + and -
    are typed into the filter (Textual leaves out typed letters, not the keys it names by words)."""
    from textual.widgets import Input

    def advertised() -> set[str]:  # what the footer draws from
        return {key for key, active in app.screen.active_bindings.items() if active.binding.show}

    app = h100_app(tmp_path)
    async with app.run_test(size=(160, 40)) as pilot:
        await until_probed(app, pilot)
        batch_size = app.dashboard.config.batch_size
        await pilot.press("h")
        await pilot.pause()
        assert {"plus", "minus", "slash", "question_mark"} <= advertised()
        await pilot.press("slash", "b", "plus", "minus")
        await pilot.pause()
        assert isinstance(app.focused, Input) and app.focused.value == "b+-"
        assert not advertised() & {"plus", "minus", "slash", "question_mark", "right_square_bracket", "r"}, advertised()
        assert "escape" in advertised() and app.dashboard.config.batch_size == batch_size
        await pilot.press("escape")  # the filter ends: the keys are the dashboard's again
        await pilot.pause()
        assert {"plus", "minus", "slash", "question_mark"} <= advertised()


@pytest.mark.asyncio
async def test_a_remapped_key_shows_as_remapped(tmp_path):
    app = h100_app(tmp_path)
    app.set_keymap({"grad_checkpointing": "k"})
    async with app.run_test(size=(120, 40)) as pilot:
        await until_probed(app, pilot)
        techniques = dict(key_rows(app)["Techniques of the next run"])
        assert "k" in techniques and "g" not in techniques


@pytest.mark.asyncio
async def test_ctrl_c_quits_like_q_when_no_run_is_live(tmp_path):
    app = h100_app(tmp_path)
    async with app.run_test(size=(80, 24)) as pilot:
        await until_probed(app, pilot)
        await pilot.press("ctrl+c")
        await pilot.pause()
    assert app.return_code == 0 and not app.is_running


def test_the_status_line_says_step_elapsed_and_eta_first():
    from gpuanat.core.vocabulary.protocol import Step
    from gpuanat.tui.launch_painter import run_progress

    step = Step(step=9, samples=36, tokens=18_432, step_time_s=1.0, elapsed_s=12.0)
    assert run_progress(3, step, 64) == "run 3: step 9/64 · 12s · ETA 1m13s"  # 55 steps at 12/9 s each
    assert run_progress(3, step, None) == "run 3: step 9 · 12s"  # no total known: no ETA
    long = Step(step=100, samples=400, tokens=1, step_time_s=1.0, elapsed_s=3725.0)
    assert run_progress(1, long, 100) == "run 1: step 100/100 · 1h02m"


def cpu_app(tmp_path, config: RunConfig):
    """The dashboard on a CPU box: capabilities without CUDA or bitsandbytes, no NVML (the real host source)."""
    from gpuanat.core.measure.process_tree import HostOnlySource
    from gpuanat.core.measure.samples import NvmlStatus
    from gpuanat.core.vocabulary.config import Capabilities
    from gpuanat.tui.app import GpuAnatApp
    from gpuanat.tui.run_backend import LocalRunBackend

    cpu = Capabilities(
        torch_version="2.13.0+cpu",
        cuda_available=False,
        reason="CPU-only build",
        bitsandbytes_error="ModuleNotFoundError: No module named 'bitsandbytes'",
    )
    no_nvml = NvmlStatus(
        available=False, reason="no NVIDIA driver", driver_version=None, cuda_driver_version=None, gpu_names=()
    )
    return GpuAnatApp(
        config,
        db_path=tmp_path / "h.sqlite",
        sampler_factory=lambda: (HostOnlySource(), no_nvml),
        backend=LocalRunBackend(tmp_path / "h.sqlite", capabilities_probe=lambda: cpu),
        sample_interval_s=None,
        paint_interval_s=3600,
        clock=lambda: 1_000.0,
    )


def panel_text(app) -> str:
    import io

    from rich.console import Console

    from gpuanat.tui.widgets.techniques_panel import TechniquesPanel

    console = Console(width=80, record=True, file=io.StringIO())
    console.print(app.query_one(TechniquesPanel).render())
    return console.export_text()


@pytest.mark.asyncio
async def test_every_unavailable_value_is_red_with_its_reason(tmp_path):
    """On a CPU box, fp16, tf32, expandable segments and 8-bit Adam are each marked, and the panel says how many."""
    from gpuanat.tui.widgets.techniques_panel import TechniquesPanel

    config = RunConfig(
        device="cpu", preset="tiny", precision="fp16", tf32=True, expandable_segments=True, optim="adamw_bnb_8bit"
    )
    app = cpu_app(tmp_path, config)
    async with app.run_test(size=(120, 40)) as pilot:
        await until_probed(app, pilot)
        await pilot.pause()
        text = panel_text(app)
        assert "unavailable: fp16 needs a CUDA GPU" in text and "+3 more" in text
        tooltip = app.query_one(TechniquesPanel).tooltip.plain  # Text: its brackets are not markup (issue #28)
        assert tooltip.count("\n") == 3 and "bitsandbytes" in tooltip and "pip install 'gpuanat[bnb]'" in tooltip


@pytest.mark.asyncio
async def test_on_the_cpu_only_the_exact_bands_are_predicted(tmp_path):
    """Issue #17, point 7: the bytes model is of CUDA memory; on the CPU the dashboard predicts weights, gradients
    and optimizer state (exact) and no activations, workspaces or peak."""
    from gpuanat.core.memory.predict import estimate_memory
    from gpuanat.core.store.report import format_bytes
    from gpuanat.tui.widgets.memory_bar import MemoryBar

    config = RunConfig(device="cpu", preset="tiny", seq_len=32, samples=32)
    app = cpu_app(tmp_path, config)
    async with app.run_test(size=(120, 40)) as pilot:
        await until_probed(app, pilot)
        await pilot.pause()
        estimate = estimate_memory(config)
        state = estimate.weights_bytes + estimate.gradients_bytes + estimate.optimizer_state_bytes
        assert f"predicted weights+grads+optimizer: {format_bytes(state)}" in panel_text(app)
        predicted = app.query_one(MemoryBar)._predicted
        assert predicted["activations_bytes"] is None and predicted["weights_bytes"] == estimate.weights_bytes


@pytest.mark.asyncio
async def test_a_resize_under_the_history_pane_lays_out_the_dashboard(tmp_path):
    """Issue #17, point 5: the compact class goes to the dashboard's screen, not to the pane on top of it."""
    app = h100_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await until_probed(app, pilot)
        await pilot.press("h")
        await pilot.pause()
        history = app.screen
        assert history is not app.dashboard
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert app.dashboard.has_class("-compact") and not history.has_class("-compact")
        app.dashboard.paint()  # the paint tick goes on under the pane
        await pilot.press("escape")
        await pilot.pause()
        assert app.screen is app.dashboard and app.dashboard.compact


@pytest.mark.asyncio
async def test_the_command_palette_says_what_each_key_does_not_its_raw_action(tmp_path):
    app = h100_app(tmp_path)
    async with app.run_test(size=(120, 40)) as pilot:
        await until_probed(app, pilot)
        commands = {command.title: command.help for command in app.get_system_commands(app.screen)}
    assert commands["Accum+ (a)"] == f"gpuanat · {TECHNIQUES_BY_FIELD['grad_accum'].help}"
    assert commands["Run (r)"] == "gpuanat · run"
    raw = ("toggle_technique(", "step(", "cycle_")
    assert not any(word in (help_text or "") for help_text in commands.values() for word in raw)


@pytest.mark.parametrize("size", [(80, 24), (120, 40)])
def test_dashboard_without_nvml(snap_compare, tmp_path, size):
    """Issue #17: a CPU box without NVML at both sizes — the host charts, the banner, the keys."""
    app = cpu_app(tmp_path, RunConfig(device="cpu", preset="tiny", seq_len=64, samples=64))

    async def run_before(pilot) -> None:
        await until_probed(app, pilot)
        await pilot.pause()

    assert snap_compare(app, terminal_size=size, run_before=run_before)


@pytest.mark.asyncio
async def test_the_history_opens_on_the_newest_run_in_view_at_80x24(tmp_path):
    from test_app_snapshots import fill_history
    from textual.widgets import DataTable

    from gpuanat.core.store.history import HistoryStore

    for _ in range(4):  # 44 runs: more than 80×24 shows
        fill_history(tmp_path / "h.sqlite")
    with HistoryStore(tmp_path / "h.sqlite", read_only=True) as store:
        assert len(store.runs()) == 44
    app = make_app(tmp_path / "h.sqlite", RunConfig())
    async with app.run_test(size=(80, 24)) as pilot:
        await until_probed(app, pilot)
        await pilot.press("h")
        await pilot.pause()
        await pilot.pause()
        table = app.screen.query_one(DataTable)
        newest = table.row_count - 1
        assert table.cursor_row == newest and newest > 0
        visible_rows = table.scrollable_content_region.height - 1  # the header row
        assert table.scroll_offset.y <= newest < table.scroll_offset.y + visible_rows


@pytest.mark.asyncio
async def test_w_holds_the_model_in_bf16_and_back(tmp_path):
    """`W` (--weights-dtype, --no-autocast): fp32 → bf16, the precision following (a bf16 model computes in bf16),
    LoRA off → pure bf16 → fp32; the panel shows the row while it is not the default."""
    app = cpu_app(tmp_path, RunConfig(device="cpu", preset="llama-tiny", lora=8))
    async with app.run_test(size=(120, 40)) as pilot:
        await until_probed(app, pilot)
        assert "W weights" not in panel_text(app)
        await pilot.press("W")
        await pilot.pause()
        assert (app.dashboard.config.weights_dtype, app.dashboard.config.precision, app.dashboard.config.lora) == (
            "bf16",
            "bf16",
            0,
        )
        assert "W weights       bf16" in panel_text(app)
        await pilot.press("W")  # pure bf16: the same model, no autocast
        await pilot.pause()
        assert app.dashboard.config.weights_dtype == "bf16" and not app.dashboard.config.autocast
        await pilot.press("W")
        await pilot.pause()
        assert app.dashboard.config.weights_dtype == "fp32" and "W weights" not in panel_text(app)
