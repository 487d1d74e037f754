"""A probe that ended holds nothing of its training: a process that trains one model after another (a notebook, a
benchmark matrix, `llm_matrix.py`) gets each model's memory back when it drops it. The probe's out-of-memory observer
is attached once a process (torch cannot detach one) and asks the running probe to describe a failure; the probe
that ended must leave it, or the observer keeps the last model, its gradients and its optimizer alive (on the H100 a
1.3B model's 14.7 GiB of weights and AdamW states stayed allocated into the next configuration)."""

from __future__ import annotations

import subprocess
import sys

from conftest import REPO, cli_env

SCRIPT = """
import gc, weakref
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments
from gpuanat.probe import AnatomyCallback

class Samples(torch.utils.data.Dataset):
    def __len__(self): return 8
    def __getitem__(self, i):
        return {"input_ids": torch.arange(16) % 64, "attention_mask": torch.ones(16, dtype=torch.long), "labels": i % 2}

config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)
model = BertForSequenceClassification(config)
arguments = TrainingArguments(output_dir=OUTPUT, per_device_train_batch_size=4, max_steps=2, report_to=[],
                              use_cpu=True, save_strategy="no", logging_strategy="no")
trainer = Trainer(model=model, args=arguments, train_dataset=Samples(), callbacks=[AnatomyCallback(lambda event: None)])
trainer.train()
left = weakref.ref(model)
del model, trainer
gc.collect()
print("model alive after training:", left() is not None)

class Fails(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        raise RuntimeError("the training fails")

model = BertForSequenceClassification(config)
trainer = Trainer(model=model, args=arguments, train_dataset=Samples(),
                  callbacks=[AnatomyCallback(lambda event: None), Fails()])
try:
    trainer.train()
except RuntimeError:
    pass
left = weakref.ref(model)
del model, trainer
gc.collect()
print("model alive after a failed training:", left() is not None)
"""


def test_a_probe_that_ended_or_failed_keeps_no_model_alive(tmp_path):
    script = SCRIPT.replace("OUTPUT", repr(str(tmp_path / "out")))
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO,
        env=cli_env(tmp_path / "history.sqlite"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "model alive after training: False" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
    assert "model alive after a failed training: False" in done.stdout, done.stdout[-2000:] + done.stderr[-2000:]
