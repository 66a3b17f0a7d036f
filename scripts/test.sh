#!/usr/bin/env bash
# Runs threadgate's whole test suite on this machine, installing and starting what the
# tests need first: a Docker engine, the sandbox image, the localstripe venv, and
# ripgrep (the agent runner's code search, tested on the host).
# headless Chromium with chromedriver (the review page's browser tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/docker-up.sh
scripts/build-sandbox-image.sh
scripts/localstripe.sh setup
if ! command -v rg >/dev/null 2>&1; then
    echo "test.sh: installing ripgrep with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ripgrep
fi
scripts/browser-up.sh
exec cargo test --all-targets "$@"
