#!/usr/bin/env bash
# One command to run the gateway: install what is missing, start a local Redis server when
# REDIS_URL is not set, then `serve run serve.config:app` (extra arguments go to it, e.g.
# `max_batch_size=32`). The gateway answers on http://127.0.0.1:8000; Ctrl-C stops it.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash ops/setup.sh

if [ -z "${REDIS_URL:-}" ]; then
  port=${CANARY_LOCAL_REDIS_PORT:-6379}
  export REDIS_URL="redis://127.0.0.1:${port}/0"
  if ! redis-cli -p "$port" ping >/dev/null 2>&1; then
    mkdir -p .run/redis
    echo "run: starting a local Redis server on 127.0.0.1:${port} (data in .run/redis)" >&2
    redis-server --port "$port" --bind 127.0.0.1 --dir "$root/.run/redis" \
      --appendonly yes --daemonize yes --logfile "$root/.run/redis/redis.log" >/dev/null
    for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
  fi
fi

export PATH="$root/.venv/bin:$PATH"
# Ray Serve's throughput mode and direct ingress through HAProxy (serve/ray_env.py says why);
# a value already in the environment wins.
eval "$(python -m serve.ray_env)"
# `serve run` in this process's place, so that a supervisor's SIGTERM reaches it: it stops an
# HAProxy a killed gateway left before it starts, and its own HAProxy goes with it however it
# stops (docs/production.md, "Stopping the gateway").
exec serve run serve.config:app "$@"
