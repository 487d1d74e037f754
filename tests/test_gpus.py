"""Choosing the GPUs of a run, and reading each rank's GPU out of NVML samples recorded on 2 H200s.

The GPUs are the two of the H200×2 machine as NVML listed them in tests/data/h200x2_ddp_trace.jsonl (recorded by
`gpuanat run --gpus 2 --distributed ddp --trace-out`, benchmarks/multi_gpu_check.sh); their use varies per test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import run_cli

from gpuanat.core.measure.gpus import (
    DEVICE_ORDER_VARIABLE,
    VISIBLE_DEVICES_VARIABLE,
    Gpu,
    child_gpu_environment,
    choose_gpus,
    gpus_for_run,
    rank_file_path,
)
from gpuanat.core.measure.result import RankRecord
from gpuanat.core.measure.samples import Sample
from gpuanat.core.vocabulary.config import Capabilities, RunConfig
from gpuanat.core.vocabulary.errors import ConfigError
from gpuanat.core.vocabulary.gpu_request import parse_gpus
from gpuanat.core.vocabulary.validation import machine_unsupported_reason, validate_values

TRACE = Path(__file__).parent / "data" / "h200x2_ddp_trace.jsonl"
RANK_PIDS = {0: 1011, 1: 1012}
"""The ranks' PIDs in that trace (benchmarks/results/h200x2/multi/results.jsonl, technique ddp)."""


def _samples() -> list[Sample]:
    return [Sample.from_json(json.loads(line)) for line in TRACE.read_text().splitlines()]


def _recorded_gpus(processes: tuple[int, ...] = (0, 0), count: int = 2) -> list[Gpu]:
    """The trace's GPUs, `processes[i]` compute processes on GPU i (more GPUs: copies with higher indices)."""
    first = _samples()[0].gpus[0]
    return [
        Gpu(
            index=i,
            uuid=f"GPU-{i:08x}-h200",
            name=first.name,
            total_bytes=first.total_bytes,
            used_bytes=(processes[i] if i < len(processes) else 0) * (4 << 30) + (3 << 20),
            processes=processes[i] if i < len(processes) else 0,
        )
        for i in range(count)
    ]


def test_the_default_is_one_gpu_the_first_idle_one():
    assert [gpu.index for gpu in choose_gpus(None, _recorded_gpus((0, 0)), {}).gpus] == [0]
    busy_first = choose_gpus(None, _recorded_gpus((1, 0)), {})
    assert [gpu.index for gpu in busy_first.gpus] == [1] and busy_first.note is None


def test_with_every_gpu_busy_the_least_used_is_taken_and_the_user_told():
    gpus = _recorded_gpus((2, 1))
    choice = choose_gpus(None, gpus, {})
    assert [gpu.index for gpu in choice.gpus] == [1]
    assert "GPU 1 (1 other process)" in choice.note and "--gpus" in choice.note


def test_counts_lists_and_all():
    gpus = _recorded_gpus((0, 1, 0, 0), count=4)
    assert [gpu.index for gpu in choose_gpus("2", gpus, {}).gpus] == [0, 2]  # idle ones first
    assert [gpu.index for gpu in choose_gpus("3,1", gpus, {}).gpus] == [3, 1]  # a list is taken as given, in order
    assert [gpu.index for gpu in choose_gpus("all", gpus, {}).gpus] == [0, 1, 2, 3]
    assert [gpu.index for gpu in choose_gpus("2,", gpus, {}).gpus] == [2]  # one particular GPU


def test_the_users_cuda_visible_devices_narrows_the_choice():
    gpus = _recorded_gpus((0, 0, 0, 0), count=4)
    assert [gpu.index for gpu in choose_gpus(None, gpus, {VISIBLE_DEVICES_VARIABLE: "2,3"}).gpus] == [2]
    assert [gpu.index for gpu in choose_gpus("all", gpus, {VISIBLE_DEVICES_VARIABLE: "GPU-00000003,1"}).gpus] == [3, 1]
    with pytest.raises(ConfigError, match="CUDA_VISIBLE_DEVICES=2,3 allows 2"):
        choose_gpus("3", gpus, {VISIBLE_DEVICES_VARIABLE: "2,3"})


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0,0", "listed twice"),
        ("x", "a count"),
        ("0", "a count"),
        ("1,a", "NVML indices"),
        ("65", "at most 64"),
    ],
)
def test_bad_specs_are_refused_with_what_to_write(spec, message):
    with pytest.raises(ConfigError, match=message):
        parse_gpus(spec)


def test_requests_the_machine_cannot_meet_are_refused_before_anything_starts():
    gpus = _recorded_gpus()
    with pytest.raises(ConfigError, match="no GPU 5 here: NVML lists 2"):
        choose_gpus("5,", gpus, {})
    with pytest.raises(ConfigError, match="3 GPUs asked for, but NVML lists 2"):
        choose_gpus("3", gpus, {})
    with pytest.raises(ConfigError, match="ddp spreads a run over several GPUs"):
        gpus_for_run(RunConfig(gpus="all", distributed="ddp"), {}, gpus[:1])
    with pytest.raises(ConfigError, match="none trains on one GPU; with 2"):
        gpus_for_run(RunConfig(gpus="all"), {}, gpus)


def test_the_child_sees_exactly_its_gpus_in_nvml_order():
    choice = choose_gpus("1,0", _recorded_gpus(), {})
    environment = child_gpu_environment(choice, RunConfig(gpus="1,0", distributed="ddp"), {})
    assert environment == {VISIBLE_DEVICES_VARIABLE: "1,0", DEVICE_ORDER_VARIABLE: "PCI_BUS_ID"}
    # Without NVML a one-rank run still sees one GPU alone: Trainer never wraps it in DataParallel.
    narrowed = child_gpu_environment(None, RunConfig(), {VISIBLE_DEVICES_VARIABLE: "3,1"})
    assert narrowed == {VISIBLE_DEVICES_VARIABLE: "3"}
    assert child_gpu_environment(None, RunConfig(), {}) == {VISIBLE_DEVICES_VARIABLE: "0"}
    assert child_gpu_environment(None, RunConfig(device="cpu"), {}) == {}


def test_each_rank_reads_its_own_gpu_from_the_recorded_h200_trace():
    ranks = {rank: RankRecord(gpu_index=rank) for rank in RANK_PIDS}
    for sample in _samples():
        for rank, state in ranks.items():
            state.observe_sample(sample, RANK_PIDS[rank])
    samples = _samples()
    for rank, state in ranks.items():
        device_peak = max(sample.gpus[rank].used_bytes for sample in samples)
        process_peak = max(
            process.used_bytes
            for sample in samples
            for process in sample.gpus[rank].processes
            if process.pid == RANK_PIDS[rank]
        )
        assert state.peak_device_used_bytes == device_peak
        assert state.peak_process_used_bytes == process_peak
    # Each rank held ~15.6 GiB on its own GPU; summed over both GPUs (the old reading) it would be twice that.
    assert ranks[1].peak_process_used_bytes < 1.1 * ranks[0].peak_process_used_bytes
    mixed = RankRecord(gpu_index=0)
    for sample in samples:
        mixed.observe_sample(sample, RANK_PIDS[1])  # rank 1's pid is never on GPU 0
    assert mixed.peak_process_used_bytes is None


def test_gpus_nproc_and_distributed_must_agree():
    for config, flag, message in [
        (RunConfig(device="cpu", gpus="2"), "--gpus", "--nproc N"),
        (RunConfig(nproc=2), "--nproc", "use --gpus N"),
        (RunConfig(device="cpu", distributed="ddp"), "--distributed", "add --nproc 2"),
        (RunConfig(distributed="fsdp"), "--distributed", "add --gpus 2"),
        (RunConfig(gpus="2"), "--distributed", "none trains on one rank; with 2"),
        (RunConfig(device="cpu", nproc=2, distributed="zero2"), "--distributed", "on the CPU use ddp"),
        (RunConfig(device="cpu", nproc=0), "--nproc", "≥ 1"),
        (RunConfig(gpus="2", distributed="fsdp", engine="accelerate"), "--engine", "fsdp trains with --engine trainer"),
    ]:
        with pytest.raises(ConfigError, match=message) as raised:
            validate_values(config)
        assert raised.value.flag == flag


def test_zero_without_deepspeed_is_refused_with_how_to_install_it():
    capabilities = Capabilities(
        torch_version="2.11.0",
        cuda_available=True,
        cuda_compute_capability=(9, 0),
        deepspeed_error="deepspeed is not installed",
    )
    flag, reason = machine_unsupported_reason(RunConfig(gpus="2", distributed="zero2"), capabilities)
    assert flag == "--distributed" and "pip install deepspeed" in reason and "not installed" in reason
    assert machine_unsupported_reason(RunConfig(gpus="2", distributed="ddp"), capabilities) is None


def test_bad_combinations_are_one_line_and_exit_2_before_torch(db_path):
    completed = run_cli(["run", "--device", "cpu", "--gpus", "2"], db_path, timeout_s=60)
    assert completed.returncode == 2
    assert completed.stderr.strip() == (
        "gpuanat: error: --gpus: this run is on the cpu; spread it over processes with --nproc N"
    )


@pytest.mark.parametrize(
    ("path", "rank", "expected"),
    [
        ("/tmp/run.pickle", None, "/tmp/run.pickle"),
        ("/tmp/run.pickle", "0", "/tmp/run.pickle"),
        ("/tmp/run.pickle", "3", "/tmp/run.rank3.pickle"),
        ("/tmp/trace.json.gz", "1", "/tmp/trace.json.rank1.gz"),
        ("/tmp/no_suffix", "2", "/tmp/no_suffix.rank2"),
        ("/tmp/dotted.dir/file", "1", "/tmp/dotted.dir/file.rank1"),
        ("/tmp/run.pickle", "garbage", "/tmp/run.pickle"),
        (None, "1", None),
    ],
)
def test_each_rank_writes_its_own_file(path: str | None, rank: str | None, expected: str | None) -> None:
    """A file named once for the whole run (--memory-snapshot, --profile-ops-trace) is written by every rank: rank 0
    and a single process keep the name, rank N > 0 puts `.rankN` before the suffix."""
    environment = {} if rank is None else {"RANK": rank}
    assert rank_file_path(path, environment) == expected
