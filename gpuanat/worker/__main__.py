"""`python -m gpuanat.worker`: the training child (see gpuanat.worker.train)."""

import sys

from gpuanat.worker.train import main

sys.exit(main())
