#!/usr/bin/env bash
# Memory under a sign-in flood (issue 17 item 4): starts `threadgate serve` on loopback
# with one reviewer whose password is set, fires BURSTS bursts of SIZE concurrent
# sign-ins (POST /login with the right password, each on its own connection, released
# together), and prints VmRSS and VmHWM of the server after each burst, with the load
# average. Every request goes to 127.0.0.1 only; the server is stopped at the end.
#
# Usage: scripts/signin_rss.sh [BINARY] [BURSTS] [SIZE]
#   BINARY defaults to target/release/threadgate (built if missing), BURSTS to 5,
#   SIZE to 300.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${1:-target/release/threadgate}
bursts=${2:-5}
size=${3:-300}
if [ ! -x "$bin" ]; then cargo build --release --bin threadgate; fi
bin=$(realpath "$bin")

work=$(mktemp -d)
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$work/threadgate.toml" <<TOML
data_dir = "$work/data"
listen = "127.0.0.1:$port"
public_url = "http://127.0.0.1:$port"
policy_file = "$PWD/policies/support.yaml"
agents_dir = "$PWD/agents"
skills_dir = "$PWD/skills"

[server]
# The flood comes from one address: the per-address connection share is not measured.
max_connections_per_address = 0
TOML
export THREADGATE_PLAIN_SIGNING_SECRET=signin-rss-plain-secret-0123456789
export THREADGATE_MASTER_KEY
THREADGATE_MASTER_KEY=$(head -c 32 /dev/urandom | base64)
cfg=(--config "$work/threadgate.toml")
mkdir -p "$work/data"
"$bin" reviewers "${cfg[@]}" add alice > /dev/null
printf 'correct horse battery staple\n' | "$bin" reviewers "${cfg[@]}" passwd alice > /dev/null

"$bin" serve "${cfg[@]}" > "$work/serve.log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 100); do
  curl -sf -o /dev/null "http://127.0.0.1:$port/healthz" && break
  sleep 0.2
done

mem() { awk '/^VmRSS|^VmHWM/ { printf "%s %d MiB  ", $1, $2 / 1024 }' "/proc/$pid/status"; }
echo "binary $bin; bursts of $size sign-ins"
echo "before: $(mem) load $(cut -d' ' -f1-3 /proc/loadavg)"
for burst in $(seq "$bursts"); do
  statuses=$(python3 - "$port" "$size" <<'PY'
import collections, http.client, sys, threading
port, size = int(sys.argv[1]), int(sys.argv[2])
barrier = threading.Barrier(size)
statuses = collections.Counter()
lock = threading.Lock()
body = "csrf=t0k3n&next=%2F&name=alice&password=correct+horse+battery+staple"
def sign_in():
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    conn.connect()
    barrier.wait()
    try:
        conn.request("POST", "/login", body, {
            "Content-Type": "application/x-www-form-urlencoded",
            "Cookie": "tg_login=t0k3n",
        })
        status = conn.getresponse().status
    except OSError as e:
        status = type(e).__name__
    with lock:
        statuses[status] += 1
threads = [threading.Thread(target=sign_in) for _ in range(size)]
for t in threads: t.start()
for t in threads: t.join()
print(dict(sorted(statuses.items(), key=str)))
PY
)
  echo "burst $burst: $(mem) load $(cut -d' ' -f1-3 /proc/loadavg) answers $statuses"
done
