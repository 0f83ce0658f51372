#!/usr/bin/env bash
# One command to test: install what is missing, then run the whole suite (unit, integration with
# a real Redis server and a real Ray Serve app, e2e with `serve run`). Extra arguments go to
# pytest, e.g. `ops/test.sh tests/unit -q`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash ops/setup.sh --tests
export PATH="$root/.venv/bin:$PATH"
if [ $# -eq 0 ]; then set -- tests; fi
exec python -m pytest "$@"
