#!/usr/bin/env bash
# Start the product on its embedded defaults (or the distributed backends the environment names).
set -euo pipefail
HOST="$1"; PORT="$2"
BIN=.venv/bin
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM

if [ -n "${CELERY_BROKER_URL:-}" ]; then
  echo "Starting a Celery worker (with beat) beside the server: broker ${CELERY_BROKER_URL%%://*}://…"
  $BIN/celery -A conductor_web worker -B -l info --pool threads --concurrency 4 &
  pids+=($!)
fi
echo
echo "Conductor Web is starting on http://$HOST:$PORT/  (health: http://$HOST:$PORT/healthz)"
grep -E "^(users|password):" var/demo-credentials.txt 2>/dev/null || echo "Log in with the demo users and DEMO_PASSWORD."
echo
$BIN/daphne -b "$HOST" -p "$PORT" conductor_web.asgi:application
