"""`gpuanat run --script train.py -- ARGS`: the user's own training script, launched with gpuanat's probe.

The script runs in a child process (its own process group, stdout/stderr to the run's log) through
`python -m gpuanat.worker.script`, which attaches `AnatomyCallback` to every HF `Trainer` the script creates
and sends the probe's events on gpuanat's pipe. The parent samples NVML and psutil for the child's process
tree and records the run in the history like a launched run (kind `launched`, the config naming the script
and its arguments plus the techniques the probe read off its TrainingArguments): the same `WatchSession`
that `gpuanat watch` uses, fed by the pipe instead of a publication file.
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuanat.core.measure.nvml_source import open_source
from gpuanat.core.measure.result import log_tail
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.measure.samples import NvmlStatus, Sample
from gpuanat.core.run.python_command import python_module_command
from gpuanat.core.run.runner import ChildExited, ChildProcess
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.store.history_errors import write_with_backoff
from gpuanat.core.store.recording import FINAL_WRITE_DEADLINE_S
from gpuanat.core.vocabulary.protocol import Event, Malformed, Ranked
from gpuanat.core.vocabulary.result import EXITED_ERROR_KEYS, RunError, RunResult
from gpuanat.core.watch.loop_kind import LOOP_NAMES, PROBES, ProbeHint, probe_hint
from gpuanat.core.watch.session import WatchSession
from gpuanat.core.watch.target import WatchError, WatchTarget, resolve_target

SAMPLE_INTERVAL_S = 0.25
EVENT_POLL_INTERVAL_S = 0.2


def script_command(script: Path, script_args: Sequence[str]) -> list[str]:
    """The child's command line: the launcher, then the script and its arguments as the user gave them."""
    return python_module_command("gpuanat.worker.script", "--", str(script), *script_args)


FROM_OUTSIDE = "only its processes were measured from outside"


def no_training_reason(status: str, hint: ProbeHint) -> str:
    """Why a script's run measured no training, and the probe's route for the loop its text shows: gpuanat attaches
    its probe to every transformers Trainer itself; Lightning and a loop of one's own add theirs
    (`gpuanat.probe`)."""
    ended = {"failed": "the script failed", "stopped": "the script was stopped", "oom": "the script ran out of memory"}
    when = f"{ended[status]} before training began under gpuanat's probe" if status in ended else ""
    if hint.has_probe:
        route = "it uses gpuanat's probe, which measures once training begins"
    elif hint.loop == "trainer":
        route = "gpuanat attaches its probe to every transformers Trainer the script creates"
    elif hint.loop in ("lightning", "plain"):
        route = f"{LOOP_NAMES[hint.loop]} is measured once the script adds gpuanat's probe: {PROBES[hint.loop]}"
    else:
        route = (
            "gpuanat attaches its probe to a transformers Trainer; Lightning needs "
            f"{PROBES['lightning']}, a loop of its own {PROBES['plain']}"
        )
    if not when:
        when = "the script trained nothing under gpuanat's probe" + ("" if hint.has_probe else " (no Trainer)")
    return f"{when}: {route}; {FROM_OUTSIDE}"


def _target(pid: int, command: list[str]) -> WatchTarget:
    try:
        return resolve_target(pid)
    except WatchError:  # it ended already; the session will see it gone
        return WatchTarget(
            pid=pid, name=Path(command[0]).name, command=" ".join(command), create_time_s=time.time(), username=None
        )


def execute_script(
    script: Path,
    script_args: Sequence[str],
    *,
    store: HistoryStore,
    log_dir: Path,
    name: str | None = None,
    on_event: Callable[[Event | Ranked], None] | None = None,
    sampler_factory: Callable[[], tuple[Any, NvmlStatus]] = lambda: open_source(per_process=True),
    env: Mapping[str, str] | None = None,
    trace_path: Path | None = None,
    stop_grace_s: float = 10.0,
    stop_requested: threading.Event | None = None,
    tags: Sequence[str] = (),
) -> RunResult:
    """Run `script` with `script_args` in a child with the probe attached, record it, return its result (the
    JSON contract of `gpuanat run --json`), named `name` (default: "script FILE.py") and tagged `tags`. Ctrl-C or
    `stop_requested` stops the child's process group."""
    description = {"script": str(script.resolve()), "args": list(script_args), "cwd": os.getcwd()}
    name = f"script {script.name}" if name is None else name
    run_id = write_with_backoff(
        lambda: store.create_run(description, kind="launched", name=name, tags=tags), deadline_s=FINAL_WRITE_DEADLINE_S
    )
    log_path = log_dir / f"run-{run_id}.log"
    write_with_backoff(lambda: store.set_log_path(run_id, log_path), deadline_s=FINAL_WRITE_DEADLINE_S)
    command = script_command(script, script_args)
    child = ChildProcess(lambda events_fd: command, log_path=log_path, env=env)
    source, nvml = sampler_factory()
    samples: queue.SimpleQueue[Sample] = queue.SimpleQueue()
    sampler = Sampler(source, interval_s=SAMPLE_INTERVAL_S, on_sample=samples.put, trace_path=trace_path)
    child.start()
    child_pid = child.pid
    assert child_pid is not None
    session = WatchSession(
        _target(child_pid, command),
        nvml,
        publication_dirs_for=None,
        process_alive=lambda: child.poll() is None,
        kind="launched",
        description=description,
    )
    session.start_saving(store, name, run_id=run_id)
    sampler.track(child_pid)
    sampler.start()
    exit_code: int | None = None
    stopped = False

    def handle_samples() -> None:
        while not samples.empty():
            session.handle(samples.get())

    def pump(until_idle: bool) -> int | None:
        while True:
            if not until_idle and stop_requested is not None and stop_requested.is_set():
                raise KeyboardInterrupt
            event = child.next_event(EVENT_POLL_INTERVAL_S)
            handle_samples()
            if event is None:
                if until_idle:
                    return None
                continue
            if isinstance(event, ChildExited):
                return event.returncode
            session.add_events(child_pid, [event])
            if on_event is not None and not isinstance(event, Malformed):
                on_event(event)

    try:
        exit_code = pump(until_idle=False)
    except KeyboardInterrupt:
        stopped = True
        exit_code = child.stop(grace_s=stop_grace_s)
        pump(until_idle=True)
    finally:
        child.kill_group()
        sampler.stop()
        handle_samples()
        source.close()
    session.final_record(exit_code=exit_code)
    published = session.observed.run  # what the script's trainer published
    error: RunError | None = None
    if published.error is not None:
        error = RunError(
            kind=published.error.kind, message=published.error.message, step=published.error.step, flag=None
        )
    if published.error is not None and published.error.kind == "oom":
        status = "oom"
    elif stopped:
        status = "stopped"
    elif exit_code == 0 and (published.done is not None or published.model is None):
        status = "ok"
    else:
        status = "failed"
    if status == "failed" and error is None:
        error = RunError(
            kind="exception",
            flag=None,
            step=None,
            message=f"the script exited with code {exit_code}; last lines of its log:\n{log_tail(log_path)}",
            json_keys=EXITED_ERROR_KEYS,
        )
    unavailable = dict(session.result(exited=True).unavailable)
    if published.model is None:
        # Nothing trained under the probe: every training figure is missing for that one reason.
        unavailable = {key: reason for key, reason in unavailable.items() if key.startswith(("device_", "bands"))}
        reason = no_training_reason(status, probe_hint(["python", str(script.resolve())], None))
        unavailable["training"] = unavailable["bands"] = reason
    elif published.done is None:
        unavailable["steady_samples_per_second"] = f"the script ended ({status}) before training finished"
    result = session.finish_saving(
        exited=True,
        status=status,
        exit_code=exit_code,
        log_path=str(log_path),
        error=error,
        name=name,
        unavailable=unavailable,
    )
    assert result is not None
    session.close()
    return result
