"""Runs a user's own training script with gpuanat's probe attached, without editing the script.

    python -m gpuanat.worker.script SCRIPT [ARGS...]

What `gpuanat run --script SCRIPT -- ARGS` launches in its child. Every `transformers.Trainer` the script
creates gets an `AnatomyCallback` (unless it already has one), whose events go to the pipe gpuanat passed in
GPUANAT_EVENTS_FD; the variable is removed before the script runs, so processes the script starts do not
inherit a descriptor they do not have. The script then runs as `python SCRIPT ARGS` would run it: as
`__main__`, with `sys.argv` = [SCRIPT, *ARGS] and its directory first on `sys.path`. An exception that ends
the script is also reported as an `error` event (kind `oom` when it ran out of memory: the GPU's, or the host's).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.abc
import importlib.machinery
import importlib.util
import os
import runpy
import sys
import traceback
import types
from typing import Any

from gpuanat.core.vocabulary.protocol import Error, Event
from gpuanat.worker.events import EventWriter, ParentGone
from gpuanat.worker.lifeline import hold_lifeline
from gpuanat.worker.out_of_memory import is_host_out_of_memory, is_out_of_memory, out_of_memory_message
from gpuanat.worker.probe import sink

EXIT_USAGE = 2


TRAINER_MODULE = "transformers.trainer"


def attach_probe_to_every_trainer() -> None:
    """Wrap `Trainer.__init__` so that each Trainer gets an AnatomyCallback unless it has one already — once the
    script imports transformers' Trainer: a script that never does (a loop of its own, Lightning) does not pay for
    importing it (4 s of CPU on a CI machine)."""
    if TRAINER_MODULE in sys.modules:
        _wrap_trainer(sys.modules[TRAINER_MODULE].Trainer)
    else:
        sys.meta_path.insert(0, _TrainerImported())


def _wrap_trainer(trainer: Any) -> None:
    from gpuanat.worker.probe.hf import AnatomyCallback

    original_init = trainer.__init__

    @functools.wraps(original_init)
    def init_with_probe(self: Any, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        if not any(isinstance(callback, AnatomyCallback) for callback in self.callback_handler.callbacks):
            self.add_callback(AnatomyCallback())

    trainer.__init__ = init_with_probe


class _TrainerImported(importlib.abc.MetaPathFinder):
    """Finds `transformers.trainer` as the other finders do, and wraps its Trainer once the module has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != TRAINER_MODULE:
            return None
        sys.meta_path.remove(self)  # once: the module is imported once
        spec = importlib.util.find_spec(fullname)
        loader = spec.loader if spec is not None else None
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run_module = loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            run_module(module)
            _wrap_trainer(module.Trainer)

        loader.exec_module = exec_module  # type: ignore[method-assign]  # (this module's own loader)
        return spec


def _emitter() -> Any:
    fd = os.environ.pop(sink.EVENTS_FD_ENV, None)
    if fd is None or not fd.isdigit():
        return None
    writer = EventWriter(int(fd))
    sink.install_default_emit(writer.emit)
    return writer.emit


def main(argv: list[str] | None = None) -> int:
    hold_lifeline()
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m gpuanat.worker.script SCRIPT [ARGS...]", file=sys.stderr)
        return EXIT_USAGE
    script = os.path.abspath(args[0])
    emit = _emitter()
    attach_probe_to_every_trainer()
    sys.argv = [args[0], *args[1:]]
    if sys.flags.safe_path:  # started with -P (python_module_command): nothing of ours to replace
        sys.path.insert(0, os.path.dirname(script))
    else:  # `python -m` put the current folder first, where `python SCRIPT` puts the script's
        sys.path[0] = os.path.dirname(script)
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exit_request:
        code = exit_request.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    except Exception as error:
        if emit is not None:
            message = (
                out_of_memory_message(error)  # says it was the host's memory, not the GPU's
                if is_host_out_of_memory(error)
                else f"{type(error).__name__}: {error}".splitlines()[0]
            )
            kind = "oom" if is_out_of_memory(error) else "exception"
            event: Event = Error(kind=kind, message=message, traceback=traceback.format_exc())
            with contextlib.suppress(ParentGone, OSError):
                emit(event)
        traceback.print_exc()
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
