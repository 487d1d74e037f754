"""`gpuanat tune`'s command line: what it holds and searches, its budget, its objective."""

from __future__ import annotations

import argparse
from typing import Any


def tune_subparser(commands: Any) -> argparse.ArgumentParser:
    """The `tune` subcommand of the parser's `commands`, its description; the caller adds the flags it shares with
    the other commands, then `add_tune_options`."""
    tune: argparse.ArgumentParser = commands.add_parser(
        "tune",
        help="search the techniques for the fastest training that fits, with short real runs",
        description=(
            "Search for the fastest training of this workload that fits the GPU's memory.\n\n"
            "Held: the workload (--preset/--model, --seq-len, --lora, --gpus, ...) and every technique you give a\n"
            "flag for. Searched, the rest: batch size (powers of two up to the largest predicted to fit, and that\n"
            "largest rounded down to a multiple of 8; --effective-batch keeps samples per step with accumulation),\n"
            "precision (bf16 on compute capability >= 8, else fp16; fp32), tf32, attention (sdpa, eager),\n"
            "optimizer (fused AdamW; 8-bit Adam where bitsandbytes is installed; never SGD), gradient\n"
            "checkpointing (only where it lets a larger batch fit), DataLoader workers (0, 2), expandable\n"
            "segments, Liger (causal LMs, where installed) and torch.compile.\n\n"
            "How: from bf16 + tf32 + sdpa + fused AdamW at the largest power-of-two batch predicted to fit, one\n"
            "technique at a time, keeping a move only if its steady samples/s is over 2% faster, until no move\n"
            "helps or the budget is spent. Pruned: before a candidate runs, the memory prediction (gpuanat\n"
            "predict) refuses it if it would not fit the GPU's memory less a 2% margin. torch.compile's memory is\n"
            "not predicted: it is tried, last.\n\n"
            'Each trial is a real run of --trial-steps steps, recorded in the history as "tune N: ..." (on an\n'
            "H100, bert-large: about 20-40 s of start-up and training each, so 15 minutes is 20-30 trials); one\n"
            "that runs out of memory or fails rules that direction out. A progress line per trial on stderr says\n"
            "the time left; then the Pareto front of samples/s against peak memory (every point a recorded run)\n"
            "and the best set as a `gpuanat run` command. Ctrl-C stops the running trial and prints the front\n"
            "found so far (exit 130). Without a GPU, --device cpu tunes on the CPU: no memory limit unless\n"
            "--gpu-memory is given (then pruned as for a GPU of that size)."
        ),
        epilog="Examples:\n  gpuanat tune --budget 12\n  gpuanat tune --preset bert-large --seq-len 512 --json\n"
        "  gpuanat tune --effective-batch 256 --search batch,precision,attn\n"
        "  gpuanat tune --device cpu --preset tiny --seq-len 32 --budget 1\n\n"
        "Exit codes: 0 a best set was found, 1 no trial trained (a failure), 2 bad input, 3 nothing fits "
        "(predicted, or every trial ran out of memory), 130 stopped (the front so far is printed).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    return tune


def add_tune_options(tune: argparse.ArgumentParser) -> None:
    """What only `tune` takes: the memory to fit, the budget, the trials, the search, the objective."""
    tune.add_argument(
        "--gpu-memory",
        metavar="SIZE",
        default=None,
        help="memory the candidates must fit, e.g. 80GiB (default: GPU 0's total, read through NVML; on the CPU none)",
    )
    tune.add_argument(
        "--budget",
        type=float,
        default=15.0,
        metavar="MINUTES",
        help="stop before a trial would end past this many minutes (15)",
    )
    tune.add_argument(
        "--trial-steps",
        type=int,
        default=20,
        metavar="N",
        help="optimizer steps per trial; the first 2 are warm-up (20)",
    )
    tune.add_argument(
        "--effective-batch",
        type=int,
        default=None,
        metavar="N",
        help="keep N samples per optimizer step: each batch b tried trains with accumulation N/b "
        "(default: no accumulation, the effective batch follows the batch)",
    )
    tune.add_argument(
        "--search",
        default=None,
        metavar="NAMES",
        help="search only these, separated by commas: batch, precision, weights, tf32, attn, optim, "
        "distributed, grad-checkpointing, workers, expandable-segments, liger, engine, compile "
        "(default: all that apply here)",
    )
    tune.add_argument(
        "--max-batch",
        type=int,
        default=None,
        metavar="N",
        help="try no batch above N (default: 4096 on a GPU; on the CPU without --gpu-memory 64)",
    )
    tune.add_argument(
        "--objective",
        choices=("throughput", "energy"),
        default="throughput",
        help="what a move must improve: steady samples/s (throughput), or the least energy a sample from NVML's "
        "energy counter (energy: a GPU run)",
    )
    tune.add_argument(
        "--json",
        action="store_true",
        help="print the front, every trial, what was not tried and the best set as one JSON object",
    )
