"""A local text dataset and tokenizer for issue #52's GPU check, built on the machine with no download: the
docstrings of Python's standard library (real English of varied lengths: one row a docstring) as a jsonl file, and a
byte-level BPE tokenizer trained on them (the `tokenizers` library) saved as a PreTrainedTokenizerFast directory.

    python benchmarks/data52/make_corpus.py --out DIR [--rows 20000] [--vocab 8192]
"""

from __future__ import annotations

import argparse
import ast
import json
import statistics
import sysconfig
from pathlib import Path


def docstrings(limit: int) -> list[str]:
    rows: list[str] = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "test" in path.parts or "idlelib" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, OSError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                text = ast.get_docstring(node)
                if text and len(text.split()) >= 8:
                    rows.append(text)
                    if len(rows) >= limit:
                        return rows
    return rows


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rows", type=int, default=20000)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    args.out.mkdir(parents=True, exist_ok=True)
    rows = docstrings(args.rows)
    with (args.out / "docstrings.jsonl").open("w") as out:
        for text in rows:
            out.write(json.dumps({"text": text}) + "\n")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    special = ["<pad>", "<eos>"]
    tokenizer.train_from_iterator(rows, trainers.BpeTrainer(vocab_size=args.vocab, special_tokens=special))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>", eos_token="<eos>")
    fast.save_pretrained(args.out / "tokenizer")
    lengths = [len(ids) for ids in fast(rows)["input_ids"]]
    print(
        json.dumps(
            {
                "rows": len(rows),
                "tokens": sum(lengths),
                "median_tokens": statistics.median(lengths),
                "max_tokens": max(lengths),
                "vocab": fast.vocab_size,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
