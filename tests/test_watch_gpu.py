"""`gpuanat watch` on a real GPU (run on the lent GPU machine by `scripts/gpu_check.sh start-watch`).

A real CUDA process holds 1 GiB and keeps the GPU busy; the real CLI watches it through real NVML, including
nvmlDeviceGetProcessUtilization. On a machine whose NVML reports PIDs of another namespace (a container), the
record must say so instead of showing no memory.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import REPO, run_cli

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
GIB = 1024**3
BUSY_GPU = (
    "import torch\n"
    "held = torch.empty(2**30, dtype=torch.uint8, device='cuda')\n"
    "a = torch.randn(4096, 4096, device='cuda')\n"
    "torch.cuda.synchronize()\n"
    "print('ready', flush=True)\n"
    "while True:\n"
    "    a = (a @ a).clamp_(-1, 1)\n"
    "    torch.cuda.synchronize()\n"
)


def test_watch_reads_a_cuda_process_through_real_nvml():
    child = subprocess.Popen([sys.executable, "-c", BUSY_GPU], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        completed = run_cli(["watch", str(child.pid), "--json", "--duration", "3"], None, timeout_s=120)
    finally:
        child.kill()
        child.wait()
    assert completed.returncode == 0, completed.stderr
    records = [json.loads(line) for line in completed.stdout.splitlines()]
    late = records[len(records) // 2 :]
    print(json.dumps(records[-1], indent=1))
    for record in late:
        if record["pid_namespace"] is not None and record["gpu_memory_bytes"] is None:
            assert "another PID namespace" in record["pid_namespace"]["note"]
            continue
        # 1 GiB held, plus the matrices and the CUDA context
        assert record["gpu_memory_bytes"] >= GIB
        assert record["gpu_util_scope"] in ("process", "device")
        assert record["gpu_util_percent"] is not None
    assert any(record["gpu_util_percent"] > 20 for record in late if record["gpu_util_percent"] is not None)
