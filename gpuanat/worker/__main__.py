"""`python -m gpuanat.worker`: the training child (see gpuanat.worker.train)."""

import sys

from gpuanat.worker.lifeline import hold_lifeline

hold_lifeline()  # first, so that the child dies with its parent even while it imports torch

from gpuanat.worker.train import main  # noqa: E402

sys.exit(main())
