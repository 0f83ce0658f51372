#!/usr/bin/env bash
# Installs what is missing, and nothing twice: Debian's redis-server (and chromium for the
# tests: `ops/setup.sh --tests`), a virtualenv in .venv with
# PyTorch 2.13.0 (the CPU build this machine keeps on disk; never a CUDA build) and this project
# with its test extras. Re-running it is cheap: it reinstalls only when pyproject.toml changed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# Debian packages: redis-server, and with `--tests` chromium too (the dashboard's browser tests
# drive it through Playwright; no browser is ever downloaded).
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
if [ "${1:-}" = "--tests" ] && ! command -v chromium >/dev/null 2>&1; then
  missing="$missing chromium"
fi
if [ -n "$missing" ]; then
  echo "setup: installing$missing (Debian packages)" >&2
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq $missing >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$python" -m venv .venv
fi

stamp=.venv/.canary-installed
want=$(sha256sum pyproject.toml | cut -c1-16)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python packages into .venv (first run takes a minute)" >&2
  .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
  .venv/bin/pip install -q --disable-pip-version-check -e ".[test]"
  echo "$want" > "$stamp"
fi
