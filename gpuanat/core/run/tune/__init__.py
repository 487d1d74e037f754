"""The fastest training that fits: a greedy search over the techniques, with short real runs.

`gpuanat tune` holds the workload (preset or model, sequence length, LoRA, GPUs) and every technique the user gave a
flag for, and searches the rest, one technique at a time ("dimensions": batch, precision, tf32, attention,
optimizer, checkpointing, DataLoader workers, expandable segments, Liger, torch.compile):

1. A strong start: 16-bit mixed precision (bf16 where the GPU has compute capability ≥ 8, else fp16), tf32, SDPA
   attention, fused AdamW, no checkpointing, at the largest power-of-two batch the memory prediction says fits.
2. Greedy coordinate moves: from the best so far, each dimension's other values are tried; the fastest of them is
   kept only if its samples/s beat the best's by more than `NOISE_FRACTION`. Rounds repeat until no move helps,
   the budget would be exceeded, or the user stops it.

Every candidate is checked against the memory prediction before it runs (`gpuanat.core.memory`): one predicted not
to fit the GPU's memory less `MEMORY_MARGIN_FRACTION` is refused without running (a move that changes the memory,
say fp32 in place of bf16, first steps its batch down the ladder to the largest that fits). Each trial is a real run
of `trial_steps` optimizer steps recorded in the history like any other run ("tune 3: bs64 bf16 tf32"); its speed is
the run's steady samples/s (after the probe's warm-up steps). A trial that runs out of memory or fails is recorded
as such and marks its direction dead: the same value of that technique is not tried again, and after an OOM no
batch at least as large with the same memory-relevant techniques.

No torch here: the runs happen in child processes (`execute_run`); tests inject `run_trial` and the clock.

The rooms: `space` (what may change), `candidates` (the batch ladder, the moves, what failed rules out), `search`
(`run_tune`), `result` (the trials and the front), `runs` (a trial's config and name, the `gpuanat run` command).
"""
