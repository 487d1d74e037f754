"""Which probe a watched process needs, read off the script it runs: a watch of a process that publishes nothing
names the right one — HF `Trainer`'s `AnatomyCallback` (TRL and axolotl build on Trainer), Lightning's
`LightningAnatomyCallback`, or `track` for a loop of one's own — and, when the script already uses gpuanat's probe,
says it is waiting for it (the probe publishes when training begins, after the imports and the model's loading).

The script is the command line's first `.py` file (also behind `torchrun`, `accelerate launch`, `python -m
torch.distributed.run`), read as text, never run: its imports and calls are matched, nothing else. A script that
cannot be read gets the three probes named.

Plain Python: no torch, no UI.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

SCRIPT_READ_LIMIT_BYTES = 1 << 20
"""How much of a script is read to tell its training loop."""

PROBES = {
    "trainer": "trainer.add_callback(gpuanat.probe.AnatomyCallback())",
    "lightning": "Trainer(callbacks=[gpuanat.probe.LightningAnatomyCallback()])",
    "plain": "with gpuanat.probe.track(model, optimizer) as probe: … probe.step() after each optimizer step",
}
"""The probe for each kind of training loop, as a user adds it."""

LOOP_NAMES = {"trainer": "HF Trainer", "lightning": "PyTorch Lightning", "plain": "a training loop of its own"}

_IMPORTS_GPUANAT = re.compile(r"^\s*(import|from)\s+gpuanat\b", re.MULTILINE)
_PROBE_CALL = re.compile(r"\b(AnatomyCallback|LightningAnatomyCallback|track)\s*\(")
_LIGHTNING = re.compile(r"^\s*(import|from)\s+(lightning|pytorch_lightning)\b", re.MULTILINE)
_HF = re.compile(r"^\s*(import|from)\s+(transformers|trl)\b", re.MULTILINE)
_TRAINER_CALL = re.compile(r"\b\w*Trainer\s*\(")
_BACKWARD = re.compile(r"\.backward\s*\(")


@dataclass(frozen=True)
class ProbeHint:
    """What the watched script trains with and whether it uses gpuanat's probe, as read off its text."""

    script: str | None
    """The script read; None when the command line names none or it could not be read."""
    loop: str | None
    """"trainer", "lightning", "plain", or None: not known."""
    has_probe: bool

    @property
    def reason(self) -> str:
        """Why the anatomy is not published, and what to do."""
        if self.has_probe:
            return (
                "waiting for the probe: the script uses gpuanat's probe, which publishes once training begins "
                "(after the imports and the model's loading)"
            )
        if self.loop is None:
            return (
                "not published: no gpuanat probe in the process (HF Trainer: "
                + PROBES["trainer"]
                + "; Lightning: "
                + PROBES["lightning"]
                + "; a loop of your own: "
                + PROBES["plain"]
                + ")"
            )
        return f"not published: {LOOP_NAMES[self.loop]} without gpuanat's probe (add {PROBES[self.loop]})"

    @property
    def short(self) -> str:
        """The same in a few words, for a narrow panel."""
        if self.has_probe:
            return "waiting for the probe…"
        if self.loop is None:
            return "anatomy not published (no gpuanat probe)"
        name = {"trainer": "AnatomyCallback", "lightning": "LightningAnatomyCallback", "plain": "probe.track"}
        return f"anatomy not published: add {name[self.loop]}"

    def to_json(self) -> dict[str, object]:
        return {"script": self.script, "loop": self.loop, "has_probe": self.has_probe, "short": self.short}


def script_of(arguments: Sequence[str], cwd: str | None) -> Path | None:
    """The first `.py` file of a command line that exists, relative to the process's working directory."""
    for argument in arguments[1:] if len(arguments) > 1 else arguments:
        if argument.endswith(".py"):
            path = Path(argument)
            if not path.is_absolute() and cwd is not None:
                path = Path(cwd) / path
            if path.is_file():
                return path
    return None


def loop_of(text: str) -> str | None:
    """The training loop a script's text uses: Lightning, HF Trainer (or TRL's), a loop of its own, or None."""
    if _LIGHTNING.search(text):
        return "lightning"
    if _HF.search(text) and _TRAINER_CALL.search(text):
        return "trainer"
    if _BACKWARD.search(text):
        return "plain"
    return None


def probe_hint(arguments: Sequence[str], cwd: str | None) -> ProbeHint:
    """What the script of a command line trains with, read once; an unreadable one is not known."""
    path = script_of(arguments, cwd)
    if path is None:
        return ProbeHint(None, None, False)
    try:
        with open(path, "rb") as script:
            text = script.read(SCRIPT_READ_LIMIT_BYTES).decode("utf-8", errors="replace")
    except OSError:
        return ProbeHint(None, None, False)
    has_probe = bool(_IMPORTS_GPUANAT.search(text) and _PROBE_CALL.search(text))
    return ProbeHint(os.fspath(path), loop_of(text), has_probe)
