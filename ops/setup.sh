#!/usr/bin/env bash
# Installs what is missing, and nothing twice: Debian's redis-server (and chromium and
# prometheus for the tests: `ops/setup.sh --tests`), a virtualenv in .venv with
# PyTorch 2.13.0 (the CPU build this machine keeps on disk; never a CUDA build) and this project
# with its test extras (and, with `--tests`, its `peers` extra). Re-running it is cheap: it reinstalls only when pyproject.toml changed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

# Debian packages: redis-server, and with `--tests` chromium too (the dashboard's browser tests
# drive it through Playwright; no browser is ever downloaded). The Sentinel tests run Debian's
# redis-server as `redis-server sentinel.conf --sentinel`: no redis-sentinel package (it would
# install and start a system service).
missing=""
command -v redis-server >/dev/null 2>&1 || missing="$missing redis-server"
if [ "${1:-}" = "--tests" ] && ! command -v chromium >/dev/null 2>&1; then
  missing="$missing chromium"
fi
# `ip netns` for the two-node test's worker node (tests/cluster.py); no service
if [ "${1:-}" = "--tests" ] && ! command -v ip >/dev/null 2>&1; then
  missing="$missing iproute2"
fi
if [ -n "$missing" ]; then
  echo "setup: installing$missing (Debian packages)" >&2
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq $missing >/dev/null
fi

# With `--tests`, servers the tests run themselves (prometheus: tests/integration/
# test_prometheus.py), installed without their services: a policy-rc.d that denies every start
# is in place while they install (Debian's way; without it a container without systemd starts
# them), and a systemd host has their units disabled afterwards: nothing stays listening.
servers=""
if [ "${1:-}" = "--tests" ]; then
  command -v prometheus >/dev/null 2>&1 || servers="$servers prometheus"
fi
if [ -n "$servers" ]; then
  echo "setup: installing$servers (Debian packages; their services stay off)" >&2
  sudo_cmd=""; [ "$(id -u)" = 0 ] || sudo_cmd="sudo"
  policy=/usr/sbin/policy-rc.d; own_policy=""
  if [ ! -e "$policy" ]; then
    own_policy=1
    trap '[ -z "$own_policy" ] || $sudo_cmd rm -f "$policy"' EXIT
    printf '#!/bin/sh\nexit 101\n' | $sudo_cmd tee "$policy" >/dev/null
    $sudo_cmd chmod 755 "$policy"
  fi
  [ -n "$missing" ] || $sudo_cmd apt-get update -qq
  # shellcheck disable=SC2086
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq --no-install-recommends \
    $servers >/dev/null
  if [ -n "$own_policy" ]; then $sudo_cmd rm -f "$policy"; own_policy=""; fi
  if [ -d /run/systemd/system ]; then
    for unit in $servers; do $sudo_cmd systemctl disable --now "$unit" >/dev/null 2>&1 || true; done
  fi
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv" >&2
  "$python" -m venv .venv
fi

# with `--tests`, the `peers` extra too: LitServe, which tests/integration/test_bench_peers.py
# starts (Infinity, the other peer, has a virtualenv of its own: docs/benchmarks.md)
extras=test
if [ "${1:-}" = "--tests" ]; then extras=test,peers; fi
stamp=.venv/.canary-installed
want="$(sha256sum pyproject.toml | cut -c1-16) $extras"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing Python packages into .venv (first run takes a minute)" >&2
  .venv/bin/pip install -q --disable-pip-version-check --upgrade pip
  .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0
  .venv/bin/pip install -q --disable-pip-version-check -e ".[$extras]"
  echo "$want" > "$stamp"
fi
