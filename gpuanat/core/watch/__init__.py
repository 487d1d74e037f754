"""Watching a training process gpuanat did not launch: its target, its publications, its records, its history."""
