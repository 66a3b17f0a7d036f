#!/usr/bin/env bash
# Runs threadgate's whole test suite on this machine, installing and starting what the
# tests need first: a Docker engine, the sandbox image, the localstripe venv, and
# headless Chromium with chromedriver (the review page's browser tests).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/docker-up.sh
scripts/build-sandbox-image.sh
scripts/localstripe.sh setup
scripts/browser-up.sh
exec cargo test --all-targets "$@"
