"""Launching and recording a run: RunConfig and its techniques, the child protocol, the runner, the session."""
