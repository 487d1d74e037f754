#!/usr/bin/env bash
# The programs some tests drive, from Debian's packages where apt-get can install them: chromium (`gpuanat serve` in
# a browser, tests/test_serve.py) and prometheus (--metrics, tests/test_metrics.py). Without them those tests are
# skipped, saying why; this script never fails the test command.
cd "$(dirname "$0")/.." || exit 0
missing=()
command -v chromium >/dev/null || command -v chromium-browser >/dev/null || missing+=(chromium)
command -v prometheus >/dev/null || missing+=(prometheus)
if ((${#missing[@]})) && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
    echo "scripts/test_tools.sh: installing ${missing[*]} (Debian packages) for their tests" >&2
    { apt-get install -y -q --no-install-recommends "${missing[@]}" \
        || { apt-get update -q && apt-get install -y -q --no-install-recommends "${missing[@]}"; }; } >/dev/null 2>&1 \
        || echo "scripts/test_tools.sh: could not install ${missing[*]}; their tests are skipped" >&2
fi
exit 0
