"""Several ranks on the CPU: DDP over 2 real processes (gloo), started by torchrun through the rank launcher.

Each test runs the real `gpuanat run --nproc 2`; every process of the run carries a marker in its environment, so
the test can find them all — torchrun starts each rank in a session of its own — and check that none is left.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest
from conftest import (
    TINY_CPU,
    last_json,
    run_cli,
    start_cli,
    state_bytes,
    tiny_model_reference,
    wait_for_steps,
)
from result_golden import assert_as_recorded

from gpuanat.worker.lifeline import PARENT_GONE_GRACE_S

TWO_RANKS = [*TINY_CPU, "--nproc", "2"]
LONG_TWO_RANKS = [*TWO_RANKS, "--samples", "200000"]
"""Trains for far longer than any test waits: the test ends it."""
MARKER = "GPUANAT_TEST_RUN_MARKER"


def _marked(marker: str) -> list[psutil.Process]:
    """Every live process whose environment carries `marker`."""
    found = []
    for process in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if process.environ().get(MARKER) == marker and process.status() != psutil.STATUS_ZOMBIE:
                found.append(process)
    return found


def _ranks(marker: str, count: int, timeout_s: float = 180) -> dict[int, psutil.Process]:
    """The rank processes (RANK in their environment), once `count` of them run."""
    deadline = time.monotonic() + timeout_s
    while True:
        ranks = {}
        for process in _marked(marker):
            with contextlib.suppress(psutil.Error):
                rank = process.environ().get("RANK")  # torchrun sets it for the ranks alone
                if rank is not None:
                    ranks[int(rank)] = process
        if len(ranks) == count:
            return ranks
        assert time.monotonic() < deadline, f"{count} ranks did not start (found {sorted(ranks)})"
        time.sleep(0.2)


def _assert_none_left(marker: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (left := _marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    assert left == [], f"left behind: {[(p.pid, p.cmdline()[:4]) for p in left]}"


def _marker() -> tuple[str, dict[str, str]]:
    marker = uuid.uuid4().hex
    return marker, {MARKER: marker}


def test_ddp_on_two_cpu_ranks_holds_the_whole_model_on_each_and_counts_every_sample(db_path):
    marker, env = _marker()
    completed = run_cli(["run", *TWO_RANKS, "--json"], db_path, extra_env=env)
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert result["status"] == "ok"
    assert result["config"]["distributed"] == "ddp" and result["config"]["nproc"] == 2  # ddp: the default for 2
    assert_as_recorded("ddp_two_ranks", result)
    reference = tiny_model_reference()
    ranks = result["ranks"]
    assert [rank["rank"] for rank in ranks] == [0, 1]
    assert len({rank["pid"] for rank in ranks}) == 2
    for rank in ranks:
        # DDP replicates: every rank holds all weights, all gradients and all optimizer state, byte for byte.
        assert rank["status"] == "ok"
        assert state_bytes(rank) == {band: reference[band] for band in state_bytes(rank)}, rank["rank"]
        assert rank["samples"] == 16  # the sampler gives each rank half of the 32
    assert result["samples"] == 32
    assert result["steady_samples_per_second"] == pytest.approx(
        sum(rank["steady_samples_per_second"] for rank in ranks)
    )
    assert result["bands"] == ranks[0]["bands"]  # the top level is rank 0's
    _assert_none_left(marker, timeout_s=10)


@contextlib.contextmanager
def training_on_two_ranks(db_path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A long `gpuanat run --nproc 2 --json`, once it has recorded 3 steps: (its marker, the gpuanat process), which
    is killed at the end if the test left it running."""
    marker, env = _marker()
    process = start_cli(["run", *LONG_TWO_RANKS, "--json"], db_path, extra_env=env)
    try:
        wait_for_steps(db_path, 3, psutil.Process(process.pid))
        yield marker, process
    finally:
        if process.poll() is None:
            process.kill()


def test_a_rank_killed_mid_run_fails_the_run_and_ends_the_other_rank(db_path):
    with training_on_two_ranks(db_path) as (marker, process):
        _ranks(marker, 2)[1].kill()
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr[-3000:]
    result = last_json(stdout)
    assert result["status"] == "failed"
    by_rank = {rank["rank"]: rank for rank in result["ranks"]}
    assert by_rank[1]["status"] == "failed" and "rank 1" in by_rank[1]["error"]["message"]
    # Rank 0 ended too, and said how: its all-reduce lost its peer (gloo: "Connection reset by peer"), or torchrun
    # stopped it first. Either way the run's error is the cause, rank 1's death.
    assert by_rank[0]["status"] in ("failed", "stopped")
    assert result["error"]["kind"] == "exited" and result["error"]["message"].startswith("rank 1")
    assert result["steps"] >= 3
    _assert_none_left(marker, timeout_s=10)


def test_a_rank_stuck_when_its_peer_dies_is_ended_without_waiting_for_torchrun(db_path):
    """On GPUs a rank whose peer died waits in its collective (NCCL), and torchrun SIGKILLs it only after 30 s: on 2
    H200s its GPU stayed held 31 s. Rank 0 stopped here (SIGSTOP: stuck, as in a collective) and rank 1 killed,
    gpuanat's launcher ends rank 0 itself, and says so."""
    with training_on_two_ranks(db_path) as (marker, process):
        ranks = _ranks(marker, 2)
        ranks[0].suspend()
        ranks[1].kill()
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 1, stderr[-3000:]
    result = last_json(stdout)
    by_rank = {rank["rank"]: rank for rank in result["ranks"]}
    assert result["status"] == "failed" and result["error"]["message"].startswith("rank 1")
    assert by_rank[0]["status"] == "failed"
    assert "was ended by gpuanat 5 s after rank 1 failed" in by_rank[0]["error"]["message"]
    _assert_none_left(marker, timeout_s=10)


@pytest.mark.parametrize("number", [signal.SIGINT, signal.SIGTERM])
def test_stopping_a_distributed_run_stops_every_rank_and_leaves_no_process(db_path, number):
    with training_on_two_ranks(db_path) as (marker, process):
        process.send_signal(number)
        stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + number, stderr[-3000:]
    result = last_json(stdout)
    assert result["status"] == "stopped" and result["steps"] >= 3
    assert [rank["status"] for rank in result["ranks"]] == ["stopped", "stopped"]
    _assert_none_left(marker, timeout_s=10)


def test_a_rank_whose_collective_broke_as_the_user_stopped_the_run_says_stopped():
    """A stop reaches the ranks a step apart: the one still in its all-reduce loses its peer and says so (gloo's
    "Connection closed by peer"). In a run the user stopped that rank stopped too, its error kept; out of memory
    stays out of memory, and outside a stop an error is a failure."""
    from gpuanat.core.measure.run_state import RankEvents, rank_status
    from gpuanat.core.vocabulary.protocol import Error

    broken = RankEvents()
    broken.observe(Error(kind="exception", message="RuntimeError: [gloo] Connection closed by peer", step=7))
    out_of_memory = RankEvents()
    out_of_memory.observe(Error(kind="oom", message="CUDA out of memory", step=7))
    silent = RankEvents()
    assert [rank_status(state, stopped_by_user=True) for state in (broken, out_of_memory, silent)] == [
        "stopped",
        "oom",
        "stopped",
    ]
    assert [rank_status(state) for state in (broken, out_of_memory, silent)] == ["failed", "oom", "failed"]


def test_a_sigkilled_gpuanat_takes_the_launcher_torchrun_and_every_rank_with_it(db_path):
    with training_on_two_ranks(db_path) as (marker, process):
        _ranks(marker, 2)
        process.kill()
        process.wait(timeout=10)
    _assert_none_left(marker, timeout_s=2 * PARENT_GONE_GRACE_S + 10)


@pytest.mark.parametrize("ranks", [1, 2])
def test_the_accelerate_engine_trains_the_docs_loop_with_the_same_probe(db_path, ranks):
    """--engine accelerate: the docs' custom loop, alone and over 2 CPU ranks (the Accelerator picks DDP up from
    torchrun), measured by the same probe: the same exact bands as Trainer, every sample counted."""
    marker, env = _marker()
    completed = run_cli(
        ["run", *TINY_CPU, "--nproc", str(ranks), "--engine", "accelerate", "--grad-accum", "2", "--json"],
        db_path,
        extra_env=env,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    assert result["status"] == "ok" and result["config"]["engine"] == "accelerate"
    reference = tiny_model_reference()
    assert len(result["ranks"]) == ranks
    for rank in result["ranks"]:
        assert state_bytes(rank) == {band: reference[band] for band in state_bytes(rank)}, rank["rank"]
        assert rank["bands"]["activations_bytes"] > 0
        assert rank["bands"]["gradients_bytes"] == reference["gradients_bytes"]  # accumulating: alive
    assert result["samples"] == 32
    assert result["steps"] == 32 // (4 * 2 * ranks)  # batch 4, accumulation 2, split over the ranks
    assert result["train_loss"] is not None and result["samples_per_second"] > 0
    _assert_none_left(marker, timeout_s=10)


def test_of_two_ranks_that_ended_without_a_word_the_first_to_end_is_the_cause():
    """CI caught the race: torchrun ended rank 0 before it could report its collective's failure, so both ranks
    ended silently and the run blamed rank 0, the lower. The launcher now reports them in the order their
    connections closed, and the run takes the earlier of two errors of one kind."""
    from gpuanat.core.measure.result import RankRecord, first_cause
    from gpuanat.core.vocabulary.protocol import Error

    killed, stopped_after = RankRecord(), RankRecord()
    killed.observe(Error(kind="exited", message="rank 1 (pid 11) ended without finishing"))
    stopped_after.observe(Error(kind="exited", message="rank 0 (pid 10) ended without finishing after rank 1 did"))
    assert first_cause([stopped_after, killed]).message.startswith("rank 1")  # rank order: 0, 1
    out_of_memory = RankRecord()
    out_of_memory.observe(Error(kind="oom", message="rank 0: CUDA out of memory"))
    assert first_cause([out_of_memory, killed]).kind == "oom"  # the kind decides first


def test_fsdp2_is_asked_of_trainer_in_its_current_form():
    """FSDP2's TrainingArguments: `fsdp=True` with everything in `fsdp_config` (transformers 5 deprecates the string
    form, "full_shard", and says it will remove it), each decoder layer a unit, resharded after forward."""
    import torch
    from transformers import AutoModelForCausalLM, TrainingArguments

    from gpuanat.core.vocabulary.config import RunConfig
    from gpuanat.core.vocabulary.presets import PRESETS
    from gpuanat.worker.model import preset_model_config
    from gpuanat.worker.train import distributed_arguments

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(preset_model_config(PRESETS["llama-tiny"]))
    arguments = distributed_arguments(RunConfig(preset="llama-tiny", gpus="2", distributed="fsdp"), model)
    assert arguments["fsdp"] is True
    built = TrainingArguments(output_dir="/tmp/gpuanat-fsdp-arguments", **arguments)
    assert built.fsdp_config["version"] == 2 and built.fsdp_config["reshard_after_forward"] is True
    assert built.fsdp_config["transformer_layer_cls_to_wrap"] == ["LlamaDecoderLayer"]
