"""A pytest plugin that records each test's wall seconds and CPU seconds: its pytest process's own and those of the
child processes it reaped (the real training runs), from getrusage. How benchmarks/results/suite/ was measured:

    PYTHONPATH=benchmarks python3 -m pytest -p suite_cpu_plugin -n 2 --dist loadgroup

writes one JSON file per pytest-xdist worker into $SUITE_CPU_DIR (default /tmp/gpuanat-suite-cpu)."""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

_rows: list[dict[str, object]] = []


def _cpu_seconds() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    started_s = time.monotonic()
    own_before, children_before = _cpu_seconds()
    yield
    own_after, children_after = _cpu_seconds()
    _rows.append(
        {
            "id": item.nodeid,
            "wall": time.monotonic() - started_s,
            "self": own_after - own_before,
            "children": children_after - children_before,
        }
    )


def pytest_sessionfinish(session):
    directory = Path(os.environ.get("SUITE_CPU_DIR", "/tmp/gpuanat-suite-cpu"))
    directory.mkdir(parents=True, exist_ok=True)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "serial")
    (directory / f"rows-{worker}.json").write_text(json.dumps(_rows))
