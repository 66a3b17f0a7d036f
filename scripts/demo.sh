#!/usr/bin/env bash
# The newcomer's first run: threadgate's whole flow on this machine, no outside account.
# Embedded state in a temp dir, sessions in local Docker containers, localstripe for
# Stripe, a fake Plain, and a SCRIPTED MODEL (not a real model) behind the model proxy.
# Three signed webhooks open three threads; the summary shows per thread what ran, what
# is held (with its approval link on the app's real address), what was blocked, and its
# branch with its last commit. The app stops when the summary is printed.
#
# Usage: scripts/demo.sh                 the demo
#        scripts/demo.sh --keep          the demo, then threadgate stays up until Ctrl-C
#        scripts/demo.sh --first-call 10 webhook -> first tool call, median over 10 threads
# Installs/starts Docker, builds the sandbox image (with the runner) and the localstripe
# venv when missing. SANDBOX_IMAGE / THREADGATE_SANDBOX_IMAGE pick another image tag.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/docker-up.sh
scripts/build-sandbox-image.sh
scripts/localstripe.sh setup
if [ -n "${SANDBOX_IMAGE:-}" ]; then
    export THREADGATE_SANDBOX_IMAGE="$SANDBOX_IMAGE"
fi
cargo build --quiet --example demo
exec "${CARGO_TARGET_DIR:-target}/debug/examples/demo" "$@"
