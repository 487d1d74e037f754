"""Tests of the sampler against real processes, a real thread and, where present, real NVML.

No GPU here: host metrics are checked against live child processes, NVML against its absence,
and GPU behaviour through a trace recorded on an H100 (skipped until that trace is committed).
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import psutil
import pynvml
import pytest

from gpuanat.core.measure.nvml_source import PROCESS_UTILIZATION_REFRESH_S, NvmlSource, open_source, probe_nvml
from gpuanat.core.measure.process_tree import (
    DEFAULT_DESCENDANTS_REFRESH_S,
    DESCENDANTS_REFRESH_MAX_S,
    HostOnlySource,
    HostProcessMeter,
)
from gpuanat.core.measure.replay import ReplaySource
from gpuanat.core.measure.sampler import Sampler
from gpuanat.core.measure.samples import GpuSample, HostSample, ProcessGpuMemory, Sample

H100_TRACE = Path(__file__).parent / "data" / "nvml_trace_h100.jsonl"
WATCH_TRACE = Path(__file__).parent / "data" / "nvml_trace_watch_h200.jsonl"
MIB = 1024 * 1024


def _nvml_library_present() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


NVML_PRESENT = _nvml_library_present()

# Allocates 50 MiB of touched memory (bytes * n writes every page, so it is resident), reports
# ready, then keeps one core busy. On "spawn" on stdin it starts the same program as a grandchild
# and prints that grandchild's pid once the grandchild is ready.
BUSY_CHILD = textwrap.dedent(
    """
    import subprocess, sys, threading
    ballast = b"x" * (50 * 1024 * 1024)
    def spawn_on_request():
        for line in sys.stdin:
            grandchild = subprocess.Popen(
                [sys.executable, "-c", sys.argv[1], sys.argv[1]],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True,
            )
            grandchild.stdout.readline()
            print(grandchild.pid, flush=True)
    threading.Thread(target=spawn_on_request, daemon=True).start()
    print("ready", flush=True)
    while True:
        pass
    """
)


@pytest.fixture
def busy_child() -> Iterator[subprocess.Popen[str]]:
    child = subprocess.Popen(
        [sys.executable, "-c", BUSY_CHILD, BUSY_CHILD],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        yield child
    finally:
        # The session holds the child and any grandchild it spawned.
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def _spawn_grandchild(child: subprocess.Popen[str]) -> int:
    assert child.stdin is not None and child.stdout is not None
    child.stdin.write("spawn\n")
    child.stdin.flush()
    return int(child.stdout.readline())


class FailingDevice(HostOnlySource):
    """A test double of a device that fails on every other read (an NVML call erroring mid-run)."""

    def __init__(self) -> None:
        super().__init__()
        self.reads = 0

    def read(self, pids):
        self.reads += 1
        if self.reads % 2 == 0:
            raise RuntimeError(f"device fell off the bus on read {self.reads}")
        return super().read(pids)


def _gpu_sample(processes: tuple[ProcessGpuMemory, ...], index: int = 0) -> GpuSample:
    return GpuSample(
        index=index,
        name="NVIDIA H100 80GB HBM3",
        used_bytes=30 * 1024 * MIB,
        total_bytes=80 * 1024 * MIB,
        reserved_bytes=512 * MIB,
        gpu_util_percent=97.0,
        memory_util_percent=41.0,
        power_w=612.345,
        temperature_c=None,
        processes=processes,
    )


# --- host metrics against real processes ---


def test_host_rss_and_cpu_match_psutil_for_a_busy_child(busy_child):
    source = HostOnlySource()
    reference = psutil.Process(busy_child.pid)

    first = source.read([busy_child.pid]).host
    reference.cpu_percent(interval=None)
    # psutil needs two readings for a rate, so a process read for the first time counts 0.0.
    assert first.cpu_percent == 0.0
    time.sleep(0.5)
    second = source.read([busy_child.pid]).host
    reference_cpu_percent = reference.cpu_percent(interval=None)
    reference_rss_bytes = reference.memory_info().rss

    # The child's busy loop allocates nothing, so its RSS is flat: the two readings microseconds
    # apart may differ by a few pages at most.
    assert second.rss_bytes is not None and second.rss_bytes >= 50 * MIB
    assert abs(second.rss_bytes - reference_rss_bytes) < 2 * MIB
    # Both rates cover the same 0.5 s window give or take microseconds; CPU time is counted in
    # 10 ms ticks (2% of 0.5 s per reading), so 10 points covers ticks and scheduling noise.
    # The child spins, so it gets a fair share of a core even on a contended box: the reading
    # cannot agree with psutil merely by both being 0.
    assert second.cpu_percent is not None
    assert abs(second.cpu_percent - reference_cpu_percent) < 10
    assert second.cpu_percent > 20


def test_host_metrics_include_descendants_spawned_later(busy_child):
    source = HostOnlySource(descendants_refresh_s=0.1)
    child = psutil.Process(busy_child.pid)
    alone = source.read([busy_child.pid]).host

    grandchild = psutil.Process(_spawn_grandchild(busy_child))
    time.sleep(0.15)  # past the refresh interval, so the next read walks the tree again
    source.read([busy_child.pid])
    child.cpu_percent(interval=None)
    grandchild.cpu_percent(interval=None)
    time.sleep(0.4)
    both = source.read([busy_child.pid]).host
    reference_rss_bytes = child.memory_info().rss + grandchild.memory_info().rss
    reference_cpu_percent = child.cpu_percent(interval=None) + grandchild.cpu_percent(interval=None)

    assert alone.rss_bytes is not None and both.rss_bytes is not None
    # The grandchild holds its own 50 MiB ballast on top of the child's.
    assert both.rss_bytes - alone.rss_bytes >= 50 * MIB
    # Same tolerances as for one process, doubled for two (the grandchild's thread also idles).
    assert abs(both.rss_bytes - reference_rss_bytes) < 4 * MIB
    assert both.cpu_percent is not None
    assert abs(both.cpu_percent - reference_cpu_percent) < 20

    grandchild.kill()
    # The child never reaps it, so it stays a zombie, which holds no memory.
    deadline_s = time.monotonic() + 2.0
    while grandchild.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline_s:
        time.sleep(0.01)
    after = source.read([busy_child.pid]).host
    assert after.rss_bytes is not None and after.rss_bytes < both.rss_bytes - 40 * MIB


def test_a_tree_that_stays_the_same_is_walked_less_often_until_a_process_joins(busy_child):
    """Walking the tree reads every process on the machine: an unchanged tree is walked after 1, 2, 4, 4… s; a new
    descendant is still found, and brings the walks back to every second."""
    now_s = 0.0
    meter = HostProcessMeter(DEFAULT_DESCENDANTS_REFRESH_S, per_process=True, clock=lambda: now_s)
    walk = meter._walk_tree
    walked_at_s: list[float] = []

    def counted_walk(roots: frozenset[int]) -> dict[int, psutil.Process]:
        walked_at_s.append(now_s)
        return walk(roots)

    meter._walk_tree = counted_walk
    for tick in range(48):  # 12 s at the watch's 0.25 s
        now_s = tick * 0.25
        meter.measure([busy_child.pid])
    assert walked_at_s == [0.0, 1.0, 3.0, 7.0, 11.0]
    assert DESCENDANTS_REFRESH_MAX_S == 4.0

    grandchild = _spawn_grandchild(busy_child)
    seen_at_s = None
    for tick in range(48, 80):
        now_s = tick * 0.25
        if grandchild in {process.pid for process in meter.measure([busy_child.pid]).processes} and seen_at_s is None:
            seen_at_s = now_s
    assert seen_at_s == 15.0  # the wait of 4 s after the walk at 11 s
    assert walked_at_s[5:] == [15.0, 16.0, 18.0]  # changed: every second again, then doubling


def test_host_metrics_are_none_without_a_live_tracked_process():
    source = HostOnlySource()
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()
    assert source.read([]).host == HostSample(cpu_percent=None, rss_bytes=None)
    assert source.read([finished.pid]).host == HostSample(cpu_percent=None, rss_bytes=None)


# --- the sampler thread ---


def test_sampler_thread_paces_reads_off_the_main_thread_and_costs_little():
    samples: list[Sample] = []
    callback_threads: set[threading.Thread] = set()
    os_thread_names: set[str] = set()

    def on_sample(sample: Sample) -> None:
        callback_threads.add(threading.current_thread())
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", encoding="ascii") as comm:
            os_thread_names.add(comm.read().strip())
        samples.append(sample)

    sampler = Sampler(HostOnlySource(), interval_s=0.05, on_sample=on_sample)
    sampler.track(os.getpid())
    sampler.start()
    assert sampler.running
    time.sleep(1.0)
    sampler.stop()
    sampler.stop()  # idempotent
    count_at_stop = len(samples)
    time.sleep(0.15)

    assert not sampler.running
    assert len(samples) == count_at_stop, "no sample after stop"
    # 1.0 s at 0.05 s is 21 reads (one at start); a loaded CI box may lose a few ticks.
    assert 12 <= count_at_stop <= 22
    assert threading.main_thread() not in callback_threads
    assert os_thread_names == {"gpuanat-sampler"}  # `top -H` and benchmarks/tui_cost.py tell its CPU apart
    timestamps = [sample.t_s for sample in samples]
    assert timestamps == sorted(timestamps)
    assert all(sample.host.rss_bytes for sample in samples)
    # ~20 reads of a few /proc files each: milliseconds, far from the second it ran.
    assert 0 < sampler.cpu_seconds < 0.25
    assert sampler.last_error is None


def test_a_listener_gets_the_samples_until_removed_and_a_failing_one_stops_nobody():
    taken: list[Sample] = []
    listened: list[Sample] = []

    def failing(sample: Sample) -> None:
        raise RuntimeError("a consumer broke")

    sampler = Sampler(HostOnlySource(), interval_s=0.05, on_sample=taken.append)
    sampler.track(os.getpid())
    sampler.add_listener(failing)
    sampler.add_listener(listened.append)
    sampler.start()
    deadline = time.monotonic() + 10
    while len(listened) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    sampler.remove_listener(listened.append)
    sampler.remove_listener(failing)
    heard_before_removal = len(listened)
    time.sleep(0.3)
    sampler.stop()
    assert heard_before_removal >= 5
    assert len(listened) <= heard_before_removal + 1  # one sample may have been in hand at the removal
    assert len(taken) >= len(listened) + 4  # the sampler's own consumer went on
    assert listened == taken[: len(listened)]  # the same samples, in the same order
    assert sampler.last_error == "RuntimeError: a consumer broke"


def test_sampler_stamps_live_samples_with_its_clock():
    ticks = iter([100.0, 100.25, 100.5])
    sampler = Sampler(HostOnlySource(), on_sample=lambda sample: None, clock=lambda: next(ticks))
    assert [sampler.sample_once().t_s for _ in range(3)] == [100.0, 100.25, 100.5]


def test_sampler_thread_survives_a_failing_device_and_a_failing_callback():
    device = FailingDevice()
    samples: list[Sample] = []

    def on_sample(sample: Sample) -> None:
        samples.append(sample)
        if len(samples) == 1:
            raise ValueError("widget not mounted yet")

    sampler = Sampler(device, interval_s=0.02, on_sample=on_sample)
    sampler.track(os.getpid())
    sampler.start()
    deadline_s = time.monotonic() + 3.0
    while device.reads < 10 and time.monotonic() < deadline_s:
        time.sleep(0.02)
    still_running = sampler.running
    sampler.stop()

    assert device.reads >= 10
    assert still_running
    # Odd reads succeed; each reached the callback, the first of them raising itself.
    assert len(samples) >= device.reads // 2
    assert sampler.last_error is not None
    assert "RuntimeError: device fell off the bus" in sampler.last_error


def test_trace_written_by_the_sampler_replays_equal(tmp_path, busy_child):
    trace_path = tmp_path / "trace.jsonl"
    seen: list[Sample] = []
    sampler = Sampler(HostOnlySource(), interval_s=0.02, on_sample=seen.append, trace_path=trace_path)
    sampler.track(busy_child.pid)
    sampler.start()
    time.sleep(0.3)
    sampler.stop()
    seen.append(sampler.sample_once())  # synchronous reads are recorded too
    sampler.stop()

    lines = trace_path.read_text(encoding="utf-8").splitlines()
    assert len(lines) == len(seen) >= 5
    replay = ReplaySource(trace_path)
    assert [replay.read([]) for _ in range(len(seen))] == seen
    with pytest.raises(StopIteration):
        replay.read([])


def test_sampler_replays_a_trace_to_its_end_with_recorded_times(tmp_path):
    recorded = [
        Sample(
            t_s=10.0 + step * 0.25,
            gpus=(_gpu_sample((ProcessGpuMemory(pid=4242, used_bytes=(step + 1) * MIB),)),),
            host=HostSample(cpu_percent=101.5, rss_bytes=3 * 1024 * MIB),
        )
        for step in range(6)
    ]
    trace_path = tmp_path / "gpu_trace.jsonl"
    trace_path.write_text("".join(f"{json.dumps(sample.to_json())}\n" for sample in recorded), encoding="utf-8")
    live_pid = os.getpid()
    replayed: list[Sample] = []
    sampler = Sampler(
        ReplaySource(trace_path, remap_pids={4242: live_pid}),
        interval_s=0.01,
        on_sample=replayed.append,
        clock=lambda: pytest.fail("replayed samples keep their recorded time"),
    )
    sampler.start()
    deadline_s = time.monotonic() + 3.0
    while sampler.running and time.monotonic() < deadline_s:
        time.sleep(0.01)
    ended_by_itself = not sampler.running
    sampler.stop()

    assert ended_by_itself
    assert [sample.t_s for sample in replayed] == [sample.t_s for sample in recorded]
    assert [sample.process_used_bytes([live_pid]) for sample in replayed] == [(step + 1) * MIB for step in range(6)]
    assert all(sample.process_used_bytes([4242]) is None for sample in replayed)
    assert sampler.last_error is None


# --- the sample model ---


def test_sample_json_is_written_as_the_recorded_traces_were():
    """`to_json` runs at every sample (the watch keeps and records each one): the committed traces, written by it
    before it stopped going through dataclasses.asdict, come out key for key and value for value."""
    data = Path(__file__).resolve().parent / "data"
    for name in ("nvml_trace_watch_h200.jsonl", "nvml_trace_h100.jsonl"):
        lines = (data / name).read_text().splitlines()
        assert lines
        for line in lines:
            assert json.dumps(Sample.from_json(json.loads(line)).to_json(), separators=(",", ":")) == line


def test_sample_json_round_trips_exactly():
    sample = Sample(
        t_s=12345.678901234,
        gpus=(
            _gpu_sample((ProcessGpuMemory(pid=1, used_bytes=2**40 + 1), ProcessGpuMemory(2, None))),
            _gpu_sample((), index=1),
        ),
        host=HostSample(cpu_percent=None, rss_bytes=None),
    )
    assert Sample.from_json(json.loads(json.dumps(sample.to_json()))) == sample
    assert Sample.from_json(sample.to_json()) == sample


def test_process_used_bytes_sums_reported_usage_over_gpus():
    sample = Sample(
        t_s=0.0,
        gpus=(
            _gpu_sample((ProcessGpuMemory(10, 3 * MIB), ProcessGpuMemory(11, 5 * MIB))),
            _gpu_sample((ProcessGpuMemory(10, 7 * MIB), ProcessGpuMemory(12, None)), index=1),
        ),
        host=HostSample(cpu_percent=None, rss_bytes=None),
    )
    assert sample.process_used_bytes([10]) == 10 * MIB
    assert sample.process_used_bytes(iter([10, 11])) == 15 * MIB
    assert sample.process_used_bytes([12]) is None  # listed, usage not reported (MIG)
    assert sample.process_used_bytes([99]) is None
    no_gpu = Sample(t_s=0.0, gpus=(), host=sample.host)
    assert no_gpu.process_used_bytes([10]) is None


# --- NVML on this machine ---


@pytest.mark.skipif(NVML_PRESENT, reason="this machine has an NVIDIA driver")
def test_probe_without_a_driver_explains_and_open_source_falls_back():
    status = probe_nvml()
    assert not status.available
    assert status.reason is not None
    assert "driver" in status.reason and "libnvidia-ml" in status.reason
    assert status.gpu_names == ()

    source, opened_status = open_source()
    assert isinstance(source, HostOnlySource)
    assert opened_status == status
    assert source.read([os.getpid()]).gpus == ()


def test_open_source_without_nvml_does_not_touch_it():
    source, status = open_source(prefer_nvml=False)
    assert isinstance(source, HostOnlySource)
    assert not status.available and status.reason


def test_core_sampler_imports_without_torch_textual_or_pynvml():
    code = (
        "import sys, gpuanat.core.measure.sampler, gpuanat.core.measure.nvml_source, gpuanat.core.measure.replay\n"
        "print(sorted(m for m in ('torch', 'textual', 'pynvml') if m in sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


@pytest.mark.gpu
@pytest.mark.skipif(not NVML_PRESENT, reason="needs an NVIDIA driver")
def test_nvml_source_reads_every_gpu_consistently():
    status = probe_nvml()
    assert status.available, status.reason
    source, opened_status = open_source()
    try:
        assert isinstance(source, NvmlSource)
        assert opened_status == status
        sample = source.read([os.getpid()])
    finally:
        source.close()
        source.close()
    assert tuple(gpu.name for gpu in sample.gpus) == status.gpu_names
    for gpu in sample.gpus:
        assert gpu.used_bytes is not None and gpu.total_bytes is not None
        assert 0 <= gpu.used_bytes <= gpu.total_bytes
        if gpu.reserved_bytes is not None:
            assert gpu.used_bytes + gpu.reserved_bytes <= gpu.total_bytes
    assert sample.host.rss_bytes is not None


class RecordedNvml:
    """NVML's readings as an H200 gave them to `gpuanat watch` (tests/data/nvml_trace_watch_h200.jsonl), through
    pynvml's names: `at` picks the recorded sample the readings return. No GPU here, so this stands in for the driver
    under the real `NvmlSource`; it counts the per-process utilization reads and the timestamps they ask from."""

    NVMLError = pynvml.NVMLError
    nvmlMemory_v2 = pynvml.nvmlMemory_v2
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU

    def __init__(self, trace: Path) -> None:
        self.samples = [json.loads(line) for line in trace.read_text().splitlines() if line.strip()]
        self.at = 0
        self.process_utilization_asked_from_us: list[int] = []

    def _gpu(self, handle: int) -> dict:
        return self.samples[self.at]["gpus"][handle]

    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        pass

    def nvmlDeviceGetCount(self) -> int:
        return len(self.samples[0]["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetName(self, handle: int) -> str:
        return self._gpu(handle)["name"]

    def nvmlDeviceGetMemoryInfo(self, handle: int, version: object = None) -> SimpleNamespace:
        gpu = self._gpu(handle)
        return SimpleNamespace(used=gpu["used_bytes"], total=gpu["total_bytes"], reserved=gpu["reserved_bytes"])

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> SimpleNamespace:
        gpu = self._gpu(handle)
        return SimpleNamespace(gpu=gpu["gpu_util_percent"], memory=gpu["memory_util_percent"])

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return round(self._gpu(handle)["power_w"] * 1000)

    def nvmlDeviceGetTemperatureV(self, handle: int, sensor: int) -> float:
        return self._gpu(handle)["temperature_c"]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: int) -> list[SimpleNamespace]:
        return [
            SimpleNamespace(pid=entry["pid"], usedGpuMemory=entry["used_bytes"])
            for entry in self._gpu(handle)["processes"]
        ]

    def nvmlDeviceGetProcessUtilization(self, handle: int, since_us: int) -> list[SimpleNamespace]:
        self.process_utilization_asked_from_us.append(since_us)
        return [
            SimpleNamespace(
                pid=entry["pid"],
                smUtil=entry["sm_util_percent"],
                memUtil=entry["memory_util_percent"],
                timeStamp=1_000_000 + 250_000 * self.at,
            )
            for entry in self._gpu(handle)["process_utilization"]
        ]


def test_per_process_gpu_utilization_is_read_once_a_second_and_carried_between():
    nvml = RecordedNvml(WATCH_TRACE)
    clock = itertools.count(step=0.25)
    source = NvmlSource(per_process=True, nvml=nvml, clock=lambda: next(clock))
    samples = []
    for at in range(12):  # 3 s at the watch's 0.25 s
        nvml.at = at
        samples.append(source.read([os.getpid()]))
    source.close()

    assert PROCESS_UTILIZATION_REFRESH_S == 1.0
    assert nvml.process_utilization_asked_from_us == [0, 1_000_000, 2_000_000]  # then from the newest seen
    recorded_sm = [nvml.samples[at]["gpus"][0]["process_utilization"][0]["sm_util_percent"] for at in range(12)]
    assert len(set(recorded_sm[:12:4])) > 1  # the recording changes between the reads the test compares
    for at, sample in enumerate(samples):
        (gpu,) = sample.gpus
        assert gpu.gpu_util_percent == nvml.samples[at]["gpus"][0]["gpu_util_percent"]  # the rest at every sample
        (entry,) = gpu.process_utilization
        assert entry.pid == 453
        assert entry.sm_util_percent == recorded_sm[at - at % 4]


def test_per_process_gpu_utilization_is_not_read_unless_asked():
    nvml = RecordedNvml(WATCH_TRACE)
    source = NvmlSource(per_process=False, nvml=nvml)
    sample = source.read([os.getpid()])
    source.close()
    assert nvml.process_utilization_asked_from_us == []
    assert sample.gpus[0].process_utilization is None
    assert sample.gpus[0].used_bytes == nvml.samples[0]["gpus"][0]["used_bytes"]


# --- a trace recorded on an H100 ---


@pytest.mark.skipif(not H100_TRACE.exists(), reason=f"{H100_TRACE.name} not recorded on a GPU yet")
def test_h100_trace_replays_with_the_invariants_of_real_nvml_data():
    source = ReplaySource(H100_TRACE)
    replayed: list[Sample] = []
    sampler = Sampler(source, interval_s=0.001, on_sample=replayed.append)
    sampler.start()
    deadline_s = time.monotonic() + 5.0
    while sampler.running and time.monotonic() < deadline_s:
        time.sleep(0.01)
    sampler.stop()

    assert len(replayed) == len(source) > 1
    assert sampler.last_error is None
    timestamps = [sample.t_s for sample in replayed]
    assert all(later > earlier for earlier, later in itertools.pairwise(timestamps))
    assert all(sample.gpus for sample in replayed)
    assert any(gpu.processes for sample in replayed for gpu in sample.gpus)
    for sample in replayed:
        for gpu in sample.gpus:
            assert gpu.used_bytes is not None and gpu.total_bytes is not None
            assert 0 <= gpu.used_bytes <= gpu.total_bytes
            processes_used_bytes = sum(p.used_bytes or 0 for p in gpu.processes)
            assert processes_used_bytes <= gpu.used_bytes


class RecordedNvmlWithEnergy(RecordedNvml):
    """`RecordedNvml` over the H100's GPM recording (tests/data/gpm_h100_workloads.jsonl), with its energy counter:
    each read counted."""

    def __init__(self, trace: Path) -> None:
        super().__init__(trace)
        self.energy_reads = 0

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> int:
        self.energy_reads += 1
        return self._gpu(handle)["energy_mj"]


def test_the_energy_counter_is_read_every_five_seconds_and_only_that_sample_carries_it():
    """The counter costs 3.1 ms of CPU a read on the H100 (the rest of a sample 0.15 ms): `ENERGY_REFRESH_S`."""
    from gpuanat.core.measure.nvml_source import ENERGY_REFRESH_S

    nvml = RecordedNvmlWithEnergy(Path(__file__).resolve().parent / "data" / "gpm_h100_workloads.jsonl")
    clock = itertools.count(step=0.25)
    source = NvmlSource(per_process=False, nvml=nvml, clock=lambda: next(clock))
    samples = []
    for at in range(48):  # 12 s at the watch's 0.25 s
        nvml.at = at
        samples.append(source.read([]))
    source.close()
    assert ENERGY_REFRESH_S == 5.0
    assert nvml.energy_reads == 3  # at 0, 5 and 10 s
    carried = [at for at, sample in enumerate(samples) if sample.gpus[0].energy_mj is not None]
    assert carried == [0, 20, 40]
    assert [samples[at].gpus[0].energy_mj for at in carried] == [
        nvml.samples[at]["gpus"][0]["energy_mj"] for at in carried
    ]
