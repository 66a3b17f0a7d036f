#!/usr/bin/env bash
# localstripe for the Stripe connector's tests.
#
#   scripts/localstripe.sh setup        create .venv-peers (python venv with localstripe) if missing
#   scripts/localstripe.sh start PORT   setup, then run localstripe_plus.py on PORT in the
#                                       background and wait until it answers; prints its pid
#   scripts/localstripe.sh stop PORT    stop the instance started on PORT
#
# The tests (tests/it/support/localstripe.rs) only need `setup`: they start their own
# instances on free ports. Every instance runs through scripts/localstripe_isolated.py,
# which gives it its own state file instead of localstripe's shared /tmp one.
# localstripe_plus.py is looked up in $THREADGATE_SHARED/peers, else in the first
# `shared/peers` found beside the repository or one of its parents.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
venv="$repo/.venv-peers"
localstripe_version="1.15.10"

shared_dir() {
  if [[ -n "${THREADGATE_SHARED:-}" ]]; then
    echo "$THREADGATE_SHARED"
    return
  fi
  local dir="$repo"
  while [[ "$dir" != "/" ]]; do
    dir="$(dirname "$dir")"
    if [[ -f "$dir/shared/peers/localstripe_plus.py" ]]; then
      echo "$dir/shared"
      return
    fi
  done
  echo "$repo/../shared"
}

setup() {
  if "$venv/bin/python" -c 'import localstripe' >/dev/null 2>&1; then
    return
  fi
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet "localstripe==$localstripe_version"
}

pidfile() { echo "$venv/localstripe-$1.pid"; }

start() {
  local port="$1"
  setup
  local script
  script="$(shared_dir)/peers/localstripe_plus.py"
  if [[ ! -f "$script" ]]; then
    echo "localstripe.sh: $script not found (set THREADGATE_SHARED)" >&2
    exit 1
  fi
  # Each instance keeps its state in its own file (localstripe's default is one shared
  # /tmp/localstripe.pickle).
  LOCALSTRIPE_PICKLE="$venv/localstripe-$port.pickle" "$venv/bin/python" \
    "$repo/scripts/localstripe_isolated.py" "$script" --port "$port" --from-scratch \
    >"$venv/localstripe-$port.log" 2>&1 &
  local pid=$!
  echo "$pid" >"$(pidfile "$port")"
  for _ in $(seq 1 150); do
    if "$venv/bin/python" - "$port" <<'PY' 2>/dev/null; then
import sys, urllib.request
request = urllib.request.Request(
    "http://127.0.0.1:%s/v1/customers" % sys.argv[1],
    headers={"Authorization": "Bearer sk_test_ready"})
urllib.request.urlopen(request, timeout=1).read()
PY
      echo "$pid"
      return
    fi
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "localstripe.sh: localstripe exited; see $venv/localstripe-$port.log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "localstripe.sh: localstripe did not answer on port $port" >&2
  kill "$pid" 2>/dev/null || true
  exit 1
}

stop() {
  local file
  file="$(pidfile "$1")"
  if [[ -f "$file" ]]; then
    kill "$(cat "$file")" 2>/dev/null || true
    rm -f "$file"
  fi
  rm -f "$venv/localstripe-$1.pickle" "$venv/localstripe-$1.pickle.tmp"
}

case "${1:-setup}" in
  setup) setup ;;
  start) start "${2:?usage: localstripe.sh start PORT}" ;;
  stop) stop "${2:?usage: localstripe.sh stop PORT}" ;;
  *)
    echo "usage: localstripe.sh [setup | start PORT | stop PORT]" >&2
    exit 2
    ;;
esac
