"""The operations anatomy in the real dashboard (headless, Pilot): `O` asks the next runs to profile their operations
and puts the panel in the charts' place; a real tiny-BERT run on the CPU fills it; `O` again turns it off."""

from __future__ import annotations

import pytest
from test_tui import make_app, run_to_completion, wait_for

from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.tui.widgets.operations_panel import OperationsPanel

PROFILED = RunConfig(preset="tiny", device="cpu", seq_len=32, samples=48, batch_size=4)


def panel_lines(app, width: int) -> list[str]:
    return app.query_one(OperationsPanel).render_text(width).plain.splitlines()


@pytest.mark.asyncio
async def test_o_profiles_the_next_run_and_shows_its_operations_beside_the_paper(db_path):
    app = make_app(db_path, PROFILED)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.dashboard.capabilities is not None, what="the capability probe")
        panel = app.query_one(OperationsPanel)
        assert not panel.display
        await pilot.press("O")
        assert app.screen.has_class("-operations") and panel.display
        assert not app.query_one("#memory-chart").display  # the panel takes the charts' place
        assert "The next run profiles 3 steps after warm-up" in " ".join(panel_lines(app, 76))
        result = await run_to_completion(app, pilot)
        anatomy = result.operations_anatomy
        assert anatomy["profiled_steps"] == 3
        lines = panel_lines(app, 76)
        assert lines[0].startswith(
            f"Operations of run {result.run_id}: 3 profiled steps from step {anatomy['first_step']}"
        )
        rows = {line.split()[0]: line for line in lines[2:8]}
        assert set(rows) == {"contractions", "normalizations", "element-wise", "optimizer", "memory", "other"}
        assert "61.0%" in rows["contractions"] and "99.80%" in rows["contractions"]  # the paper's, beside
        measured = f"{100 * anatomy['contractions']['time_share']:.1f}%"
        assert measured in rows["contractions"]
        await pilot.press("O")  # off: the charts are back, the next run is not profiled
        assert not app.screen.has_class("-operations") and app.query_one("#memory-chart").display
        second = await run_to_completion(app, pilot)
        assert second.operations_anatomy is None
        assert app.dashboard.operations_shown[1] == result.run_id  # the last profiled run's stays at hand


@pytest.mark.asyncio
async def test_the_panel_fits_a_narrow_terminal_without_cutting_a_row(tmp_path):
    app = h100_operations_app(tmp_path / "h.sqlite")
    async with app.run_test(size=(80, 24)) as pilot:
        await press_o(app, pilot)
        panel = app.query_one(OperationsPanel)
        width = panel.size.width - 2
        table = panel_lines(app, width)[1:8]  # after the heading (wrapped on screen, not cut)
        assert table[0].startswith("kind")
        rows = [
            line
            for line in table
            if line.split()
            and line.split()[0] in ("contractions", "normalizations", "element-wise", "optimizer", "memory", "other")
        ]
        assert len(rows) == 6 and all(len(line) <= width for line in table), (width, table)
        assert all("│" in row for row in rows)  # the paper's time share kept, after the measured shares
        assert not any("TFLOP/s" in line for line in table)  # the narrow layout drops TFLOP/s first


def h100_operations_app(db_path):
    """The dashboard on the recorded H100 (NVML trace, capabilities) set to bert-large bf16, with `O` on and the
    operations of the H100 bert-large bf16 profile (tests/data/operations/h100_kernels.json) in its panel."""
    from test_app_snapshots import make_app as h100_app
    from test_operations_h100 import anatomy_of

    app = h100_app(db_path, RunConfig(precision="bf16"))
    app.dashboard.operations_shown = (anatomy_of("bert-bf16"), None)
    return app


async def press_o(app, pilot) -> None:
    while app.dashboard.capabilities is None:
        await pilot.pause()
    await pilot.press("O")
    await pilot.pause()


@pytest.mark.parametrize("size", [(120, 40), (80, 24)], ids=["120x40", "80x24"])
def test_the_operations_panel_of_an_h100_profile(snap_compare, tmp_path, size):
    app = h100_operations_app(tmp_path / "h.sqlite")
    assert snap_compare(app, terminal_size=size, run_before=lambda pilot: press_o(app, pilot))
