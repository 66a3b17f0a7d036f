#!/usr/bin/env bash
# Make sure a Docker engine answers on this machine.
#
# If `docker info` already works, do nothing. Otherwise install Debian's `docker.io`
# (apt-get update first) when `dockerd` is missing, start `dockerd` in the background
# with its log in $DOCKERD_LOG, and wait (bounded) until `docker info` answers.
# Idempotent: safe to run any number of times. Needs root on Debian 12; reaches only
# Debian's package mirror.
#
# Environment:
#   DOCKERD_LOG       where dockerd logs (default /var/log/threadgate-dockerd.log)
#   DOCKER_UP_TIMEOUT seconds to wait for the engine (default 60)
set -euo pipefail

log="${DOCKERD_LOG:-/var/log/threadgate-dockerd.log}"
timeout="${DOCKER_UP_TIMEOUT:-60}"

say() { echo "docker-up: $*" >&2; }

engine_answers() { docker info >/dev/null 2>&1; }

if command -v docker >/dev/null 2>&1 && engine_answers; then
    say "engine already answers"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    say "docker info fails and this script is not root: cannot install or start dockerd"
    exit 1
fi

if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    say "installing docker.io with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends docker.io iptables ca-certificates
fi

# A dockerd may already be starting (another run of this script, or a service manager);
# start one only if none is running.
if pgrep -x dockerd >/dev/null 2>&1; then
    say "a dockerd is already running; waiting for it to answer"
else
    say "starting dockerd (log: $log)"
    mkdir -p "$(dirname "$log")"
    # setsid detaches dockerd from this shell's process group so it outlives the script.
    setsid nohup dockerd >>"$log" 2>&1 </dev/null &
fi

deadline=$((SECONDS + timeout))
until engine_answers; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        say "engine did not answer within ${timeout}s; last lines of $log:"
        tail -n 30 "$log" >&2 || true
        exit 1
    fi
    sleep 0.5
done
say "engine answers: $(docker version --format '{{.Server.Version}} (API {{.Server.APIVersion}})')"
