#!/usr/bin/env bash
# The peak memory of threadgate while one session sends N padded model calls at once
# (N=31 by default: a session socket's 32 connections less one), with the load average.
#
#   scripts/model-memory.sh [N]
#
# Runs the ignored test `memory::peak_memory_of_one_session_sending_padded_calls_at_once`
# of tests/it/model_proxy.rs: threadgate in the test process, the scripted upstream as a
# child process, each call a body just under [model] max_request_bytes padded with a
# tool schema of zeros. It prints VmRSS before, VmHWM during (reset just before the
# calls) and VmRSS after, the answers by status and the load average.
# Needs .venv-peers (scripts/localstripe.sh setup).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
MODEL_MEMORY_CALLS="${1:-31}" cargo test --test it model_proxy::memory -- --ignored --nocapture \
  --exact model_proxy::memory::peak_memory_of_one_session_sending_padded_calls_at_once 2>&1 |
  grep -E '^model-memory:|test result' 
