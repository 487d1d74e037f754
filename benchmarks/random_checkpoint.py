"""A checkpoint with random weights of a config.json, saved as transformers saves one (safetensors), for the
references that load a model as users do (`from_pretrained`) on machines that cannot download one:

    python3 benchmarks/random_checkpoint.py benchmarks/configs/llama-3.1-8b /dev/shm/llama-3.1-8b [--dtype bf16]

Built on the GPU when there is one (much faster than on the CPU), in bf16 by default (llama-3.1-8b's own
checkpoint is bf16).
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", help="a directory with a config.json")
    parser.add_argument("output", help="the directory to save the checkpoint in")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    args = parser.parse_args()
    started_s = time.perf_counter()
    torch.manual_seed(0)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = AutoModelForCausalLM.from_config(
            AutoConfig.from_pretrained(args.config), dtype=torch.bfloat16 if args.dtype == "bf16" else torch.float32
        )
    model.save_pretrained(args.output)
    print(
        f"{args.output}: {sum(p.numel() for p in model.parameters()):,} parameters in {args.dtype}, "
        f"{time.perf_counter() - started_s:.0f} s"
    )


if __name__ == "__main__":
    main()
