"""gpuanat.core must import neither UI nor torch: checked in a fresh interpreter."""

import subprocess
import sys
from pathlib import Path

import gpuanat.core

CORE = Path(gpuanat.core.__file__).parent
CORE_MODULES = sorted(
    ".".join(path.relative_to(CORE).with_suffix("").parts) for path in CORE.rglob("*.py") if path.name != "__init__.py"
)
"""Every module under gpuanat/core, found on disk, so a new one cannot be left out."""


def test_core_imports_no_ui_and_no_torch():
    assert {"run.session", "measure.sampler", "memory.predict", "store.history"} <= set(CORE_MODULES)
    code = (
        "import sys\n"
        + "".join(f"import gpuanat.core.{name}\n" for name in CORE_MODULES)
        + "leaked = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'textual', 'transformers', 'rich'))\n"
        + "print(','.join(leaked))\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert completed.stdout.strip() == ""


def test_history_command_does_not_import_torch(tmp_path):
    code = (
        "import sys\nfrom gpuanat.cli import main\n"
        f"main(['history', '--db', {str(tmp_path / 'h.sqlite')!r}])\n"
        "print('TORCH' if 'torch' in sys.modules else 'NO-TORCH')\n"
    )
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert completed.stdout.strip().splitlines()[-1] == "NO-TORCH"
