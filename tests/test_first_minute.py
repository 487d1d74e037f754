"""What a person meets in the first minute on a GPU box (issue #32), each at the size where it happened: the real
dashboard headless (Pilot) on the recorded H100 environment."""

from __future__ import annotations

import json

import pytest
from test_app_snapshots import fill_history, make_app
from textual.widgets._toast import Toast

from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import RunConfig
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.vocabulary.validation import machine_unsupported_reasons
from gpuanat.tui.screens.compare import CompareScreen
from gpuanat.tui.screens.history import HistoryScreen
from gpuanat.tui.screens.keys import KeysScreen


async def ready(app, pilot) -> None:
    while app.dashboard.capabilities is None:
        await pilot.pause()


@pytest.mark.asyncio
async def test_enter_in_the_history_without_a_selection_compares_the_last_two_runs(tmp_path):
    fill_history(tmp_path / "h.sqlite")
    app = make_app(tmp_path / "h.sqlite", RunConfig())
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await pilot.press("h")
        assert isinstance(app.screen, HistoryScreen)
        last_two = sorted(app.screen.shown_run_ids)[-2:]
        await pilot.press("enter")
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        assert app.screen.comparison.run_ids == tuple(last_two)  # the older is the baseline


@pytest.mark.asyncio
async def test_one_selected_run_is_compared_with_the_latest_other(tmp_path):
    fill_history(tmp_path / "h.sqlite")
    app = make_app(tmp_path / "h.sqlite", RunConfig())
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        await pilot.press("h")
        await pilot.press("up")  # the cursor starts on the latest run: one before it
        selected = app.screen.cursor_run_id
        latest = max(app.screen.shown_run_ids)
        assert selected != latest
        await pilot.press("space", "enter")
        await pilot.pause()
        assert isinstance(app.screen, CompareScreen)
        assert app.screen.comparison.run_ids == (selected, latest)


@pytest.mark.asyncio
async def test_a_notification_does_not_cover_the_key_page(tmp_path):
    app = make_app(tmp_path / "h.sqlite", RunConfig())
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await ready(app, pilot)
        app.notify("a long notification that would cover the lines of the key page", timeout=30)
        await pilot.pause(0.2)
        assert [toast.display for toast in app.screen.query(Toast)] == [True]  # on the dashboard it shows
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, KeysScreen)
        assert app.screen.query(Toast) and not any(toast.display for toast in app.screen.query(Toast))
        await pilot.press("escape")
        await pilot.pause(0.2)
        assert [toast.display for toast in app.screen.query(Toast)] == [True]  # still due: shown again


def screen_text(app) -> str:
    """The screen as a person reads it: the SVG screenshot's text, row by row."""
    import html
    import re

    svg = app.export_screenshot()
    rows: dict[float, list[tuple[float, str]]] = {}
    for match in re.finditer(r'<text class="[^"]*" x="([\d.]+)" y="([\d.]+)"[^>]*>([^<]*)</text>', svg):
        rows.setdefault(float(match.group(2)), []).append((float(match.group(1)), html.unescape(match.group(3))))
    return "\n".join(
        "".join(text for _, text in sorted(parts)).replace("\xa0", " ") for _, parts in sorted(rows.items())
    )


@pytest.mark.asyncio
async def test_at_80x24_a_technique_this_machine_cannot_run_says_why_on_screen(db_path):
    from test_tui import TINY
    from test_tui import make_app as cpu_app  # the real capability probe: this machine has no CUDA

    app = cpu_app(db_path, TINY)
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        while app.dashboard.capabilities is None:
            await pilot.pause()
        await pilot.press("t")  # tf32: CUDA only
        await pilot.pause()
        assert app.screen.has_class("-compact")
        text = screen_text(app)
        reason = machine_unsupported_reasons(app.dashboard.config, app.dashboard.capabilities)[0][1]
        assert "tf32" in reason.lower() or "cuda" in reason.lower()
        assert "1 unavailable (red): u says why" in text, text
        await pilot.press("u")  # the reason without a mouse (issue #48, point 10): a tooltip needs one
        await pilot.pause()
        assert app.notices[-1].message == f"--tf32: {reason}"
        shown = f"--tf32: {reason}"[:28]  # the toast's first row, on screen
        for _ in range(50):
            if shown in " ".join(screen_text(app).split()):
                break
            await pilot.pause(0.05)
        assert shown in " ".join(screen_text(app).split()), screen_text(app)


@pytest.mark.asyncio
async def test_at_80x24_every_technique_row_stays_and_the_top_line_ends_on_a_word(db_path):
    """Issue #48, point 10: three techniques this CPU cannot run pushed the batch and accumulation rows out of the
    panel, and the top line was cut mid-word ("NVML not found: no")."""
    from test_tui import TINY
    from test_tui import make_app as cpu_app

    from gpuanat.tui.widgets.techniques_panel import ROWS

    app = cpu_app(db_path, TINY)
    async with app.run_test(size=(80, 24)) as pilot:
        while app.dashboard.capabilities is None:
            await pilot.pause()
        await pilot.press("p", "t", "x")  # fp16, tf32, expandable segments: CUDA only
        await pilot.pause()
        rows = screen_text(app).splitlines()
        reasons = machine_unsupported_reasons(app.dashboard.config, app.dashboard.capabilities)
        assert len(reasons) == 3
        assert any(f"{len(reasons)} unavailable (red): u says why" in row for row in rows), rows
        end = next(index for index, row in enumerate(rows) if row.startswith("measured"))  # the memory bar's
        panel = [row[:38] for row in rows[1:end] if row.strip()]  # the techniques panel's column above it
        (folded,) = [row for row in panel if row.startswith("at defaults:")] or [""]
        folded_keys = folded.removeprefix("at defaults:").split("(")[0]  # by their keys where labels do not fit
        for _, key, label in ROWS:
            assert any(label in row for row in panel) or key in folded_keys, (label, panel)
        top = rows[0].rstrip()
        # whole, not cut mid-word; the sampler's own CPU may follow once it has been measured (a slow machine)
        assert len(top) <= 80 and "no NVML: host metrics only" in top, top
        assert top.endswith("host metrics only") or top.endswith("% CPU"), top
        await pilot.press("u")
        await pilot.pause()
        assert app.notices[-1].message.splitlines() == [f"{flag}: {reason}" for flag, reason in reasons]


@pytest.mark.asyncio
async def test_at_120x40_the_step_strip_and_the_chart_legends_end_on_whole_words(tmp_path):
    """The recorded bert-large bf16 batch-32 run on the H100, 4 s into training: the step strip's fix is longer than
    the line, and the throughput chart's title with its TFLOP/s and MFU longer than the chart."""
    from test_app_snapshots import BS32_STEPS, BS32_TRACE, replay_run
    from test_app_snapshots import make_app as h100_app

    from gpuanat.tui.widgets.step_strip import StepStrip

    meta = json.loads(BS32_STEPS.read_text().splitlines()[0])
    app = h100_app(tmp_path / "h.sqlite", RunConfig.from_json(meta["config"]), trace=BS32_TRACE)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(app, pilot)
        replay_run(app, until_elapsed_s=4.0, steps_path=BS32_STEPS)
        app.dashboard.paint()
        await pilot.pause()
        strip_widget = app.query_one(StepStrip)
        strip = strip_widget.render_line(0).text  # the row it paints, as wide as its region
        fix = str(strip_widget.render()).split("gpu-bound: ", 1)[1]  # the whole fix, unfitted
        shown = strip.split("gpu-bound: ", 1)[1].rstrip()
        assert shown.endswith("…") and fix.startswith(shown[:-1]) and fix[len(shown) - 1] == " ", (shown, fix)
        for chart_id in ("memory-chart", "util-chart", "throughput-chart"):
            chart = app.query_one(f"#{chart_id}")
            title_row = chart.render_line(0).text
            names = list(chart._series)
            assert all(f"█ {name}" in title_row for name in names), (title_row, names)


@pytest.mark.asyncio
async def test_while_a_run_starts_the_screen_says_where_it_is(db_path):
    """A real tiny run on the CPU from the dashboard: the status line names the start-up's part under way, and the
    log gets a line for each part as it passes, with the names the result's wall_breakdown_s uses."""
    from test_tui import TINY, run_to_completion
    from test_tui import make_app as cpu_app

    from gpuanat.core.measure.startup import FIRST_STEP_PARTS
    from gpuanat.tui.widgets.status_line import StatusLine

    app = cpu_app(db_path, TINY)
    statuses: list[str] = []
    async with app.run_test(size=(120, 40)) as pilot:
        while app.dashboard.capabilities is None:
            await pilot.pause()
        original = app.query_one(StatusLine).show

        def recording_show(*, run_state, **kwargs):  # what the status line is told, paint by paint
            statuses.append(run_state)
            return original(run_state=run_state, **kwargs)

        app.query_one(StatusLine).show = recording_show
        result = await run_to_completion(app, pilot)
        log = [str(line.text) for line in app.query_one("#log").lines]
    starting = [status for status in statuses if "starting" in status]
    assert starting and all(
        status.startswith(("run: starting", f"run {result.run_id}: starting")) for status in starting
    )
    assert any("imports" in status and status.endswith("s…") for status in starting), starting[-3:]
    noted = [line.removeprefix("gpuanat · start-up: ") for line in log if line.startswith("gpuanat · start-up: ")]
    parts = [line.rsplit(" ", 2)[0] for line in noted]
    assert parts == [part for part in FIRST_STEP_PARTS if part in result.wall_breakdown_s][: len(parts)]
    assert {"imports", "model", "first step"} <= set(parts), noted
    for line in noted:  # each with the seconds the result records for it
        part, seconds = line.rsplit(" ", 2)[0], float(line.rsplit(" ", 2)[1])
        assert seconds == pytest.approx(result.wall_breakdown_s[part], abs=0.2)


async def history_hint(db, typed_filter: str | None = None) -> str:
    """The history pane's hint line, its filter typed first when given (`/`, the text, enter)."""
    app = make_app(db, RunConfig())
    async with app.run_test(size=(160, 40)) as pilot:
        await ready(app, pilot)
        await pilot.press("h")
        assert isinstance(app.screen, HistoryScreen)
        if typed_filter is not None:
            await pilot.press("slash", *typed_filter, "enter")
            assert len(app.screen.shown_run_ids) == 1
        return str(app.screen.query_one("#history-hint").render())


@pytest.mark.asyncio
async def test_the_history_counts_one_run_in_the_singular(tmp_path):
    """Issue #48: "1 runs". One run in the history; then one of the H100 sweep's eleven, shown by a filter."""
    with HistoryStore(tmp_path / "one.sqlite") as store:
        run_id = store.create_run(RunConfig(preset="tiny", device="cpu").to_json(), name="only")
        store.update_result(run_id, RunResult.from_json({"status": "ok", "run_id": run_id}), status="ok")
    assert (await history_hint(tmp_path / "one.sqlite")).startswith("History — 1 run · ")
    fill_history(tmp_path / "h.sqlite")
    with HistoryStore(tmp_path / "h.sqlite", read_only=True) as store:
        names = [run.name for run in store.runs()]
    unique = next(name for name in names if sum(name in other for other in names) == 1)
    assert (await history_hint(tmp_path / "h.sqlite", unique)).startswith("History — 1 of 11 runs · ")
