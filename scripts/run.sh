#!/usr/bin/env bash
# Runs threadgate's main job on this machine with its embedded defaults: SQLite state in
# ./data, sessions in local Docker containers, branches in this repository (or
# THREADGATE_REPO). Installs and starts Docker and builds the sandbox image if needed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/docker-up.sh
scripts/build-sandbox-image.sh
mkdir -p data
if [ -z "${THREADGATE_PLAIN_SIGNING_SECRET:-}" ]; then
  secret_file=data/plain-signing-secret
  if [ ! -s "$secret_file" ]; then
    (umask 077; head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$secret_file")
    echo "generated a webhook signing secret in $secret_file: paste it into Plain's webhook target" >&2
  fi
  THREADGATE_PLAIN_SIGNING_SECRET=$(cat "$secret_file")
  export THREADGATE_PLAIN_SIGNING_SECRET
fi
cargo build --release --bin threadgate
exec target/release/threadgate serve "$@"
