#!/usr/bin/env bash
# One command to test: install what is missing, lint the whole tree (`ruff check .`, the rules in
# pyproject.toml; any finding fails the run before a test starts), then run the whole suite (unit,
# integration with a real Redis server and a real Ray Serve app, e2e with `serve run`). Extra
# arguments go to pytest, e.g. `ops/test.sh tests/unit -q`.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash ops/setup.sh --tests
export PATH="$root/.venv/bin:$PATH"
if ! ruff check --quiet .; then
  echo "test: ruff found the findings above; fix them (\`ruff check --fix .\` fixes some)" >&2
  exit 1
fi
# the whole suite also lists its 30 slowest tests: where CI time goes
if [ $# -eq 0 ]; then set -- tests --durations=30; fi
exec python -m pytest "$@"
