#!/usr/bin/env bash
# Gated tool calls per second against one Postgres primary with three instances
# (issue 19's figure, goal >= 1,000/s): benches/gated_throughput.rs runs three real
# `threadgate serve` processes on a fresh database of the Postgres server that
# scripts/postgres-up.sh starts and on this Docker engine, opens 10 sessions of a quiet
# agent on each, and drives concurrent `stripe.list_charges` reads (localstripe)
# through the sessions' sockets under a policy whose rule for that read carries a
# per-customer limit, so each call reserves against a limit total. Prints calls/s in
# all and per instance, p50/p99, answers that were not 200 ok, commits and rollbacks
# (SERIALIZABLE retries) on the database, where its connections spent their time,
# the load average, and `threadgate audit --verify` after the run.
#
# Usage: scripts/gated-throughput.sh [--release] [BEFORE_BINARY]
#   --release      the release figure (builds the release profile: slow the first time);
#                  without it a debug build, for a before/after comparison only.
#   BEFORE_BINARY  a `threadgate` binary built from another commit: the bench runs with
#                  it first, then with this tree's, one after the other (side by side).
# Knobs (environment): GATED_BENCH_SECONDS (20), GATED_BENCH_SESSIONS (10 per
# instance), GATED_BENCH_IN_FLIGHT (2 calls per session). Needs the sandbox image
# (scripts/build-sandbox-image.sh) and .venv-peers (scripts/localstripe.sh setup).
set -euo pipefail
cd "$(dirname "$0")/.."
profile=(--profile dev)
bin=target/debug/threadgate
build=(cargo build --bin threadgate)
if [ "${1:-}" = "--release" ]; then
    shift
    profile=()
    bin=target/release/threadgate
    build=(cargo build --release --bin threadgate)
fi
before="${1:-}"
scripts/docker-up.sh
THREADGATE_TEST_DATABASE_URL="$(scripts/postgres-up.sh)"
export THREADGATE_TEST_DATABASE_URL
export THREADGATE_REQUIRE_DOCKER=1
"${build[@]}"
cargo bench "${profile[@]}" --bench gated_throughput --no-run
run() {
    echo "gated-throughput: $1 ($2), load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2
    THREADGATE_TEST_BIN="$2" cargo bench "${profile[@]}" --bench gated_throughput 2>&1 \
        | grep --line-buffered -v -E '^ *(Compiling|Finished|Running)'
}
if [ -n "$before" ]; then
    run before "$before"
fi
run "this tree" "$PWD/$bin"
