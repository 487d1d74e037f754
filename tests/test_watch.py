"""`gpuanat watch PID`: real processes watched through the real sampler, session and CLI.

Host metrics come from live processes and are checked against psutil readings of the same processes; GPU
fields come from the NVML trace recorded on an H100 (tests/data/nvml_trace_h100.jsonl), replayed through
`ReplayGpuSource` while psutil reads a live process; the anatomy comes from a real tiny HF Trainer run
whose script adds `AnatomyCallback()`, publishing to a private directory.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from conftest import REPO, cli_env, run_cli, start_cli, start_torchrun_job, tiny_model_reference

from gpuanat.core.measure.anatomy import stack_problems
from gpuanat.core.measure.pid_namespace import PidNamespaceResolver
from gpuanat.core.measure.process_tree import HostOnlySource
from gpuanat.core.measure.replay import ReplayGpuSource, ReplaySource
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.measure.samples import GpuSample, HostSample, NvmlStatus, ProcessGpuMemory, Sample
from gpuanat.core.watch import records as watch_records
from gpuanat.core.watch.loop_kind import ProbeHint
from gpuanat.core.watch.session import WatchSession, follow
from gpuanat.core.watch.target import WatchError, WatchTarget, resolve_target

MIB = 1024 * 1024
NOT_PUBLISHED = ProbeHint(script=None, loop=None, has_probe=False).reason
"""What a watch says of a process whose command line names no script (`python -c …`): the three probes."""
H100_TRACE = Path(__file__).parent / "data" / "nvml_trace_h100.jsonl"
H100_PID = 2348
"""The training process's PID in the H100 trace."""
TINY_TRAINER = REPO / "tests" / "scripts" / "tiny_trainer.py"
H100_NVML = NvmlStatus(
    available=True,
    reason=None,
    driver_version="580.159.04",
    cuda_driver_version=13000,
    gpu_names=("NVIDIA H100 80GB HBM3",),
)
NO_NVML = NvmlStatus(
    available=False, reason="NVML not used in this test", driver_version=None, cuda_driver_version=None, gpu_names=()
)

# Holds 80 MiB of touched memory, starts a sleeping grandchild with 30 MiB of its own, reports both PIDs, spins.
SPINNER = textwrap.dedent(
    """
    import subprocess, sys
    ballast = b"x" * (80 * 1024 * 1024)
    grandchild = subprocess.Popen([sys.executable, "-c",
                                   "import sys, time; b = b'y' * (30 * 1024 * 1024); print('ok', flush=True); "
                                   "time.sleep(600)"], stdout=subprocess.PIPE, text=True)
    grandchild.stdout.readline()
    print(grandchild.pid, flush=True)
    while True:
        pass
    """
)


@pytest.fixture
def spinner() -> Iterator[tuple[subprocess.Popen[str], int]]:
    child = subprocess.Popen([sys.executable, "-c", SPINNER], stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert child.stdout is not None
        grandchild_pid = int(child.stdout.readline())
        yield child, grandchild_pid
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def unused_pid() -> int:
    """A PID that no process here can have: above the kernel's limit."""
    return int(Path("/proc/sys/kernel/pid_max").read_text()) + 1000


def dead_pid() -> int:
    finished = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    return int(finished.stdout)


REPLAYED = PidNamespaceResolver(check_visible_pids=False)
"""The trace's process held /dev/nvidia* where it was recorded; the live process it is replayed onto does not."""


def collect(session: WatchSession, source, *, interval_s: float, duration_s: float | None = None) -> list[dict]:
    records: list[dict] = []
    sampler = Sampler(source, interval_s=interval_s, on_sample=lambda sample: None)
    follow(session, sampler, interval_s=interval_s, on_record=records.append, duration_s=duration_s)
    return records


def test_the_other_processes_on_the_gpu_are_named_once_while_nvml_lists_them(spinner, monkeypatch):
    """Each other process on the GPU was named through a new psutil.Process at every sample; its name is now read
    when it appears and kept while NVML lists it, and read again when it comes back."""
    child, _ = spinner
    others = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    named_pids: list[int | None] = []
    name_of = watch_records._process_name

    def counted_name_of(pid: int | None) -> str | None:
        named_pids.append(pid)
        return name_of(pid)

    monkeypatch.setattr(watch_records, "_process_name", counted_name_of)
    session = WatchSession(resolve_target(child.pid), H100_NVML, publication_dirs_for=lambda pid: [], resolver=REPLAYED)

    def on_the_gpu(pids: list[int]) -> Sample:
        processes = tuple(ProcessGpuMemory(pid=pid, used_bytes=MIB) for pid in pids)
        gpu = GpuSample(
            index=0,
            name="NVIDIA H100 80GB HBM3",
            used_bytes=4 * MIB,
            total_bytes=80 * 1024 * MIB,
            reserved_bytes=None,
            gpu_util_percent=50.0,
            memory_util_percent=10.0,
            power_w=None,
            temperature_c=None,
            processes=processes,
        )
        return Sample(t_s=time.monotonic(), gpus=(gpu,), host=HostSample(cpu_percent=None, rss_bytes=None))

    try:
        both = [other.pid for other in others]
        records = [session.handle(on_the_gpu(both)) for _ in range(5)]
        assert sorted(named_pids) == sorted(both)
        for record in records:
            assert [(entry["pid"], entry["name"]) for entry in record["other_gpu_processes"]] == [
                (pid, psutil.Process(pid).name()) for pid in both
            ]
        session.handle(on_the_gpu(both[:1]))  # the second leaves the GPU
        session.handle(on_the_gpu(both))  # and comes back: named again
        assert named_pids.count(both[0]) == 1 and named_pids.count(both[1]) == 2
    finally:
        for other in others:
            other.kill()
            other.wait()


# --- a plain process, host metrics against psutil -----------------------------------------------


def test_host_metrics_of_a_watched_tree_match_psutil(spinner):
    child, grandchild_pid = spinner
    session = WatchSession(resolve_target(child.pid), NO_NVML, publication_dirs_for=lambda pid: [])
    source = HostOnlySource(per_process=True, descendants_refresh_s=0.0)
    sampler = Sampler(source, interval_s=0.25, on_sample=lambda sample: None)
    sampler.track(child.pid)
    references = {pid: psutil.Process(pid) for pid in (child.pid, grandchild_pid)}
    first = session.handle(sampler.sample_once())
    for reference in references.values():
        reference.cpu_percent(interval=None)
    assert {process["pid"] for process in first["processes"]} == {child.pid, grandchild_pid}
    for _ in range(4):
        time.sleep(0.3)
        record = session.handle(sampler.sample_once())
        reference_cpu = {pid: reference.cpu_percent(interval=None) for pid, reference in references.items()}
        reference_rss = {pid: reference.memory_info().rss for pid, reference in references.items()}
        by_pid = {process["pid"]: process for process in record["processes"]}
        # The ballasts are touched before the PIDs are reported and nothing allocates afterwards: RSS is flat,
        # so readings microseconds apart differ by a few pages at most.
        assert abs(record["rss_bytes"] - sum(reference_rss.values())) < 2 * MIB
        assert record["rss_bytes"] >= 110 * MIB
        assert record["rss_bytes"] == sum(process["rss_bytes"] for process in record["processes"])
        for pid in references:
            assert abs(by_pid[pid]["rss_bytes"] - reference_rss[pid]) < 2 * MIB
        # Both rates cover the same 0.3 s give or take microseconds; CPU time comes in 10 ms ticks (3% of 0.3 s
        # per reading), so 12 points covers ticks and scheduling noise. The child spins, so the value is far
        # from 0 and the comparison means something; the grandchild sleeps.
        assert abs(record["cpu_percent"] - sum(reference_cpu.values())) < 12
        assert by_pid[child.pid]["cpu_percent"] > 20
        assert by_pid[grandchild_pid]["cpu_percent"] < 5
        assert record["gpu_memory_bytes"] is None and "no GPU readings" in record["gpu_memory_reason"]
        assert record["published"] is False and record["publication_reason"] == NOT_PUBLISHED
    os.killpg(child.pid, signal.SIGKILL)
    child.wait()
    assert not session.alive()
    final = session.final_record()
    assert final["exited"] is True and final["peak_rss_bytes"] >= 110 * MIB


def test_the_cli_watches_for_the_duration_and_leaves_the_process_running(spinner, tmp_path):
    child, _ = spinner
    completed = run_cli(
        ["watch", str(child.pid), "--json", "--duration", "1.5", "--interval", "0.25"], None, timeout_s=60
    )
    assert completed.returncode == 0, completed.stderr
    records = [json.loads(line) for line in completed.stdout.splitlines()]
    # one record at t=0 and every 0.25 s until 1.5 s have passed: 7, give or take a slow read
    assert 6 <= len(records) <= 8
    assert all(record["pid"] == child.pid and record["exited"] is False for record in records)
    assert records[-1]["t"] >= 1.5
    assert all(record["rss_bytes"] >= 110 * MIB for record in records)
    assert child.poll() is None


def test_a_pid_that_does_not_exist_or_is_invalid_exits_2_with_one_line():
    pid = dead_pid()
    completed = run_cli(["watch", str(pid), "--json"], None, timeout_s=60)
    assert completed.returncode == 2
    assert completed.stdout == ""
    assert completed.stderr.strip().splitlines() == [f"gpuanat: error: no process with PID {pid}"]
    completed = run_cli(["watch", "0", "--json"], None, timeout_s=60)
    assert (completed.returncode, len(completed.stderr.strip().splitlines())) == (2, 1)
    assert "positive" in completed.stderr
    with pytest.raises(WatchError, match="no process"):
        resolve_target(unused_pid())


# --- GPU fields from the H100 trace, psutil live -----------------------------------------------------


def h100_samples() -> list[Sample]:
    source = ReplaySource(H100_TRACE)
    return [source.read([]) for _ in range(len(source))]


def test_gpu_fields_follow_the_recorded_h100_trace(spinner):
    child, _ = spinner
    recorded = h100_samples()
    session = WatchSession(resolve_target(child.pid), H100_NVML, publication_dirs_for=lambda pid: [], resolver=REPLAYED)
    source = ReplayGpuSource(ReplaySource(H100_TRACE, remap_pids={H100_PID: child.pid}))
    records = collect(session, source, interval_s=0.005)
    assert len(records) == len(recorded)
    for record, sample in zip(records, recorded, strict=True):
        gpu = sample.gpus[0]
        process_bytes = sample.process_used_bytes([H100_PID])
        # 0 before the training process opened the GPU, then exactly what NVML reported for it
        assert record["gpu_memory_bytes"] == (process_bytes or 0)
        assert record["gpu_memory_reason"] is None
        (detail,) = record["gpus"]
        assert (detail["used_bytes"], detail["total_bytes"]) == (gpu.used_bytes, gpu.total_bytes)
        assert detail["other_processes_bytes"] == gpu.used_bytes - (process_bytes or 0)
        # the trace has no per-process utilization: the device's, labelled as such
        assert (record["gpu_util_percent"], record["gpu_util_scope"]) == (gpu.gpu_util_percent, "device")
        assert record["other_gpu_processes"] == []
        assert record["pid_namespace"] is None
        # host metrics are the live child's, not the recorded ones
        assert record["rss_bytes"] >= 110 * MIB
        assert record["bands"] is None and record["publication_reason"] == NOT_PUBLISHED
    assert max(record["gpu_memory_bytes"] for record in records) == max(
        sample.process_used_bytes([H100_PID]) or 0 for sample in recorded
    )


def test_per_process_utilization_is_used_when_nvml_reports_it(spinner, tmp_path):
    """The H100 trace with per-process utilization entries added (a third of the device's, for the training
    process): the record takes the process's share, labelled "process", not the device's."""
    child, _ = spinner
    trace = tmp_path / "with_process_utilization.jsonl"
    with trace.open("w") as out:
        for line in H100_TRACE.read_text().splitlines():
            sample = json.loads(line)
            for gpu in sample["gpus"]:
                gpu["process_utilization"] = [
                    {"pid": process["pid"], "sm_util_percent": gpu["gpu_util_percent"] / 3, "memory_util_percent": 0.0}
                    for process in gpu["processes"]
                ]
            out.write(json.dumps(sample) + "\n")
    session = WatchSession(resolve_target(child.pid), H100_NVML, publication_dirs_for=lambda pid: [], resolver=REPLAYED)
    records = collect(session, ReplayGpuSource(ReplaySource(trace, remap_pids={H100_PID: child.pid})), interval_s=0.005)
    on_gpu = [record for record in records if record["gpu_memory_bytes"]]
    assert on_gpu and len(on_gpu) < len(records)
    for record in on_gpu:
        assert record["gpu_util_scope"] == "process"
        assert record["gpu_util_percent"] == pytest.approx(record["gpus"][0]["device_util_percent"] / 3)
    # before the process is on the GPU, its share cannot be told: the device's
    assert {record["gpu_util_scope"] for record in records if not record["gpu_memory_bytes"]} == {"device"}


def test_nvml_pids_from_another_namespace_are_detected_and_not_guessed(spinner):
    child, _ = spinner
    foreign_pid = unused_pid()
    session = WatchSession(resolve_target(child.pid), H100_NVML, publication_dirs_for=lambda pid: [])
    records = collect(
        session, ReplayGpuSource(ReplaySource(H100_TRACE, remap_pids={H100_PID: foreign_pid})), interval_s=0.005
    )
    listed = [record for record in records if record["other_gpu_processes"]]
    assert listed
    for record in listed:
        assert "another PID namespace" in record["pid_namespace"]["note"]
        assert record["pid_namespace"]["unmapped"] == [foreign_pid]
        assert record["gpu_memory_bytes"] is None and "another PID namespace" in record["gpu_memory_reason"]
        (other,) = record["other_gpu_processes"]
        assert (other["pid"], other["local_pid"]) == (foreign_pid, None)
    assert all(record["pid_namespace"] is None for record in records if not record["other_gpu_processes"])


def fake_proc(root: Path, pid: int, *, nspid: list[int], fds: dict[str, str]) -> None:
    """/proc/<pid> as a container would show it: the status NSpid line and the open files."""
    (root / str(pid) / "fd").mkdir(parents=True)
    levels = "\t".join(str(level) for level in nspid)
    (root / str(pid) / "status").write_text(f"Name:\tpython3\nNSpid:\t{levels}\n")
    for fd, target in fds.items():
        (root / str(pid) / "fd" / fd).symlink_to(target)


@pytest.mark.parametrize("how", ["nvidia device", "NSpid"])
def test_foreign_nvml_pids_are_mapped_where_proc_allows(spinner, tmp_path, how):
    child, grandchild_pid = spinner
    foreign_pid = unused_pid()
    if how == "nvidia device":
        # the only process of the watched tree with /dev/nvidia* open is the training process
        fake_proc(tmp_path, child.pid, nspid=[child.pid], fds={"0": "/dev/null", "7": "/dev/nvidia0"})
        fake_proc(tmp_path, grandchild_pid, nspid=[grandchild_pid], fds={"0": "/dev/null"})
    else:
        # /proc shows both levels of the process's PID: ours, then the one NVML reports
        fake_proc(tmp_path, child.pid, nspid=[child.pid, foreign_pid], fds={"0": "/dev/null"})
    session = WatchSession(
        resolve_target(child.pid),
        H100_NVML,
        publication_dirs_for=lambda pid: [],
        resolver=PidNamespaceResolver(tmp_path),
    )
    recorded = h100_samples()
    records = collect(
        session, ReplayGpuSource(ReplaySource(H100_TRACE, remap_pids={H100_PID: foreign_pid})), interval_s=0.005
    )
    for record, sample in zip(records, recorded, strict=True):
        assert record["gpu_memory_bytes"] == (sample.process_used_bytes([H100_PID]) or 0)
        if record["gpu_memory_bytes"]:
            namespace = record["pid_namespace"]
            assert namespace["mapped"] == {str(foreign_pid): child.pid} and namespace["unmapped"] == []
            assert f"mapped {foreign_pid}→{child.pid}" in namespace["note"]
            by_pid = {process["pid"]: process for process in record["processes"]}
            assert by_pid[child.pid]["gpu_memory_bytes"] == record["gpu_memory_bytes"]
            assert record["other_gpu_processes"] == []


# --- a real HF Trainer run that publishes --------------------------------------------------------


def start_tiny_trainer(
    tmp_path: Path,
    *args: str,
    watch_args: list[str] | None = None,
) -> tuple[subprocess.Popen[str], Path, dict[str, str]]:
    """The tiny trainer with the callback, once it has trained a step. With `watch_args`, `gpuanat watch PID
    *watch_args` is started the moment the trainer is, before it publishes anything (a watcher started later can
    miss a short run on a loaded machine), as `trainer.watcher`."""
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir(mode=0o700)
    env = {**cli_env(tmp_path / "history.sqlite", offline_hub=True), "XDG_RUNTIME_DIR": str(runtime_dir)}
    ready = tmp_path / "ready"
    trainer = subprocess.Popen(
        [sys.executable, str(TINY_TRAINER), "--callback", "--ready-file", str(ready), *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if watch_args is not None:
        trainer.watcher = subprocess.Popen(  # type: ignore[attr-defined]
            [sys.executable, "-m", "gpuanat", "watch", str(trainer.pid), *watch_args],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
    deadline_s = time.monotonic() + 120
    while not ready.exists():
        assert trainer.poll() is None, trainer.stderr.read() if trainer.stderr else ""
        assert time.monotonic() < deadline_s, "the training script did not start"
        time.sleep(0.05)
    return trainer, runtime_dir, env


def test_watching_a_real_trainer_run_that_publishes(tmp_path):
    trainer, runtime_dir, _env = start_tiny_trainer(
        tmp_path, "--samples", "400", "--hold-s", "1", watch_args=["--json", "--save", "tiny external"]
    )
    publication = runtime_dir / "gpuanat" / f"{trainer.pid}.jsonl"
    try:
        # private: the directory 0700 and the file 0600, both ours
        assert stat.S_IMODE(publication.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(publication.stat().st_mode) == 0o600
        assert publication.stat().st_uid == os.getuid()
        stdout, stderr = trainer.watcher.communicate(timeout=240)
        watcher = subprocess.CompletedProcess(trainer.watcher.args, trainer.watcher.returncode, stdout, stderr)
    finally:
        trainer.wait(timeout=240)
        if trainer.watcher.poll() is None:
            trainer.watcher.kill()
    assert watcher.returncode == 0, watcher.stderr
    records = [json.loads(line) for line in watcher.stdout.splitlines()]
    *samples, final = records
    reference = tiny_model_reference()

    published = [record for record in samples if record["published"]]
    assert published, "no record saw the publication"
    for record in published:
        assert record["publisher_pid"] == trainer.pid
        assert record["params"] == reference["params"]
        bands = record["bands"]
        if record["bands_measured_at_step"] is None:
            # read after the run's hello, before its first step was measured (a loaded machine can be that slow)
            assert bands["weights_bytes"] is None
            assert record["bands_unavailable"]["weights_bytes"] == "the probe has not measured a step yet"
            continue
        assert record["gradients_after_backward_bytes"] == reference["gradients_bytes"]
        assert bands["weights_bytes"] == reference["weights_bytes"] and bands["gradients_bytes"] == 0
        assert stack_problems(record) == []
        # The bands are memory at the end of the measured step's forward pass (the peak). The optimizer state
        # is created by the first optimizer step, after the first forward pass: a watcher that reads the
        # publication before step 2 was published sees step 1's bands, without it.
        measured_at_step = record["bands_measured_at_step"]
        assert 1 <= measured_at_step <= record["step"]
        assert bands["optimizer_state_bytes"] == (0 if measured_at_step == 1 else reference["optimizer_state_bytes"])
        assert bands["activations_bytes"] > 0
        assert "CPU run" in record["bands_unavailable"]["free_bytes"]
        assert record["rss_bytes"] > reference["weights_bytes"]
    assert any(record["bands_measured_at_step"] is not None for record in published)
    # memory by module comes with the bands it is of, once each (the dashboard's `b` keeps the latest); the final
    # record has the latest whole, and no failure
    with_modules = [record for record in published if record["modules"] is not None]
    assert with_modules and with_modules[0]["bands_measured_at_step"] is not None
    for record in with_modules:
        parameters = sum(row["parameters_bytes"] for row in record["modules"])
        assert parameters == record["bands"]["weights_bytes"] == reference["weights_bytes"]
    assert final["modules"] == with_modules[-1]["modules"] and final["out_of_memory"] is None
    assert all(record["out_of_memory"] is None for record in records) and final["bands"] is None
    rates = [record["samples_per_second"] for record in published if record["samples_per_second"] is not None]
    assert rates and all(rate > 0 for rate in rates)
    steps = [record["step"] for record in published if record["step"] is not None]  # None: before step 1 ended
    assert steps == sorted(steps) and steps[-1] == 300  # 400 samples / batch 4 × 3 epochs
    assert published[-1]["training_done"] is True and published[-1]["steady_samples_per_second"] > 0
    assert published[-1]["bands"]["optimizer_state_bytes"] == reference["optimizer_state_bytes"]
    assert final["exited"] is True and final["training_done"] is True and final["steps"] == 300
    assert final["saved_run_id"] == 1
    # the process removed its publication when it exited
    assert not publication.exists()

    history = run_cli(["history", "--json"], tmp_path / "history.sqlite", timeout_s=60)
    (run,) = json.loads(history.stdout)
    assert (run["kind"], run["name"], run["status"]) == ("watched", "tiny external", "ok")
    assert run["config"]["batch_size"] == 4 and run["config"]["watched_pid"] == trainer.pid
    result = run["result"]
    assert result["bands"]["weights_bytes"] == reference["weights_bytes"]
    assert result["bands"]["optimizer_state_bytes"] == reference["optimizer_state_bytes"]
    assert result["steps"] == 300 and result["steady_samples_per_second"] > 0
    assert result["peak_rss_bytes"] >= max(record["rss_bytes"] for record in samples)


def test_save_records_a_watched_run_without_publication_for_the_duration(spinner, tmp_path):
    child, _ = spinner
    db = tmp_path / "history.sqlite"
    completed = run_cli(["watch", str(child.pid), "--json", "--duration", "1", "--save"], db, timeout_s=60)
    assert completed.returncode == 0, completed.stderr
    assert "saved as run 1 (detached)" in completed.stderr
    records = [json.loads(line) for line in completed.stdout.splitlines()]
    (run,) = json.loads(run_cli(["history", "--json"], db, timeout_s=60).stdout)
    assert (run["kind"], run["status"]) == ("watched", "detached")
    assert run["result"]["peak_rss_bytes"] == max(record["rss_bytes"] for record in records)
    assert run["result"]["unavailable"]["bands"] == NOT_PUBLISHED
    table = run_cli(["history"], db, timeout_s=60).stdout
    assert "watched" in table and "detached" in table


def test_interrupting_the_json_watch_exits_130(spinner):
    child, _ = spinner
    watcher = start_cli(["watch", str(child.pid), "--json"], None)
    assert watcher.stdout is not None
    json.loads(watcher.stdout.readline())
    watcher.send_signal(signal.SIGINT)
    _, stderr = watcher.communicate(timeout=30)
    assert watcher.returncode == 130 and "interrupted" in stderr


def test_events_pushed_by_a_launcher_are_used_without_publication_files(spinner):
    """`run --script` feeds its child's pipe events to the session; no file is looked for."""
    from gpuanat.core.vocabulary.protocol import ModelInfo, ProbeBands, Step

    child, _ = spinner
    session = WatchSession(resolve_target(child.pid), NO_NVML, publication_dirs_for=None)
    sampler = Sampler(HostOnlySource(per_process=True), interval_s=0.1, on_sample=lambda sample: None)
    sampler.track(child.pid)
    assert session.handle(sampler.sample_once())["publication_reason"] == "the process has sent no probe events yet"
    bands = ProbeBands(
        weights_bytes=40,
        gradients_bytes=40,
        optimizer_state_bytes=80,
        activations_bytes=12,
        activations_method="saved_tensors",
        batch_bytes=4,
        measured_at_step=1,
    )
    session.add_events(
        child.pid,
        [
            ModelInfo(params=10, trainable_params=10, weights_bytes=40, dtype="float32", total_steps=2),
            Step(step=1, samples=4, tokens=16, step_time_s=0.1, elapsed_s=0.1, bands=bands),
            Step(step=2, samples=8, tokens=32, step_time_s=0.1, elapsed_s=0.3),
        ],
    )
    record = session.handle(sampler.sample_once())
    assert record["published"] and record["step"] == 2
    assert record["samples_per_second"] == pytest.approx(4 / 0.2)
    assert record["bands"]["weights_bytes"] == 40


def test_a_visible_pid_without_a_gpu_device_is_a_coincidence_not_the_process(tmp_path):
    """In a container a host PID NVML reports may be the number of an unrelated process here."""
    fake_proc(tmp_path, 2348, nspid=[2348], fds={"0": "/dev/null"})
    fake_proc(tmp_path, 41, nspid=[41], fds={"3": "/dev/nvidia-uvm"})
    mapping = PidNamespaceResolver(tmp_path).resolve([2348], tree_pids=[41])
    assert mapping.other_namespace and mapping.local_by_nvml == {2348: 41}
    assert "taken here by a process without a GPU" in mapping.note
    mapping = PidNamespaceResolver(tmp_path).resolve([2348, 5555], tree_pids=[41])
    assert mapping.foreign == (2348, 5555) and "unmapped: 2348, 5555" in mapping.note
    assert PidNamespaceResolver(tmp_path).resolve([41], tree_pids=[41]).note is None


WATCH_TRACE = Path(__file__).parent / "data" / "nvml_trace_watch_h200.jsonl"
"""Recorded by `gpuanat watch PID --trace-out` on an H200 (the lent machine that day) while a bert-large run
started outside gpuanat trained
(`scripts/gpu_check.sh start-watch`): per-process host detail and NVML per-process utilization included."""


@pytest.mark.skipif(not WATCH_TRACE.exists(), reason="the watch trace is not committed yet")
def test_the_recorded_gpu_watch_trace_replays_into_the_same_records(tmp_path):
    source = ReplaySource(WATCH_TRACE)
    recorded = [source.read([]) for _ in range(len(source))]
    root_pid = next(sample.host.processes[0].pid for sample in recorded if sample.host.processes)
    # the recording machine's /proc, as far as it matters: the watched process, holding the GPU device
    fake_proc(tmp_path, root_pid, nspid=[root_pid], fds={"3": "/dev/nvidia0"})
    target = WatchTarget(pid=root_pid, name="python3", command="", create_time_s=0.0, username=None)
    session = WatchSession(
        target,
        H100_NVML,
        publication_dirs_for=lambda pid: [],
        process_alive=lambda: True,
        resolver=PidNamespaceResolver(tmp_path, check_visible_pids=False),
    )
    records = [session.handle(sample) for sample in recorded]
    listed = any(process.pid == root_pid for sample in recorded for gpu in sample.gpus for process in gpu.processes)
    on_gpu = [
        (record, sample)
        for record, sample in zip(records, recorded, strict=True)
        if any(gpu.processes for gpu in sample.gpus)
    ]
    assert on_gpu, "no process on the GPU in the trace"
    for record, sample in on_gpu:
        assert record["rss_bytes"] == sample.host.rss_bytes
        if listed:  # NVML's PIDs were ours where it was recorded
            assert record["gpu_memory_bytes"] == sample.process_used_bytes([root_pid])
            assert record["pid_namespace"] is None
        else:  # recorded in a container: the one GPU process of the tree is mapped through /dev/nvidia*
            assert "another PID namespace" in record["pid_namespace"]["note"]
        if sample.gpus[0].process_utilization is not None and record["gpu_memory_bytes"]:
            assert record["gpu_util_scope"] == "process"
    # the bert-large run holds gigabytes of GPU memory
    assert max(record["gpu_memory_bytes"] or 0 for record, _ in on_gpu) > 4 * 1024**3


def test_an_event_the_session_cannot_take_is_counted_and_the_watch_goes_on(spinner):
    """Events also arrive decoded by others (`add_events`); one with a string where the protocol has numbers
    would break the record's arithmetic. It is counted as malformed; the events around it are used."""
    from gpuanat.core.vocabulary.protocol import Step

    child, _ = spinner
    session = WatchSession(resolve_target(child.pid), NO_NVML, publication_dirs_for=None)
    sampler = Sampler(HostOnlySource(per_process=True), interval_s=0.1, on_sample=lambda sample: None)
    sampler.track(child.pid)
    session.add_events(
        child.pid,
        [
            Step(step=1, samples=4, tokens=16, step_time_s=0.1, elapsed_s=0.1),
            Step(step="2", samples="8", tokens=32, step_time_s=0.1, elapsed_s="0.2"),
            Step(step=3, samples=12, tokens=48, step_time_s=0.1, elapsed_s=0.3),
        ],
    )
    record = session.handle(sampler.sample_once())
    assert record["malformed_events"] == 1
    assert (record["step"], record["samples"]) == (3, 12)
    assert record["samples_per_second"] == pytest.approx(8 / 0.2)


def test_a_ranked_envelope_in_a_publication_counts_as_malformed():
    """A process publishes its own events; a `Ranked` envelope (what only gpuanat's rank launcher sends its parent)
    is none of them: it counts as malformed and does not make its process the run's publisher."""
    from gpuanat.core.measure.observed_run import ObservedRun
    from gpuanat.core.vocabulary.protocol import Ranked, Step

    observed = ObservedRun()
    step = Step(step=1, samples=4, tokens=16, step_time_s=0.1, elapsed_s=0.1)
    assert observed.observe_event(os.getpid(), Ranked(1, step)) is None
    assert observed.malformed == 1
    assert (observed.publisher_pid, observed.publishers) == (None, {})
    assert observed.observe_event(os.getpid(), step) == step


def test_watching_a_torchrun_job_shows_every_ranks_anatomy(tmp_path):
    """Issue #15: a job launched with torchrun (2 CPU ranks, DDP over gloo), each rank with the one-line callback:
    `gpuanat watch` of the torchrun process shows both ranks, each with its own bands."""
    job, env = start_torchrun_job(tmp_path, TINY_TRAINER, "--callback", "--samples", "20000", "--hold-s", "1")
    try:
        watcher = subprocess.run(
            [sys.executable, "-m", "gpuanat", "watch", str(job.pid), "--json", "--duration", "6"],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(timeout=60)
    assert watcher.returncode == 0, watcher.stderr
    records = [json.loads(line) for line in watcher.stdout.splitlines()]
    # A rank's bands come with its first measured step: a record read between its start and that step shows the
    # rank without them yet.
    both = [
        record
        for record in records
        if len(record["ranks"]) == 2
        and all(rank["step"] is not None and rank["bands"]["weights_bytes"] is not None for rank in record["ranks"])
    ]
    assert both, "no record showed both ranks with their bands"
    reference = tiny_model_reference()
    for record in both:
        assert [rank["rank"] for rank in record["ranks"]] == [0, 1]  # from each rank's RANK
        assert len({rank["pid"] for rank in record["ranks"]}) == 2
        assert record["publisher_pid"] == record["ranks"][0]["pid"]  # rank 0 speaks for the run
        for rank in record["ranks"]:
            assert rank["bands"]["weights_bytes"] == reference["weights_bytes"]  # DDP: the whole model on each
            assert rank["gradients_after_backward_bytes"] == reference["gradients_bytes"]
            assert rank["bands"]["gradients_bytes"] == 0  # at the end of forward, without accumulation
            assert "CPU run" in rank["bands_unavailable"]["free_bytes"]
        assert stack_problems(record) == []


# --- a torchrun job on 4 H200s (benchmarks/multi_gpu_live.sh, benchmarks/results/h200x4/live/) ---


def test_a_rank_is_placed_on_the_gpu_that_holds_most_of_its_memory():
    """A rank may hold a small context on another rank's GPU: nvidia-smi during the job (nvidia_smi_during.txt)
    listed rank 1 (PID 979) with 610 MiB on GPU 2 and 11736 MiB on GPU 3. It trains on GPU 3, not on the first GPU
    that lists it."""
    from gpuanat.core.measure.samples import GpuSample, ProcessGpuMemory
    from gpuanat.core.watch.records import _gpu_of

    mib = 1 << 20

    def gpu(index: int, processes: dict[int, int]) -> GpuSample:
        return GpuSample(
            index=index,
            name="NVIDIA H200",
            used_bytes=sum(processes.values()) * mib,
            total_bytes=143771 * mib,
            reserved_bytes=None,
            gpu_util_percent=None,
            memory_util_percent=None,
            power_w=None,
            temperature_c=None,
            processes=tuple(ProcessGpuMemory(pid, used * mib) for pid, used in processes.items()),
        )

    gpus = [gpu(0, {}), gpu(1, {}), gpu(2, {978: 11738, 979: 610}), gpu(3, {979: 11736})]
    assert _gpu_of(gpus, {979}).index == 3
    assert _gpu_of(gpus, {978}).index == 2
    assert _gpu_of(gpus, {12345}) is None


def test_the_watch_dashboard_shows_rank_0s_gpu_of_a_recorded_torchrun_job():
    """The last record of `gpuanat watch TORCHRUN_PID --json` of that job: the ranks on GPUs 2 and 3, each with its
    own bands; the dashboard's charts follow rank 0's GPU."""
    from gpuanat.tui.screens.watch import _main_gpu

    record = json.loads((REPO / "tests" / "data" / "h200x4_watch_torchrun_record.json").read_text())
    assert [(rank["rank"], rank["gpu_index"]) for rank in record["ranks"]] == [(0, 2), (1, 3)]
    for rank in record["ranks"]:
        assert rank["bands"]["cuda_context_bytes"] > 0 and rank["bands"]["weights_bytes"] > 0
        assert all(value >= 0 for value in rank["bands"].values() if value is not None)
    assert _main_gpu(record)["index"] == 2
    # it follows the ranks, not the first GPU in use: listed the other way round, GPU 3 leads
    assert _main_gpu({**record, "ranks": list(reversed(record["ranks"]))})["index"] == 3
