"""`python -m gpuanat` is the `gpuanat` command."""

from gpuanat.cli import main

raise SystemExit(main())
