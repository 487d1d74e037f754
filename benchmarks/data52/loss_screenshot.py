"""The dashboard mid-run on a local dataset (issue #52): the loss pane over a real GPU run, saved as an SVG at
120×40 and at 80×24 (scripts/take_screenshots.py's live run: press r, wait, save).

    python benchmarks/data52/loss_screenshot.py --data FILE --tokenizer DIR --out-dir DIR [--mid-run-s 45]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from take_screenshots import take_live_lanes

from gpuanat.core.vocabulary.config import RunConfig


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--preset", default="qwen2.5-0.5b")
    parser.add_argument("--padding", default="pack")
    parser.add_argument("--mid-run-s", type=float, default=45.0)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=1024)
    args = parser.parse_args()
    config = RunConfig(
        preset=args.preset,
        data=args.data,
        tokenizer=args.tokenizer,
        padding=args.padding,
        precision="bf16",
        batch_size=args.batch_size,
        seq_len=args.seq_len,
        samples=20000,
        max_steps=400,
    )
    args.out_dir.mkdir(parents=True, exist_ok=True)
    asyncio.run(take_live_lanes(args.out_dir, config, args.mid_run_s, "dashboard_loss.svg", [(80, 24)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
