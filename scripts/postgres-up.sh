#!/usr/bin/env bash
# Make sure a PostgreSQL server for threadgate answers on this machine, and print its URL.
#
# Installs Debian's `postgresql` where its binaries are missing (apt-get update first),
# `initdb`s a cluster into a directory of its own (never the system's cluster), starts it
# listening on 127.0.0.1 only, creates the role and database `threadgate`, and prints
#   postgres://threadgate:threadgate@127.0.0.1:PORT/threadgate
# on stdout (everything else goes to stderr). Idempotent, like scripts/docker-up.sh: a
# cluster that runs already is left running and its URL printed again.
#
# The server runs as the `postgres` user (PostgreSQL refuses to run as root). It is a
# test and development database: trust on the local socket, a fixed password on TCP.
#
# Environment:
#   THREADGATE_PG_DIR   the cluster's directory (default /var/lib/threadgate-postgres)
#   THREADGATE_PG_PORT  its TCP port on 127.0.0.1 (default 55432)
#   PG_UP_TIMEOUT       seconds to wait for the server (default 60)
set -euo pipefail

dir="${THREADGATE_PG_DIR:-/var/lib/threadgate-postgres}"
port="${THREADGATE_PG_PORT:-55432}"
timeout="${PG_UP_TIMEOUT:-60}"
data="$dir/data"
log="$dir/server.log"
url="postgres://threadgate:threadgate@127.0.0.1:$port/threadgate"

say() { echo "postgres-up: $*" >&2; }

bindir() {
    local found
    found="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
    [ -n "$found" ] && [ -x "$found/initdb" ] && echo "$found"
}

if [ "$(id -u)" -ne 0 ]; then
    say "this script installs packages and runs the server as the postgres user: run it as root"
    exit 1
fi

bin="$(bindir || true)"
if [ -z "$bin" ]; then
    say "installing postgresql with apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q --no-install-recommends postgresql >&2
    bin="$(bindir)"
fi
as_pg() { runuser -u postgres -- "$@"; }
answers() { as_pg "$bin/pg_isready" -q -h "$dir" -p "$port" >/dev/null 2>&1; }

mkdir -p "$dir"
chown postgres:postgres "$dir"
chmod 0700 "$dir"

if [ ! -f "$data/PG_VERSION" ]; then
    say "initdb into $data"
    as_pg "$bin/initdb" -D "$data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
        -E UTF8 --locale=C.UTF-8 >&2
fi

if answers; then
    say "server already answers on 127.0.0.1:$port"
else
    # A server that died leaves its pid file; pg_ctl checks it and starts anew.
    say "starting the server on 127.0.0.1:$port (log: $log)"
    as_pg "$bin/pg_ctl" -D "$data" -l "$log" -w -t "$timeout" \
        -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c max_connections=200 -c fsync=on" \
        start >&2 || {
        say "server did not start; last lines of $log:"
        tail -n 30 "$log" >&2 || true
        exit 1
    }
fi

deadline=$((SECONDS + timeout))
until answers; do
    if [ "$SECONDS" -ge "$deadline" ]; then
        say "server did not answer within ${timeout}s; last lines of $log:"
        tail -n 30 "$log" >&2 || true
        exit 1
    fi
    sleep 0.3
done

sql() { as_pg psql -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres "$@"; }
if [ "$(sql -tAc "SELECT 1 FROM pg_roles WHERE rolname = 'threadgate'")" != "1" ]; then
    say "creating role threadgate"
    sql -c "CREATE ROLE threadgate LOGIN PASSWORD 'threadgate' CREATEDB"
fi
if [ "$(sql -tAc "SELECT 1 FROM pg_database WHERE datname = 'threadgate'")" != "1" ]; then
    say "creating database threadgate"
    sql -c "CREATE DATABASE threadgate OWNER threadgate"
fi
say "ready: $("$bin/postgres" --version)"
echo "$url"
