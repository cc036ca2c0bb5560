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
# A burst of run-page sockets (a shared dashboard opened by a team) queues in the listen backlog
# (Twisted's default is 50) and needs more than daphne's default 5 s to be accepted: 1,000 at
# once take ~10 s on one process (bench/RUNS.md).
if [[ "$HOST" == *:* ]]; then
  LISTEN=(-b "$HOST" -p "$PORT")  # IPv6: daphne's own flags (no backlog option)
else
  LISTEN=(-e "tcp:port=$PORT:interface=$HOST:backlog=${DAPHNE_BACKLOG:-1024}")
fi
DAPHNE_ARGS=(--websocket_connect_timeout "${WEBSOCKET_CONNECT_TIMEOUT:-30}")
if [ "${WEB_SERVER:-daphne}" = "uvicorn" ]; then
  # uvicorn (uvloop, httptools) instead of daphne: one or WEB_PROCESSES processes, supervised.
  $BIN/python -m conductor_web.serve --host "$HOST" --port "$PORT"
elif [ "${WEB_PROCESSES:-1}" != "1" ]; then
  # Several daphne processes on one address (SO_REUSEPORT), supervised; the settings refuse this
  # on the embedded backends.
  $BIN/python -m conductor_web.serve --host "$HOST" --port "$PORT" -- "${DAPHNE_ARGS[@]}"
else
  $BIN/daphne "${LISTEN[@]}" "${DAPHNE_ARGS[@]}" conductor_web.asgi:application
fi
