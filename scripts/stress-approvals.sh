#!/usr/bin/env bash
# Stress: kill -9 of the instance that runs approved calls, at random points around
# approve -> claim -> send, TRIALS times (default 10,000), with real `threadgate serve`
# processes on one Postgres and one localstripe. It runs the same test as the suite
# (tests/it/instances_approvals.rs, 200 trials there) with more trials:
#
#   scripts/stress-approvals.sh                 10,000 trials
#   TRIALS=1000 scripts/stress-approvals.sh     fewer
#   CHUNK=500 scripts/stress-approvals.sh       trials per run of the test (default 1,000):
#                                               each run is a fresh cluster, checked in full
#                                               at its end, so a stopped stress still has
#                                               every finished chunk's verdict
#   CALLS_PER_LIFE=25 scripts/stress-approvals.sh   more approved calls per victim life
#                                               (default 10; fewer restarts, same checks)
#
# Needs Docker (scripts/docker-up.sh: the harness's world), localstripe
# (scripts/localstripe.sh setup) and Postgres: THREADGATE_TEST_DATABASE_URL, else the
# cluster scripts/postgres-up.sh starts (the test creates a database of its own on it
# and drops it after). It prints the trials, where the kills landed, double executions
# (must be 0) and lost approvals (must be 0), and fails on either.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
trials="${TRIALS:-10000}"
per_life="${CALLS_PER_LIFE:-10}"
if [[ -z "${THREADGATE_TEST_DATABASE_URL:-}" ]]; then
  THREADGATE_TEST_DATABASE_URL="$(scripts/postgres-up.sh | tail -n 1)"
  export THREADGATE_TEST_DATABASE_URL
fi
scripts/localstripe.sh setup >/dev/null
chunk="${CHUNK:-1000}"
echo "stress-approvals: $trials trials in runs of $chunk, $per_life approved calls per victim life (load $(cut -d' ' -f1-3 /proc/loadavg))"
started=$(date +%s)
logs="$repo/target/stress-approvals"
mkdir -p "$logs"
done_trials=0
while (( done_trials < trials )); do
  n=$(( trials - done_trials < chunk ? trials - done_trials : chunk ))
  log="$logs/run-$(( done_trials / chunk + 1 )).log"
  status=0
  THREADGATE_APPROVAL_TRIALS="$n" THREADGATE_APPROVAL_CALLS_PER_LIFE="$per_life" \
    cargo test --test it \
    instances_approvals::kill_9_of_the_runner_around_approve_claim_send_never_doubles_or_loses_a_refund \
    -- --exact --nocapture >"$log" 2>&1 || status=$?
  grep -E "kill -9 trials|panicked|test result" "$log" || true
  if (( status != 0 )); then
    echo "stress-approvals: FAILED after $done_trials trials passed (this run: $n trials; log $log)"
    exit 1
  fi
  done_trials=$(( done_trials + n ))
  echo "stress-approvals: $done_trials of $trials trials passed, $(( $(date +%s) - started )) s (load $(cut -d' ' -f1-3 /proc/loadavg))"
done
echo "stress-approvals: all $trials trials passed in $(( $(date +%s) - started )) s"
