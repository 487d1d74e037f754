#!/usr/bin/env bash
# The README's two set-up commands, verbatim, on a GPU machine (issue #14: "check both").
#
# The GPU machines reach no package index, so pip finds what the machine lacks in the carried wheels (.whl/)
# through its own environment variables, and pytest spreads the suite over the cores through PYTEST_ADDOPTS
# (each child there takes ~20 s to import torch): the command lines themselves are the README's.
#   scripts/readme_check.sh            writes readme_*.log and readme_env.txt to $OUT
set -uo pipefail
OUT=${OUT:-/tmp/gpuanat-out}
mkdir -p "$OUT"
export PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl PIP_DISABLE_PIP_VERSION_CHECK=1 NCCL_NVLS_ENABLE=0
export PYTEST_ADDOPTS="-n ${WORKERS:-14} --dist loadfile -p no:cacheprovider -p no:benchmark -rfE ${PYTEST_EXTRA:-}"
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 --version
  python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
  python3 -m pip list 2>/dev/null | grep -iE "^(pyarrow|pytest|pytest-xdist|rich|huggingface.hub|fsspec) "
} > "$OUT/readme_env.txt" 2>&1

# 1. Install and open the dashboard, in a pseudo-terminal 120x40, in its foreground process group (`timeout` would
#    put it in a background group, where the dashboard's terminal set-up stops it with SIGTTOU). After DASHBOARD_S
#    seconds it gets SIGTERM, which it answers by quitting with 143.
script -qec "stty rows 40 cols 120; (sleep ${DASHBOARD_S:-150}; pkill -TERM -f 'bin/gpuanat\$') & \
  python3 -m pip install -e . && gpuanat" /dev/null > "$OUT/readme_dashboard.log" 2>&1
echo "exit $?" >> "$OUT/readme_dashboard.log"
grep -a -c "Techniques" "$OUT/readme_dashboard.log" | sed 's/^/frames showing the techniques panel: /' >> "$OUT/readme_dashboard.log"

# 2. Install the test extras and run the whole suite.
timeout -s TERM "${TESTS_S:-420}" bash -c 'python3 -m pip install -e ".[test]" && python3 -m pytest' \
  > "$OUT/readme_tests.log" 2>&1
echo "exit $?" >> "$OUT/readme_tests.log"
