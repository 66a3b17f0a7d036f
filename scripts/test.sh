#!/usr/bin/env bash
# Runs threadgate's whole test suite on this machine, installing and starting what the
# tests need first: a Docker engine, the sandbox image, the localstripe venv, and
# ripgrep (the agent runner's code search, tested on the host), and
# headless Chromium with chromedriver (the review page's browser tests), npm's
# oidc-provider (the review page's single sign-on tests), and a PostgreSQL server (the
# store's tests on Postgres: THREADGATE_TEST_DATABASE_URL, each test makes its own
# database on it).
#
# Docker is required here (THREADGATE_REQUIRE_DOCKER=1): a Docker test that cannot run
# fails instead of skipping, as it may under a bare `cargo test`. Prints the suite's wall
# time (setup apart) with the load average at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
started_setup=$(date +%s)
scripts/docker-up.sh
scripts/build-sandbox-image.sh
scripts/localstripe.sh setup
if ! command -v rg >/dev/null 2>&1; then
    echo "test.sh: installing ripgrep with apt-get" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends ripgrep
fi
scripts/browser-up.sh
# The official TypeScript MCP SDK, for the test that a TypeScript client's default
# timeout gets threadgate_wait's answer (mcp_e2e's progress tests).
if [ ! -d .mcp-sdk/node_modules/@modelcontextprotocol/sdk ]; then
    echo "test.sh: installing @modelcontextprotocol/sdk with npm into .mcp-sdk" >&2
    npm install --prefix .mcp-sdk --no-audit --no-fund --silent @modelcontextprotocol/sdk@1.32.2 >&2
fi
export MCP_SDK_DIR="$PWD/.mcp-sdk"
# A real OpenID provider (npm's oidc-provider), which the review page's sign-in tests
# start on a loopback port with scripts/oidc-provider.mjs.
if [ ! -d .oidc-provider/node_modules/oidc-provider ]; then
    echo "test.sh: installing oidc-provider with npm into .oidc-provider" >&2
    npm install --prefix .oidc-provider --no-audit --no-fund --silent oidc-provider@9.13.3 >&2
fi
export OIDC_PROVIDER_DIR="$PWD/.oidc-provider"
export THREADGATE_REQUIRE_DOCKER=1
THREADGATE_TEST_DATABASE_URL="$(scripts/postgres-up.sh)"
export THREADGATE_TEST_DATABASE_URL
started=$(date +%s)
status=0
results=$(mktemp)
trap 'rm -f "$results"' EXIT
# The MCP probe runs inside a sandbox container as a program: `cargo test` would build
# the example only as a test harness.
cargo build --example mcp_probe
cargo test --all-targets "$@" 2>&1 | tee -a "$results" || status=$?
# The OpenTelemetry export is a cargo feature: its test runs with the feature on.
cargo test --features otlp --test otlp_export "$@" 2>&1 | tee -a "$results" || status=$?
finished=$(date +%s)
read -r load1 load5 load15 _ < /proc/loadavg
echo "test.sh: suite wall time $((finished - started)) s (setup $((started - started_setup)) s);" \
    "load average $load1 $load5 $load15; exit status $status" >&2
# One total over every test binary of both runs.
awk '/^test result:/ { for (i = 1; i <= NF; i++) { if ($(i + 1) ~ /^passed/) p += $i; if ($(i + 1) ~ /^failed/) f += $i; if ($(i + 1) ~ /^ignored/) g += $i } }
     END { printf "tests: %d passed, %d failed, %d skipped\n", p, f, g }' "$results"
exit "$status"
