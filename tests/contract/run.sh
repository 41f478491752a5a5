#!/usr/bin/env bash
# The API contract check: schemathesis against a live server, as an admin and as a viewer, with
# every check on. The server runs on a database of its own (SQLite in a temporary directory) with
# a few jobs and runs to read; nothing else on the machine is touched. Bounded and seeded:
#   tests/contract/run.sh [max-examples per operation, default 25] [seed, default 20261201]
# Exit 0 only when both runs find no failure.
set -euo pipefail
cd "$(dirname "$0")/../.."

MAX_EXAMPLES="${1:-25}"
SEED="${2:-20261201}"
PY=.venv/bin/python
ST=.venv/bin/schemathesis

WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

export SCHEDULER_VAR_DIR="$WORK"
export DATABASE_URL="sqlite:///$WORK/contract.sqlite3"
export REDIS_URL=""
export DJANGO_DEBUG=0
# The contract is about shapes and statuses, not rate limits: the limits stay on, only high enough
# that generated traffic does not hit them (a 429 is declared, so it would not fail a check either).
export SCHEDULER_API_RATE_USER=100000/min SCHEDULER_API_RATE_WRITES=100000/min
export SCHEDULER_API_RATE_ANON=100000/min

"$PY" manage.py migrate --noinput -v0
"$PY" tests/contract/seed.py > "$WORK/keys"
ADMIN_KEY="$(sed -n 1p "$WORK/keys")"
VIEWER_KEY="$(sed -n 2p "$WORK/keys")"

PORT="$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
"$PY" manage.py runserver --noreload --nothreading "127.0.0.1:$PORT" > "$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 100); do
  curl -fsS -o /dev/null "http://127.0.0.1:$PORT/health/live" 2>/dev/null && break
  sleep 0.2
done

run_as() {
  local role="$1" key="$2"
  echo "=== schemathesis as $role (max-examples $MAX_EXAMPLES, seed $SEED) ==="
  "$ST" --config-file tests/contract/schemathesis.toml run \
    "http://127.0.0.1:$PORT/api/schema/?format=json" \
    -H "Authorization: Token $key" \
    --max-examples "$MAX_EXAMPLES" --seed "$SEED" --no-color
}

status=0
run_as admin "$ADMIN_KEY" || status=1
run_as viewer "$VIEWER_KEY" || status=1
if [ "$status" -ne 0 ]; then
  echo "--- server log (tail) ---"
  tail -40 "$WORK/server.log"
fi
exit "$status"
