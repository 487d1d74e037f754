"""`gpuanat run --script train.py -- ARGS`: a user's own script, unedited, trained with gpuanat's probe attached."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REPO, cli_env, last_json, run_cli, state_bytes, tiny_model_reference

from gpuanat.core.store.history import HistoryStore

TINY_TRAINER = REPO / "tests" / "scripts" / "tiny_trainer.py"


def test_a_script_without_the_callback_is_recorded_with_its_bands(db_path):
    completed = run_cli(
        [
            "run",
            "--json",
            "--tag",
            "script",
            "--script",
            str(TINY_TRAINER),
            "--",
            "--samples",
            "32",
            "--batch-size",
            "8",
        ],
        db_path,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    result = last_json(completed.stdout)
    reference = tiny_model_reference()
    assert result["status"] == "ok" and result["exit_code"] == 0
    assert result["params"] == reference["params"]
    assert state_bytes(result) == {key: reference[key] for key in state_bytes(result)}
    assert result["bands"]["activations_bytes"] > 0
    # the script's own arguments reached it: 32 samples in batches of 8, 3 epochs (its TrainingArguments default)
    assert result["steps"] == 12 and result["samples"] == 96
    assert result["samples_per_second"] > 0 and result["steady_samples_per_second"] > 0
    assert result["config"]["script"] == str(TINY_TRAINER) and result["config"]["args"] == [
        "--samples",
        "32",
        "--batch-size",
        "8",
    ]
    assert result["config"]["batch_size"] == 8  # read off the script's TrainingArguments by the probe
    with HistoryStore(db_path) as store:
        (run,) = store.runs()
        steps = store.steps(run.id)
        samples = store.samples(run.id)
    assert (run.kind, run.name, run.status, run.tags) == ("launched", "script tiny_trainer.py", "ok", ("script",))
    assert run.result.to_json()["bands"] == result["bands"]
    assert [step["step"] for step in steps] == list(range(1, 13))
    # the host was measured while the script ran; the sample taken as it exited may find no process
    assert len(samples) >= 3 and all(sample["host"]["rss_bytes"] for sample in samples[:-1])
    table = run_cli(["history"], db_path, timeout_s=60).stdout
    assert "script tiny_trainer.py" in table


def test_the_probe_is_added_once_even_when_the_script_has_its_own():
    code = textwrap.dedent("""
        from gpuanat.worker.script import attach_probe_to_every_trainer
        attach_probe_to_every_trainer()
        import tempfile
        from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
        from gpuanat.probe import AnatomyCallback
        model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=16, num_hidden_layers=1,
                                                         num_attention_heads=1, intermediate_size=16))
        args = TrainingArguments(output_dir=tempfile.mkdtemp(), use_cpu=True, report_to="none")
        class MyTrainer(Trainer):
            pass
        counts = []
        for callbacks in ([], [AnatomyCallback(publish=False)]):
            trainer = MyTrainer(model=model, args=args, callbacks=callbacks)
            counts.append(sum(isinstance(c, AnatomyCallback) for c in trainer.callback_handler.callbacks))
        print(counts)
    """)
    completed = subprocess.run(
        [sys.executable, "-c", code],
        env=cli_env(None, offline_hub=True),
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip().splitlines()[-1] == "[1, 1]"


def test_a_script_that_raises_is_recorded_as_failed_with_its_error(db_path, tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("import sys\nprint('args', sys.argv[1:], __name__)\nraise RuntimeError('no data here')\n")
    completed = run_cli(["run", "--json", "--script", str(script), "--", "--epochs", "2"], db_path)
    assert completed.returncode == 1
    result = last_json(completed.stdout)
    assert result["status"] == "failed" and result["exit_code"] == 1
    assert result["error"]["kind"] == "exception" and "RuntimeError: no data here" in result["error"]["message"]
    log = Path(result["log_path"]).read_text()
    assert "args ['--epochs', '2'] __main__" in log


def test_technique_flags_and_a_missing_script_are_refused_in_one_line(db_path, tmp_path):
    for args, expected in (
        (["run", "--script", str(TINY_TRAINER), "--batch-size", "8"], "--batch-size: technique flags do not apply"),
        (["run", "--script", str(tmp_path / "missing.py")], "--script: no such file"),
        (["run", "--", "--samples", "3"], "arguments after -- are for a script"),
        (["history", "--", "x"], "only for `gpuanat run --script"),
    ):
        completed = run_cli(args, db_path, timeout_s=60)
        assert completed.returncode == 2, (args, completed.stderr)
        assert len(completed.stderr.strip().splitlines()) == 1 and expected in completed.stderr
    with HistoryStore(db_path) as store:
        assert store.runs() == []


def test_the_json_line_is_the_last_stdout_line_even_with_the_scripts_output(db_path, tmp_path):
    script = tmp_path / "chatty.py"
    script.write_text("print('hello from the script')\n")
    completed = run_cli(["run", "--json", "--script", str(script)], db_path, timeout_s=120)
    assert completed.returncode == 0, completed.stderr
    result = json.loads(completed.stdout.strip().splitlines()[-1])
    assert result["status"] == "ok"
    assert result["unavailable"]["bands"].startswith("the script trained nothing under gpuanat's probe (no Trainer)")
    assert "hello from the script" in Path(result["log_path"]).read_text()


CRASH = "raise RuntimeError('the data folder is missing')\n"
CRASHING_SCRIPTS = {  # each script's text, its crash included
    "a loop of its own": (
        "def train(model, optimizer, batches):\n    for batch in batches:\n        model(batch).sum().backward()\n"
        "        optimizer.step()\n\n" + CRASH,
        "a training loop of its own is measured once the script adds gpuanat's probe: with "
        "gpuanat.probe.track(model, optimizer) as probe",
    ),
    "HF Trainer": (
        "from transformers import Trainer\n\n\ndef train(model, data):\n"
        "    Trainer(model=model, train_dataset=data)\n\n" + CRASH,
        "gpuanat attaches its probe to every transformers Trainer the script creates",
    ),
    "Lightning": (
        # the crash before the import: the loop is read from the text, Lightning is never imported
        CRASH + "import lightning\n",
        "PyTorch Lightning is measured once the script adds gpuanat's probe: "
        "Trainer(callbacks=[gpuanat.probe.LightningAnatomyCallback()])",
    ),
    "a loop gpuanat cannot tell": (
        CRASH,
        "gpuanat attaches its probe to a transformers Trainer; Lightning needs "
        "Trainer(callbacks=[gpuanat.probe.LightningAnatomyCallback()]), a loop of its own with gpuanat.probe.track(",
    ),
}


def test_a_script_that_crashes_before_training_is_told_the_probe_route_of_its_loop(db_path, tmp_path):
    """Issue #48: a crashed script was told it "created no transformers Trainer", whatever its loop; the probe's route
    is the one for the loop its text shows (read, never run: a Lightning script need not have Lightning installed)."""
    for loop, (body, route) in CRASHING_SCRIPTS.items():
        script = tmp_path / "crash.py"
        script.write_text(body)
        completed = run_cli(["run", "--json", "--script", str(script)], db_path, timeout_s=120)
        assert completed.returncode == 1, (loop, completed.stderr[-2000:])
        result = last_json(completed.stdout)
        assert result["status"] == "failed" and "the data folder is missing" in result["error"]["message"], loop
        reason = result["unavailable"]["training"]
        assert reason.startswith("the script failed before training began under gpuanat's probe: "), (loop, reason)
        assert route in reason and reason.endswith("only its processes were measured from outside"), (loop, reason)
        assert "created no transformers Trainer" not in reason
