#!/usr/bin/env bash
# Runs threadgate's main job on this machine with its embedded defaults: SQLite state in
# ./data, sessions in local Docker containers, branches in this repository (or
# THREADGATE_REPO). Installs and starts Docker and builds the sandbox image if needed.
#
# The model: when the config's [model] uses the scripted model server (the default, no
# [model] table or provider = "scripted"), it is NOT a real model: this script starts
# `threadgate scripted-model` on 127.0.0.1:8090 (unless something already answers there)
# and stops it on exit. For a real model see README, "Real credentials".
#
# Usage: scripts/run.sh [--config FILE] [serve options]   (default config: ./threadgate.toml)
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

config=threadgate.toml
args=("$@")
for i in "${!args[@]}"; do
  if [ "${args[$i]}" = "--config" ]; then config="${args[$((i + 1))]:-}"; fi
done

# The provider of [model] in $config ("scripted" when the file or the key is absent).
model_provider() {
  [ -f "$config" ] || { echo scripted; return; }
  awk '
    /^[[:space:]]*\[/ { in_model = ($0 ~ /^[[:space:]]*\[model\][[:space:]]*(#.*)?$/) }
    in_model && /^[[:space:]]*provider[[:space:]]*=/ {
      sub(/^[^=]*=[[:space:]]*"/, ""); sub(/".*/, ""); print; found = 1; exit
    }
    END { if (!found) print "scripted" }
  ' "$config"
}

cargo build --release --bin threadgate
bin=${CARGO_TARGET_DIR:-target}/release/threadgate

if [ "$(model_provider)" = scripted ]; then
  if curl -sf -o /dev/null http://127.0.0.1:8090/healthz; then
    echo "run.sh: [model] uses the scripted model (NOT a real model); one already answers on 127.0.0.1:8090" >&2
  else
    echo "run.sh: [model] uses the scripted model (NOT a real model): starting it on 127.0.0.1:8090;" >&2
    echo "run.sh: for a real model set [model] and the agent's model: line (README, \"Real credentials\")" >&2
    "$bin" scripted-model --listen 127.0.0.1:8090 &
    scripted_pid=$!
    trap 'kill "$scripted_pid" 2>/dev/null || true' EXIT
  fi
fi
"$bin" serve "$@"
