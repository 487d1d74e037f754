"""The one way gpuanat starts a Python module of its own in a child process (`python -P -m MODULE ARGS`).

`python -m MODULE` puts the current folder first on the child's `sys.path`, so a `gpuanat/` folder (or a `torch/`
one) where the user stands would be imported instead of the installed package — a checkout of another version, or
anything named so — and the child fails (`ImportError`) or runs the wrong code. `-P` (Python 3.11) leaves the current
folder off, for that child only. The PYTHONSAFEPATH variable would do the same, but children inherit it: the user's
own scripts and the processes they start would lose their own folder on `sys.path` too.
"""

from __future__ import annotations

import sys


def python_module_command(module: str, *arguments: str, unbuffered: bool = False) -> list[str]:
    """`MODULE` run by this Python with `arguments`, importing packages as they are installed whatever folder the
    child starts in; `unbuffered` adds `-u` (what torchrun gives the ranks it starts itself)."""
    return [sys.executable, *(["-u"] if unbuffered else []), "-P", "-m", module, *arguments]
