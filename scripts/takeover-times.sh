#!/usr/bin/env bash
# The takeover time after `kill -9` (issue 19's figure, goal <= 30 s): 20 trials, each of
# two real `threadgate serve` processes on one fresh Postgres database and this Docker
# engine, 10 sessions started on them; the instance owning the most is killed with -9
# and the time until the other owns every one of its leases, and until each of its
# sessions runs again in a container there, is measured. Prints each trial, then p50
# and max of both with the load average (other work on the machine shows there).
#
# Knobs (environment): THREADGATE_TAKEOVER_TRIALS (20), THREADGATE_TAKEOVER_LEASE_SECS
# (15, threadgate's default `[sessions] lease_time`), THREADGATE_TAKEOVER_THREADS (10).
# Starts Docker and PostgreSQL first (scripts/docker-up.sh, scripts/postgres-up.sh);
# the sandbox image must be built (scripts/build-sandbox-image.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/docker-up.sh
THREADGATE_TEST_DATABASE_URL="$(scripts/postgres-up.sh)"
export THREADGATE_TEST_DATABASE_URL
export THREADGATE_REQUIRE_DOCKER=1
echo "takeover-times: load average before: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
cargo test --test it instances_pg::takeover_times -- --ignored --exact --nocapture \
    2>&1 | grep --line-buffered -E '^takeover|^test result|panicked|FAILED' || {
    echo "takeover-times: the trials failed (run the command above without the filter)" >&2
    exit 1
}
