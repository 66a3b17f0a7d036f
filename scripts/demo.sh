#!/usr/bin/env bash
# The newcomer's first run: threadgate's whole flow on this machine, no outside account.
# Embedded state in a temp dir, sessions in local Docker containers, localstripe for
# Stripe, fakes of Plain and GitHub, and a SCRIPTED MODEL (not a real model) behind the
# model proxy. Four signed webhooks open four threads (charged twice, a goodwill refund,
# a prompt injection, a bug report). The summary shows per thread what ran, what is held
# (each held call's whole note as it was posted to the thread, with its approval link),
# what was blocked, the replies, and for the bug report, whose agent reproduces the bug
# in its workspace, the branch's commits and the draft pull request GitHub received.
# Then threadgate and its review page stay up: sign in with the printed reviewer and
# password, approve the held refund, and the demo prints what ran. Ctrl-C stops
# everything and removes its containers, temp dirs and localstripe.
#
# Usage: scripts/demo.sh                 the demo, then stay up for a reviewer until Ctrl-C
#        scripts/demo.sh --no-wait       the demo, printed, then stop and clean up (CI)
#        scripts/demo.sh --first-call 10 webhook -> first tool call, median over 10 threads
# (--keep is gone: staying up is the default now.)
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
