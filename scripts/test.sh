#!/usr/bin/env bash
# The whole test suite on the CPU, from a fresh clone: the programs some tests drive (Debian's chromium for
# `gpuanat serve` in a browser, prometheus for --metrics), where apt-get can install them; gpuanat with its test
# extras; then pytest (arguments are passed on). Without chromium or prometheus their tests are skipped, saying why.
set -euo pipefail
cd "$(dirname "$0")/.."
missing=()
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing+=(chromium)
command -v prometheus >/dev/null || missing+=(prometheus)
if ((${#missing[@]})) && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "scripts/test.sh: installing ${missing[*]} (Debian packages) for their tests" >&2
    { apt-get install -y -q --no-install-recommends "${missing[@]}" \
        || { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; }; } >/dev/null \
        || echo "scripts/test.sh: could not install ${missing[*]}; their tests are skipped" >&2
fi
python3 -m pip install -q -e ".[test]"
exec python3 -m pytest "$@"
