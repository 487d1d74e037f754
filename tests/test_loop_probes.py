"""The probe for loops other than HF Trainer's, for real: tests/scripts/tiny_plain_loop.py and tiny_lightning.py
train the tiny BERT on the CPU with a plain PyTorch loop (`gpuanat.probe.track`) and with PyTorch Lightning
(`LightningAnatomyCallback`), in real subprocesses — launched by `gpuanat run --script` and watched by PID with
`gpuanat watch PID --json` — and the watch names the probe each script needs, or says it waits for it.

Byte counts are checked against the same model counted in this process (`tiny_model_reference`).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, cli_env, last_json, start_cli, start_torchrun_job, state_bytes, tiny_model_reference

from gpuanat.core.measure.anatomy import stack_problems
from gpuanat.core.store.history import HistoryStore
from gpuanat.core.watch.loop_kind import probe_hint, script_of

pytestmark = pytest.mark.xdist_group("test_loop_probes")
"""Its tests share a module-scoped real run: pytest-xdist gives them all to one worker (`--dist loadgroup`)."""

SCRIPTS = {
    "plain": REPO / "tests" / "scripts" / "tiny_plain_loop.py",
    "lightning": REPO / "tests" / "scripts" / "tiny_lightning.py",
}
RUNS = {  # 64 samples in batches of 4: 16 optimizer steps, 8 with accumulation over 2
    "plain": (SCRIPTS["plain"], ["--probe"]),
    "plain_accum": (SCRIPTS["plain"], ["--probe", "--grad-accum", "2"]),
    "accelerate_accum": (SCRIPTS["plain"], ["--probe", "--accelerate", "--grad-accum", "2"]),
    "lightning": (SCRIPTS["lightning"], ["--probe"]),
    "lightning_accum": (SCRIPTS["lightning"], ["--probe", "--grad-accum", "2"]),
    "plain_fails": (SCRIPTS["plain"], ["--probe", "--fail-at-step", "3"]),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    db = tmp_path_factory.mktemp("loops") / "history.sqlite"
    processes = {
        name: start_cli(["run", "--json", "--script", str(script), "--", *args], db)
        for name, (script, args) in RUNS.items()
    }
    outputs = {}
    for name, process in processes.items():
        stdout, stderr = process.communicate(timeout=600)
        outputs[name] = (process.returncode, last_json(stdout), stderr)
    return {**outputs, "db": db}


@pytest.mark.parametrize("name", ["plain", "plain_accum", "accelerate_accum", "lightning", "lightning_accum"])
def test_each_loop_s_probe_gives_the_whole_anatomy(results, name):
    db, (returncode, result, stderr) = results["db"], results[name]
    assert returncode == 0, stderr[-3000:]
    reference = tiny_model_reference()
    accumulating = name.endswith("_accum")
    assert result["status"] == "ok" and result["params"] == reference["params"]
    loop = name.removesuffix("_accum")
    assert result["config"]["loop"] == ("plain" if loop == "accelerate" else loop)  # Accelerate's: a loop of its own
    assert result["steps"] == (8 if accumulating else 16) and result["samples"] == 64
    assert state_bytes(result) == {band: reference[band] for band in state_bytes(result)}
    # one moment, the end of a forward pass: accumulation keeps the first micro-batch's gradients alive then
    assert result["bands"]["gradients_bytes"] == (reference["gradients_bytes"] if accumulating else 0)
    assert result["bands"]["activations_bytes"] > 0
    assert stack_problems(result) == []
    assert result["steady_samples_per_second"] > 0 and result["samples_per_second"] > 0
    assert result["train_runtime_s"] > 0 and result["train_loss"] is not None
    assert result["probe_cost_percent"] is not None
    # every step is timed by phase, the forward pass included (Lightning's from its hooks, not the model's)
    with HistoryStore(db) as store:
        steps = store.steps(result["run_id"])
    assert [step["step"] for step in steps] == list(range(1, result["steps"] + 1))
    for step in steps[1:]:
        phases = step["phases_s"]
        assert phases["forward"] > 0 and phases["backward"] > 0 and phases["optimizer"] > 0, (name, step)
        assert sum(phases.values()) == pytest.approx(step["step_time_s"], rel=0, abs=5e-6)  # one stamp ends both


def test_a_loop_that_raises_ends_failed_with_its_error_as_written(results):
    returncode, result, _stderr = results["plain_fails"]
    assert returncode != 0
    assert result["status"] == "failed"
    assert result["error"]["kind"] == "exception" and result["error"]["step"] == 3
    # the script's message, exact bytes in the JSON (markup-like text and all)
    assert result["error"]["message"] == "RuntimeError: the loss went [red]NaN[/] at step 3"
    assert result["steps"] == 2


def _start_script(tmp_path: Path, script: Path, *args: str) -> tuple[subprocess.Popen[str], dict[str, str]]:
    runtime_dir = tmp_path / "runtime"
    runtime_dir.mkdir(mode=0o700, exist_ok=True)
    env = {**cli_env(tmp_path / "history.sqlite", offline_hub=True), "XDG_RUNTIME_DIR": str(runtime_dir)}
    process = subprocess.Popen(
        [sys.executable, str(script), *args],
        env=env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    return process, env


def _watch(pid: int, env: dict[str, str], *args: str, timeout_s: float = 240) -> list[dict]:
    watcher = subprocess.run(
        [sys.executable, "-m", "gpuanat", "watch", str(pid), "--json", *args],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert watcher.returncode == 0, watcher.stderr
    return [json.loads(line) for line in watcher.stdout.splitlines()]


@pytest.mark.parametrize("loop", ["plain", "lightning"])
def test_a_loop_with_its_probe_is_watched_with_its_anatomy(tmp_path, loop):
    # started with the script (a watcher started later can miss a short run on a loaded machine)
    script, env = _start_script(tmp_path, SCRIPTS[loop], "--probe", "--samples", "240", "--hold-s", "1")
    try:
        records = _watch(script.pid, env)
    finally:
        script.kill()
        script.wait()
    *samples, final = records
    reference = tiny_model_reference()
    published = [record for record in samples if record["published"] and record["bands_measured_at_step"]]
    assert published, "no record saw the probe's bands"
    for record in published:
        assert record["publisher_pid"] == script.pid
        assert state_bytes(record)["weights_bytes"] == reference["weights_bytes"]
        assert record["gradients_after_backward_bytes"] == reference["gradients_bytes"]
        assert record["bands"]["gradients_bytes"] == 0 and record["bands"]["activations_bytes"] > 0
        assert stack_problems(record) == []
    steps = [record["step"] for record in published]
    assert steps == sorted(steps) and steps[-1] <= 60
    assert published[-1]["bands"]["optimizer_state_bytes"] == reference["optimizer_state_bytes"]
    # the end, as the process said it before exiting: 240 samples in batches of 4
    assert final["exited"] is True and final["training_done"] is True and final["steps"] == 60
    assert final["steady_samples_per_second"] > 0


def test_an_fsdp2_loop_under_torchrun_is_watched_rank_by_rank(tmp_path):
    """`track` in a plain loop sharded by FSDP2 (2 CPU ranks over gloo, each BERT layer and the model `fully_shard`ed):
    `gpuanat watch` of the torchrun process shows both ranks, each holding its shard of the weights, gradients and
    optimizer state."""
    job, env = start_torchrun_job(tmp_path, SCRIPTS["plain"], "--probe", "--fsdp", "--samples", "4000", "--hold-s", "1")
    try:
        records = _watch(job.pid, env, "--duration", "6", timeout_s=120)
    finally:
        os.killpg(job.pid, signal.SIGTERM)
        job.wait(timeout=60)
    both = [
        record
        for record in records
        if len(record.get("ranks") or []) == 2
        and all(rank["step"] is not None and rank["bands"]["weights_bytes"] is not None for rank in record["ranks"])
    ]
    assert both, "no record showed both ranks with their bands"
    reference = tiny_model_reference()
    for record in both:
        assert [rank["rank"] for rank in record["ranks"]] == [0, 1]
        shards = [state_bytes(rank) for rank in record["ranks"]]
        # every parameter is split over the two ranks (an odd dimension leaves one rank a row more)
        for band in ("weights_bytes", "gradients_bytes"):
            held = [shard[band] for shard in shards]
            assert all(0.4 * reference[band] < value < 0.6 * reference[band] for value in held), (band, held)
        assert sum(shard["gradients_bytes"] for shard in shards) == reference["gradients_bytes"]
        assert stack_problems(record) == []


def test_a_loop_that_does_not_say_how_long_it_runs_is_measured_all_the_same():
    """`track(model, optimizer)` without `total_steps`: every event decodes as gpuanat reads it, the warm-up is 10
    steps, and the steady window closes when the `with` block ends."""
    import torch

    from gpuanat.core.vocabulary.protocol import Done, Hello, ModelInfo, Step, decode, encode
    from gpuanat.probe import track
    from gpuanat.worker.probe.sink import install_default_emit

    events = []
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
    optimizer = torch.optim.AdamW(model.parameters())
    # where `gpuanat run --script` sends a probe's events: every one as gpuanat's pipe carries it
    install_default_emit(lambda event: events.append(decode(encode(event))))
    try:
        with track(model, optimizer) as probe:
            for _ in range(14):
                model(torch.randn(8, 16)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                probe.step()
    finally:
        install_default_emit(None)
    assert [type(event) for event in events] == [Hello, ModelInfo, *[Step] * 14, Done]  # no Malformed
    assert events[0].config["loop"] == "plain" and events[0].config["max_steps"] is None
    assert events[1].total_steps is None
    done = events[-1]
    assert done.status == "ok" and done.steps == 14 and done.samples == 14 * 8  # rows of each forward's input
    assert done.warmup_steps == 10 and done.steady_samples_per_second > 0
    assert done.bands.weights_bytes == sum(4 * p.numel() for p in model.parameters())


SLEEP_FIRST = "import time\n\ntime.sleep(30)  # a slow start: the watch reads the script meanwhile\n"
NO_PROBE_SCRIPTS = {  # scripts as users write them, without gpuanat; read by the watch, never run that far
    "plain": SLEEP_FIRST
    + """import torch

model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(10):
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
""",
    "lightning": SLEEP_FIRST
    + """import lightning as L
from transformers import AutoModelForCausalLM

class Module(L.LightningModule):
    ...

L.Trainer(max_steps=10).fit(Module())
""",
    "trainer": SLEEP_FIRST
    + """from datasets import load_dataset
from trl import SFTConfig, SFTTrainer

trainer = SFTTrainer(model="Qwen/Qwen3-0.6B", args=SFTConfig(output_dir="out"), train_dataset=load_dataset("x"))
trainer.train()
""",
}
PROBES = {
    "plain": "gpuanat.probe.track(model, optimizer)",
    "lightning": "gpuanat.probe.LightningAnatomyCallback()",
    "trainer": "trainer.add_callback(gpuanat.probe.AnatomyCallback())",
}


@pytest.mark.parametrize("loop", ["plain", "lightning", "trainer"])
def test_the_watch_names_the_probe_the_script_needs(tmp_path, loop):
    script = tmp_path / f"train_{loop}.py"
    script.write_text(NO_PROBE_SCRIPTS[loop])
    process, env = _start_script(tmp_path, script)
    try:
        records = _watch(process.pid, env, "--duration", "1", timeout_s=60)
    finally:
        process.kill()
        process.wait()
    hints = [record for record in records if not record.get("exited")]
    assert hints
    for record in hints:
        assert not record["published"]
        assert record["probe_hint"]["loop"] == loop and record["probe_hint"]["has_probe"] is False
        assert record["probe_hint"]["script"] == str(script)
        assert PROBES[loop] in record["publication_reason"]


def test_a_script_with_a_probe_that_is_still_starting_is_waited_for(tmp_path):
    process, env = _start_script(tmp_path, SCRIPTS["plain"], "--probe", "--start-delay-s", "30")
    try:
        started_s = time.monotonic()
        records = _watch(process.pid, env, "--duration", "1", timeout_s=60)
    finally:
        process.kill()
        process.wait()
    assert time.monotonic() - started_s < 30  # the watch did not wait for the script
    waiting = [record for record in records if not record.get("exited")]
    assert waiting and all(not record["published"] for record in waiting)
    for record in waiting:
        assert record["publication_reason"].startswith("waiting for the probe")
        assert record["probe_hint"] == {
            "script": str(SCRIPTS["plain"]),
            "loop": "plain",
            "has_probe": True,
            "short": "waiting for the probe…",
        }


@pytest.mark.parametrize(
    "command",
    [
        ["python3", "train.py", "--lr", "1e-4"],
        ["/usr/bin/python3", "-u", "train.py"],
        ["torchrun", "--nproc-per-node", "8", "train.py", "--config", "x.yaml"],
        ["python", "-m", "torch.distributed.run", "--nproc-per-node=2", "train.py"],
        ["accelerate", "launch", "--num_processes", "2", "train.py"],
    ],
)
def test_the_script_of_a_launcher_s_command_line_is_found(tmp_path, command):
    (tmp_path / "train.py").write_text("import lightning\n")
    assert script_of(command, str(tmp_path)) == tmp_path / "train.py"
    assert probe_hint(command, str(tmp_path)).loop == "lightning"
    assert script_of(command, str(tmp_path / "elsewhere")) is None  # relative to the process's directory
    assert probe_hint(["python3", "-c", "import lightning"], str(tmp_path)).loop is None
