"""Issue #28, the dashboards' half: every view fed strings from outside shows them as data. The real apps run
headless (Pilot); each check takes what a full repaint would send to the terminal (the compositor's own output)
and finds no control, escape, bidi character or markup effect in it, and the hostile text shown escaped and
literal. The process is real where one can be (a process named by prctl, watched through the real sampler);
the GPU side is the H100 recording with a hostile process added to it. Two snapshots fix the look."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from hostile import EVIL_NAME, LONG_NAME, MARKUP_PAYLOADS, TITLE, hostile_process, raw_in_terminal_output, raw_in_text
from textual.app import App, ComposeResult
from watch_replay import FIRST_T_S, NVML, PID, STEPS, TRACE, RecordedTreeSource, replay

from gpuanat.core.measure.pid_namespace import PidNamespaceResolver
from gpuanat.core.measure.process_tree import HostOnlySource
from gpuanat.core.measure.samples import HostProcess, NvmlStatus, ProcessGpuMemory
from gpuanat.core.printable import printable
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.result import RunResult
from gpuanat.core.watch.session import WatchSession
from gpuanat.core.watch.target import WatchTarget, resolve_target
from gpuanat.tui.app import GpuAnatApp
from gpuanat.tui.run_backend import LocalRunBackend
from gpuanat.tui.screens.history import HistoryScreen
from gpuanat.tui.textual_internals import screen_compositor
from gpuanat.tui.watch_app import WatchApp
from gpuanat.tui.widgets.log_pane import LogPane

recorded = pytest.mark.skipif(not (TRACE.exists() and STEPS.exists()), reason="H100 recordings not committed")
NO_NVML = NvmlStatus(
    available=False, reason="no NVML in this test", driver_version=None, cuda_driver_version=None, gpu_names=()
)
CPU = Capabilities(
    torch_version="2.13.0+cpu",
    cuda_available=False,
    reason="CPU-only build",
    bitsandbytes_error="ModuleNotFoundError: No module named 'bitsandbytes'",
)
HOSTILE_MODEL = "/models/" + "\x1b]2;PWNED\x07[bold]B[/]\u202eevil"
HOSTILE_COMMAND = f"python3 train.py --run {EVIL_NAME} {MARKUP_PAYLOADS['click']} {MARKUP_PAYLOADS['link']}"
CREATED_AT = 1_795_294_194.0


def frame(app: App) -> str:
    """The screen's text, after checking that what a full repaint sends to the terminal holds nothing raw."""
    compositor = screen_compositor(app.screen)
    sent = compositor.render_full_update().render_segments(app.console)
    assert not raw_in_terminal_output(sent), raw_in_terminal_output(sent)
    text = "\n".join("".join(segment.text for segment in strip) for strip in compositor.render_strips())
    assert not raw_in_text(text), raw_in_text(text)
    return text


def fill_hostile_history(db_path: Path) -> None:
    """Runs named as an attacker would, with a hostile model path each (so that compare shows them)."""
    with HistoryStore(db_path) as store:
        for index, name in enumerate([EVIL_NAME, TITLE, MARKUP_PAYLOADS["click"], LONG_NAME]):
            config = {"preset": "tiny", "model": HOSTILE_MODEL + str(index), "batch_size": 4, "device": "cpu"}
            run_id = store.create_run(config, name=name, created_at=CREATED_AT + 60 * index)
            store.update_result(
                run_id,
                RunResult.from_json(
                    {"status": "ok", "run_id": run_id, "samples_per_second": 10.0 + index, "device_name": "x86_64"}
                ),
                status="ok",
            )


def cpu_dashboard(db_path: Path, config: RunConfig) -> GpuAnatApp:
    return GpuAnatApp(
        config,
        db_path=db_path,
        sampler_factory=lambda: (HostOnlySource(), NO_NVML),
        backend=LocalRunBackend(db_path, capabilities_probe=lambda: CPU),
        sample_interval_s=None,
        paint_interval_s=3600,
        clock=lambda: 1_000.0,
    )


@pytest.mark.asyncio
async def test_the_watch_of_a_process_named_by_prctl_shows_its_name_and_command_as_data(tmp_path):
    with hostile_process() as child:
        app = WatchApp(
            resolve_target(child.pid),
            db_path=tmp_path / "h.sqlite",
            interval_s=0.1,
            paint_interval_s=0.1,
            save_name=EVIL_NAME,
            sampler_factory=lambda: (HostOnlySource(per_process=True), NO_NVML),
        )
        async with app.run_test(size=(160, 50), notifications=True) as pilot:
            deadline = time.monotonic() + 30
            while app.dashboard.last_record is None or not app.dashboard.last_record.get("processes"):
                assert time.monotonic() < deadline, "no record reached the dashboard"
                await pilot.pause(0.1)
            await pilot.pause(0.3)
            text = frame(app)
            assert "\\x1b]2;PWNE" in text  # the name cell: cut to its 11 columns, escaped before the cut
            assert "\\x1b]0;PWNED\\x07" in text and "\\x1b[2J\\x1b[H" in text and "\\u202e" in text
            assert "[bold]B[/]" in text and "[@click=app.quit]Q[/]" in text  # the command line, literally
            await pilot.press("s")  # saved under the hostile name
            while app.dashboard.saved_run_id is None:
                assert time.monotonic() < deadline, "the save was not confirmed"
                await pilot.pause(0.1)
            await pilot.pause(0.2)
            assert "Recording into the history" in frame(app)
            await pilot.press("h")
            await pilot.pause(0.3)
            assert isinstance(app.screen, HistoryScreen)
            assert printable(EVIL_NAME) in frame(app)  # "[bold]B[/]" shown, not a bold B
            await pilot.press("slash", *"[bold", "enter")  # a filter that is broken markup
            await pilot.pause(0.2)
            assert "filter “[bold”" in frame(app)
            assert app.is_running and app.return_code is None  # neither crashed nor acted on anything shown


class HostileRecording(RecordedTreeSource):
    """The H100 recording, its training process named `tree_name`, and `other_pid` (a live local process) using
    2 GiB of the GPU beside it: the samples' shape is the recording's, the names come from /proc as live."""

    def __init__(self, tree_name: str, other_pid: int | None = None) -> None:
        super().__init__()
        self._tree_name, self._other_pid = tree_name, other_pid

    def read(self, pids):
        sample = super().read(pids)
        process = HostProcess(
            pid=PID,
            parent_pid=1,
            name=self._tree_name,
            cpu_percent=sample.host.cpu_percent or 0,
            rss_bytes=sample.host.rss_bytes or 0,
        )
        gpus = sample.gpus
        if self._other_pid is not None:
            other = ProcessGpuMemory(pid=self._other_pid, used_bytes=2 * 1024**3)
            gpus = tuple(dataclasses.replace(gpu, processes=(*gpu.processes, other)) for gpu in gpus)
        return dataclasses.replace(sample, gpus=gpus, host=dataclasses.replace(sample.host, processes=(process,)))


def hostile_watch_app(tmp_path: Path, other_pid: int | None = None) -> WatchApp:
    proc_root = tmp_path / "proc"
    for pid in (PID, other_pid):
        if pid is not None:
            (proc_root / str(pid)).mkdir(parents=True, exist_ok=True)
    target = WatchTarget(pid=PID, name=TITLE, command=HOSTILE_COMMAND, create_time_s=0.0, username=None)

    def session(target: WatchTarget, nvml: NvmlStatus) -> WatchSession:
        return WatchSession(
            target,
            nvml,
            clock=lambda: FIRST_T_S,
            publication_dirs_for=lambda pid: [],
            process_alive=lambda: True,
            resolver=PidNamespaceResolver(proc_root, check_visible_pids=False),
        )

    return WatchApp(
        target,
        db_path=tmp_path / "h.sqlite",
        session_factory=session,
        clock=lambda: FIRST_T_S,
        sampler_factory=lambda: (HostileRecording(TITLE, other_pid), NVML),
        interval_s=None,
        paint_interval_s=3600,
    )


@recorded
@pytest.mark.asyncio
async def test_another_user_s_process_on_the_gpu_is_named_as_data(tmp_path):
    with hostile_process(name="gpu\x1b]52;c;eA==\x07") as child:
        app = hostile_watch_app(tmp_path, other_pid=child.pid)
        async with app.run_test(size=(160, 50), notifications=True) as pilot:
            replay(app, until_elapsed_s=3.0)
            await pilot.pause()
            others = app.dashboard.last_record["other_gpu_processes"]
            assert [other["name"] for other in others] == ["gpu\x1b]52;c;eA==\x07"]  # read from /proc, as given
            text = frame(app)
            assert f"{child.pid:>7} gpu\\x1b]52;c" in text


@recorded
def test_snapshot_of_the_watch_of_a_hostile_process(snap_compare, tmp_path):
    app = hostile_watch_app(tmp_path)

    async def run_before(pilot) -> None:
        replay(app, until_elapsed_s=3.0)
        await pilot.pause()
        frame(app)

    assert snap_compare(app, terminal_size=(120, 40), run_before=run_before)


def test_snapshot_of_the_history_pane_with_hostile_names(snap_compare, tmp_path):
    fill_hostile_history(tmp_path / "h.sqlite")
    app = cpu_dashboard(tmp_path / "h.sqlite", RunConfig(preset="tiny", device="cpu"))

    async def run_before(pilot) -> None:
        frame(app)

    assert snap_compare(app, terminal_size=(120, 30), press=["h"], run_before=run_before)


@pytest.mark.asyncio
async def test_the_dashboard_shows_a_hostile_model_history_and_compare_as_data(tmp_path):
    fill_hostile_history(tmp_path / "h.sqlite")
    app = cpu_dashboard(tmp_path / "h.sqlite", RunConfig(preset="tiny", device="cpu", model=HOSTILE_MODEL))
    async with app.run_test(size=(160, 50), notifications=True) as pilot:
        await pilot.pause()
        assert "/models/\\x1b]2;PWNE…" in frame(app)  # the techniques panel cuts it here
        await pilot.press("h")
        await pilot.pause()
        text = frame(app)
        for name in (EVIL_NAME, TITLE, MARKUP_PAYLOADS["click"]):
            assert printable(name) in text
        assert "x" * 20 in text  # the 10,000-character name, cut to its column
        await pilot.press(*["up"] * 5, "space", "down", "space", "enter")  # compare the first two
        await pilot.pause()
        text = frame(app)
        assert "Compare runs 1, " in text
        assert printable(HOSTILE_MODEL + "0") in text  # the first run's model whole; the other's cut by its column
        assert text.count("/models/\\x1b]2;PWNED\\x0") == 2
        assert app.is_running


@pytest.mark.asyncio
async def test_notifications_show_foreign_and_own_text_literally(tmp_path):
    app = cpu_dashboard(tmp_path / "h.sqlite", RunConfig(preset="tiny", device="cpu"))
    async with app.run_test(size=(160, 50), notifications=True) as pilot:
        app.notify(f"The run could not be recorded: {EVIL_NAME}", severity="error")
        app.notify("LoRA needs PEFT (pip install 'gpuanat[llm]')")
        app.notify(MARKUP_PAYLOADS["click"] + MARKUP_PAYLOADS["link"], title=TITLE)
        await pilot.pause(0.3)
        text = frame(app)
        assert "evil\\x1b]0;PWNED\\x07\\x1b[2J[bold]B[/]" in text  # (the toast wraps after "recorded:")
        assert "pip install 'gpuanat[llm]'" in text
        assert "[@click=app.quit]Q[/][link=https://evil.example/]L[/link]" in text and "\\x1b]2;PWNED" in text
        await pilot.click(offset=(150, 45))  # a click where the toasts are: no action hides in them
        await pilot.pause()
        assert app.is_running


@pytest.mark.asyncio
async def test_the_key_page_and_the_palette_keep_gpuanat_s_own_brackets(tmp_path):
    app = cpu_dashboard(tmp_path / "h.sqlite", RunConfig(preset="tiny", device="cpu", model=None))
    async with app.run_test(size=(160, 60)) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert "'gpuanat[llm]')" in frame(app)  # the Liger key's line, wrapped after "pip install"
        await pilot.press("escape", "ctrl+p")
        await pilot.pause()
        await pilot.press(*"liger")
        await pilot.pause(0.5)
        assert "'gpuanat[llm]'" in frame(app)


class LogApp(App[None]):
    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path = path

    def compose(self) -> ComposeResult:
        yield LogPane(id="log")

    def on_mount(self) -> None:
        self.query_one(LogPane).follow(self._path)


@pytest.mark.asyncio
async def test_a_child_s_log_keeps_its_colours_and_shows_every_other_escape(tmp_path):
    log = tmp_path / ("run" + "\x1b]2;PWNED\x07[b]x[@click=app.quit].log")
    log.write_bytes(
        b"\n".join(
            [
                b"\x1b[31mred\x1b[0m plain",
                f"step 1 {TITLE} \x1b]52;c;eA==\x07 \x1b[2J".encode(),
                b'"x" [bold]B[/]',
                b"bad utf-8: \xff\xfe",
                "bidi \u202eevil".encode(),
            ]
        )
        + b"\n"
    )
    app = LogApp(log)
    async with app.run_test(size=(120, 20)) as pilot:
        pane = app.query_one(LogPane)
        pane.poll()
        await pilot.pause()
        text = frame(app)
        # the title and clipboard writes shown; the trailing SGR 5 (blink) becomes a style of the pane, as colours do
        assert "step 1 \\x1b]2;PWNED\\x07 \\x1b]52;c;eA==\\x07 \\x1b[2J" in text
        assert '"x" [bold]B[/]' in text and "bad utf-8: \ufffd\ufffd" in text and "bidi \\u202eevil" in text
        assert "Log · run\\x1b]2;PWNED\\x07[b]x[@click=app.quit].log" in text  # the border title, markup literal
        red_line = pane.lines[0]
        assert red_line.text == "red plain"
        assert [segment.style.color is not None for segment in red_line if segment.text.strip()] == [True, False]


@recorded
@pytest.mark.asyncio
async def test_an_out_of_memory_failure_and_memory_by_module_show_module_paths_and_operations_as_data(tmp_path):
    """A publication names the module that failed, the operation and the modules by module path: data from the
    user's model, shown escaped and literal in the failure line and in memory by module (`b`)."""
    from gpuanat.core.vocabulary.protocol import MODULES_REST, Error, LiveTensor, ModuleMemory, OutOfMemory, ProbeBands

    module = "encoder.\x1b]2;PWNED\x07.[bold]B[/].\u202elayer"
    bands = ProbeBands(
        weights_bytes=1 << 30,
        gradients_bytes=0,
        optimizer_state_bytes=0,
        activations_bytes=3 << 30,
        activations_method="allocator",
        batch_bytes=0,
        measured_at_step=1,
        modules=[
            ModuleMemory(module, activations_bytes=2 << 30, parameters_bytes=1 << 29),
            ModuleMemory(MODULES_REST, activations_bytes=1 << 30, parameters_bytes=1 << 29),
        ],
    )
    failure = OutOfMemory(
        phase="forward",
        failed_allocation_bytes=1 << 30,
        device_free_bytes=1 << 20,
        step=1,
        module=module,
        operation=f"x = {MARKUP_PAYLOADS['click']}{EVIL_NAME}",
        bands=bands,
        largest_tensors=[LiveTensor("activations", module, 1 << 30, [1024], "float32\x1b[2J")],
    )
    app = hostile_watch_app(tmp_path)
    async with app.run_test(size=(160, 50)) as pilot:
        replay(app, until_elapsed_s=3.0)
        session = app.dashboard.session
        assert session is not None
        session.add_events(PID, [Error(kind="oom", message=EVIL_NAME, step=1, out_of_memory=failure)])
        app.dashboard.sample_now()
        app.dashboard.paint()
        await pilot.pause()
        text = " ".join(frame(app).split())
        assert f"out of memory in the forward of {printable(module)}" in text, text
        assert "[@click=app.quit]Q[/]evil\\x1b]0;PWNED\\x07" in text and "float32\\x1b[2J" in text
        await pilot.press("b")
        await pilot.pause()
        text = frame(app)
        assert "\\x1b]2;PWNED\\x07.[bold]B[/]." in text and "\\u202elayer" in text, text
        assert app.is_running
