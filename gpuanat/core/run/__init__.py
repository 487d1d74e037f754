"""Orchestration, the top floor of `core/`: the runner that spawns the training child, the session that records a
run from start to result, a user's script, the warm worker, the largest-batch fit and the tune search."""
