#!/usr/bin/env bash
# Cold starts of two threadgate builds side by side in one run, measured from outside
# (issue 21: "cold path unchanged or better"). Each binary runs its own `threadgate
# serve` (SQLite in a temp data dir, local Docker, the sandbox image
# threadgate-sandbox:latest, a fresh git repository, its own secrets root); one
# `threadgate scripted-model` (NOT a real model, started from NEW) answers both. New
# threads alternate between the builds (A B, B A, ...), one at a time, COMPARE_THREADS
# (30) each after one warm-up each, with the pool off on NEW (sessions.pool_size = 0;
# OLD gets no pool key: a build from before the pool refuses it). For every thread,
# from the moment its signed webhook is sent (HMAC-SHA256 of the body, as Plain signs):
#   - to its container running: the engine's `start` event for the container labelled
#     with the thread (`docker events`);
#   - to the agent runner's process, first seen in /proc (polled every 2 ms; its
#     environment names the thread);
#   - to the agent's first connection on its session socket: the accepted connection
#     on <data_dir>/sockets/<session>/api.sock, seen in the runner's
#     /proc/<pid>/net/unix (it lives in the container's network namespace; polled
#     every 2 ms): the runner's first request, which both builds serve;
#   - to the session's row saying `running` (read-only SQLite reads every 2 ms);
#   - and each build's own log line "session start finished took_ms=N" (the start off
#     the supervisor: worktree, its filesystem, socket, container), which both write.
# Each thread is then marked done. Prints min/p50/p90/p99/max per build and measure,
# and the load average before, between and after.
#
# Then (COMPARE_STREAM_SECS, 60; 0 skips it) NEW alone with its pool on
# (COMPARE_POOL_SIZE, 2) takes one new thread per second: first connection and running
# p50/p90/p99, and the hit rate (its "session has its sandbox" log lines, launch=warm
# over all; also how many threads had a container started for them, seen from outside).
#
# Both builds use this tree's agents/ and policies/support.yaml and Plain's example
# deliveries (THREADGATE_SHARED/plain/examples, default ../shared beside the repository).
# The sandbox image is shared: its runner (this tree's, polling for its socket every
# 5 ms) works with a pre-pool server too, since a cold start mounts the socket before the
# container starts. THREADGATE_SANDBOX_IMAGE picks another image.
#
# Needs root (Docker, /proc/net/unix of the host's namespace, the pool's mounts),
# scripts/docker-up.sh and scripts/build-sandbox-image.sh run, python3 and git.
# COMPARE_KEEP=1 keeps the temp dir with both builds' logs. COMPARE_GAP_SECS (1.0) is the
# pause before each thread.
#
# Usage: scripts/cold-start-compare.sh OLD_THREADGATE NEW_THREADGATE
# e.g.   git worktree add /tmp/prepool ef2a853^ && (cd /tmp/prepool && cargo build --bin threadgate)
#        scripts/cold-start-compare.sh /tmp/prepool/target/debug/threadgate target/debug/threadgate
set -euo pipefail
if [ $# -ne 2 ]; then
    sed -n '2,/^# Usage/p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
old=$(realpath "$1")
new=$(realpath "$2")
for b in "$old" "$new"; do
    [ -x "$b" ] || { echo "cold-start-compare: $b is not an executable" >&2; exit 2; }
done
cd "$(dirname "$0")/.."
repo=$(pwd)
shared=${THREADGATE_SHARED:-$(realpath ../shared 2>/dev/null || true)}
examples="$shared/plain/examples"
if [ ! -f "$examples/thread-created.json" ]; then
    # The shared directory beside one of the repository's parents (a worktree).
    for d in "$repo"/.. "$repo"/../.. "$repo"/../../..; do
        if [ -f "$d/shared/plain/examples/thread-created.json" ]; then
            examples=$(realpath "$d/shared/plain/examples")
            break
        fi
    done
fi
[ -f "$examples/thread-created.json" ] || {
    echo "cold-start-compare: Plain's examples not found: set THREADGATE_SHARED" >&2
    exit 2
}
image=${THREADGATE_SANDBOX_IMAGE:-threadgate-sandbox:latest}
docker image inspect "$image" >/dev/null 2>&1 || {
    echo "cold-start-compare: no image $image: run scripts/build-sandbox-image.sh" >&2
    exit 2
}
[ "$(id -u)" = 0 ] || echo "cold-start-compare: not root: the pool (stream) stays empty" >&2
COMPARE_PLAIN_EXAMPLES="$examples" COMPARE_REPO_ROOT="$repo" \
    exec python3 -u scripts/cold_start_compare.py "$old" "$new"
