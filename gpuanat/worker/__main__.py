"""`python -m gpuanat.worker`: the training child (see gpuanat.worker.train)."""

import os
import sys
import time

STARTED_MONOTONIC_S = time.monotonic()  # the start-up breakdown's "started" milestone

from gpuanat.worker.lifeline import hold_lifeline  # noqa: E402

hold_lifeline()  # first, so that the child dies with its parent even while it imports torch

from gpuanat.worker.train import main  # noqa: E402

exit_code = main(started_monotonic_s=STARTED_MONOTONIC_S)
# Everything the run had to say is said (its result sent, its log written and flushed below): leave without the
# interpreter's teardown, which unloads torch, CUDA and every module one by one — a second or more after every run
# (the start-up breakdown's "child exit"), that a plain script pays and the user waits for. The kernel frees the rest.
sys.stdout.flush()
sys.stderr.flush()
os._exit(exit_code)
