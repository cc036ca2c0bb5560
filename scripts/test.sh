#!/usr/bin/env bash
# Runs the suite in two phases: the distributed mode (PostgreSQL, channels-redis, a real Celery
# worker over RabbitMQ) runs the runtime tests and the embedded defaults (SQLite, in-memory layer,
# in-process threads) run every test; side by side unless CONDUCTOR_TEST_PHASES=sequential.
# Which tests are runtime is decided in tests/phases.py; scripts/phase_coverage.py proves every
# collected test runs in at least one phase.
# Each phase prints its 25 slowest tests and writes JUnit XML to var/test-reports/<phase>.xml.
set -uo pipefail
BIN=.venv/bin
REPORTS=var/test-reports
mkdir -p "$REPORTS"
rm -f "$REPORTS/distributed.xml" "$REPORTS/embedded.xml" "$REPORTS/distributed.log"  # a stale report must not be summarised
PYTEST=("$BIN/python" -m pytest --durations=25)

DIST_DATABASE_URL=${TEST_DATABASE_URL:-postgres://postgres@127.0.0.1:5432/conductor}
DIST_REDIS_URL=${TEST_REDIS_URL:-redis://127.0.0.1:6379/1}
DIST_BROKER_URL=${TEST_CELERY_BROKER_URL:-amqp://guest:guest@127.0.0.1:5672//}

probe() {  # host port -> 0 if something listens
  "$BIN/python" - "$1" "$2" <<'PY'
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=2).close()
except OSError:
    sys.exit(1)
PY
}

missing=()
probe 127.0.0.1 5432 || missing+=("PostgreSQL on 127.0.0.1:5432")
probe 127.0.0.1 6379 || missing+=("Redis on 127.0.0.1:6379")
probe 127.0.0.1 5672 || missing+=("RabbitMQ on 127.0.0.1:5672")

# The phases share no state: the distributed one uses PostgreSQL/Redis/RabbitMQ under its own test
# id, the embedded one SQLite files and in-memory layers under another. So by default they run side
# by side (most of each phase's time is spent waiting on servers, sockets and subprocesses, not CPU);
# CONDUCTOR_TEST_PHASES=sequential runs them one after the other, as before.
ORDER=${CONDUCTOR_TEST_PHASES:-parallel}
BASE_ID=${CONDUCTOR_TEST_ID:-}
status=0
dist_status=0
dist_pid=""
DIST_LOG="$REPORTS/distributed.log"

run_distributed() {
  # The local-model (slow) tests run once, in the embedded phase.
  local started=$SECONDS rc=0
  CONDUCTOR_TEST_ID="${BASE_ID}d" CONDUCTOR_PHASE=distributed CONDUCTOR_SLOW=skip \
    DATABASE_URL=$DIST_DATABASE_URL REDIS_URL=$DIST_REDIS_URL CELERY_BROKER_URL=$DIST_BROKER_URL \
    "${PYTEST[@]}" --junitxml="$REPORTS/distributed.xml" "$@" || rc=$?
  echo "make test: distributed phase took $((SECONDS - started)) s (exit $rc)"
  return $rc
}

run_embedded() {
  local started=$SECONDS rc=0
  CONDUCTOR_TEST_ID="${BASE_ID}e" CONDUCTOR_PHASE=embedded env -u DATABASE_URL -u REDIS_URL -u CELERY_BROKER_URL \
    "${PYTEST[@]}" --junitxml="$REPORTS/embedded.xml" "$@" || rc=$?
  echo "make test: embedded phase took $((SECONDS - started)) s (exit $rc)"
  return $rc
}

echo "=== make test: phase 1/2 — distributed mode (PostgreSQL, Redis channel layer, Celery over RabbitMQ): runtime tests ==="
if [ ${#missing[@]} -gt 0 ]; then
  if [ "${CI:-}" = "true" ]; then
    echo "ERROR: CI=true requires the distributed services; missing: ${missing[*]}" >&2
    exit 3
  fi
  echo "SKIPPED distributed phase: missing ${missing[*]} (set CI=true to make this an error)"
elif [ "$ORDER" = "sequential" ]; then
  run_distributed "$@" || dist_status=$?
else
  echo "(running beside the embedded phase; its output follows the embedded phase's, from $DIST_LOG)"
  run_distributed "$@" >"$DIST_LOG" 2>&1 &
  dist_pid=$!
fi

echo "=== make test: phase 2/2 — embedded mode (SQLite, in-memory channel layer, in-process threads): every test ==="
emb_status=0
run_embedded "$@" || emb_status=$?

if [ -n "$dist_pid" ]; then
  wait "$dist_pid" || dist_status=$?
  echo "=== make test: phase 1/2 — distributed mode, its output ==="
  cat "$DIST_LOG"
fi
if [ $dist_status -ne 0 ]; then status=$dist_status; elif [ $emb_status -ne 0 ]; then status=$emb_status; fi

echo "=== make test: summary ==="
python3 scripts/junit_summary.py "$REPORTS/distributed.xml" "$REPORTS/embedded.xml"
if [ $status -ne 0 ]; then echo "make test: FAILED (exit $status)"; else echo "make test: both phases passed"; fi
exit $status
