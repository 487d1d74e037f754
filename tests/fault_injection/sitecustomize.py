"""Test-only fault injection into a real training child, loaded through PYTHONPATH.

No GPU is available in CI, so a real CUDA out-of-memory cannot happen there. Tests put this
directory on the child's PYTHONPATH and set GPUANAT_TEST_FAULT=KIND@STEP; Python then imports this
module at start-up, and it wraps transformers' Trainer.training_step so that the optimizer step
numbered STEP (1-based) fails in the chosen way. Everything else — worker, probe, runner, history —
is the real code. Kinds:
  oom      raise torch.OutOfMemoryError, exactly what the CUDA caching allocator raises
  crash    SIGKILL the training process (a hard crash: no Python cleanup, no final event)
  interrupt  SIGINT to the training process in that step (Ctrl-C reaching it mid-step)
  garbage  write a malformed line to the events pipe, then carry on normally
  fuzz     write the bytes of the file GPUANAT_TEST_FUZZ_FILE to the events pipe, then carry on normally
  fuzz-crash  write them, then SIGKILL the training process
  oom-above  (KIND@N) raise torch.OutOfMemoryError at the first step of any run whose per-device
             batch exceeds N: a device on which batches up to N fit
  profile-read  (KIND@0) reading the operations profile raises (a profiler that changed in a newer torch)
"""

import os

_FAULT = os.environ.get("GPUANAT_TEST_FAULT")

if _FAULT and "GPUANAT_EVENTS_FD" in os.environ:  # only in the training child, not in the gpuanat CLI
    import signal

    import torch
    from transformers import Trainer

    _kind, _, _step = _FAULT.partition("@")
    _fault_step = int(_step)
    _original_training_step = Trainer.training_step

    def _training_step(self, *args, **kwargs):
        if _kind == "oom-above" and self.args.per_device_train_batch_size > _fault_step:
            raise torch.OutOfMemoryError(f"CUDA out of memory (injected by test: batch > {_fault_step})")
        if self.state.global_step + 1 == _fault_step:
            if _kind == "oom":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected by test)")
            if _kind == "crash":
                os.kill(os.getpid(), signal.SIGKILL)
            if _kind == "interrupt":
                os.kill(os.getpid(), signal.SIGINT)
            if _kind == "garbage" and not getattr(self, "_garbage_sent", False):
                self._garbage_sent = True
                os.write(int(os.environ["GPUANAT_EVENTS_FD"]), b"this is not an event\n")
            if _kind in ("fuzz", "fuzz-crash") and not getattr(self, "_fuzz_sent", False):
                self._fuzz_sent = True
                with open(os.environ["GPUANAT_TEST_FUZZ_FILE"], "rb") as fuzz:
                    data = fuzz.read()
                while data:
                    data = data[os.write(int(os.environ["GPUANAT_EVENTS_FD"]), data) :]
                if _kind == "fuzz-crash":
                    os.kill(os.getpid(), signal.SIGKILL)
        return _original_training_step(self, *args, **kwargs)

    Trainer.training_step = _training_step

    if _kind == "profile-read":
        import gpuanat.worker.probe.operations as _operations

        def _unreadable_profile(*args, **kwargs):
            raise RuntimeError("the profile cannot be read (injected by test)")

        _operations.kernel_rows = _unreadable_profile
