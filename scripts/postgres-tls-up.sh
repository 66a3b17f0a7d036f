#!/usr/bin/env bash
# Start a throwaway PostgreSQL cluster with TLS on (ssl=on, beside plain connections)
# for the TLS tests (tests/it/pg_tls.rs), apart from the shared cluster of
# scripts/postgres-up.sh, and print its URL (no sslmode: the test adds it).
#
#   scripts/postgres-tls-up.sh DIR PORT CERT_PEM KEY_PEM     start, print the URL
#   scripts/postgres-tls-up.sh --stop DIR                     stop it (immediate)
#
# DIR is made and given to the postgres user; the certificate and key are copied into it
# (PostgreSQL wants its key readable by itself only). Runs as root, like postgres-up.sh;
# the server runs as postgres, listening on 127.0.0.1 only.
set -euo pipefail

say() { echo "postgres-tls-up: $*" >&2; }
bin="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)"
if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    say "no PostgreSQL binaries: run scripts/postgres-up.sh first"
    exit 2
fi
as_pg() { runuser -u postgres -- "$@"; }

if [ "${1:-}" = "--stop" ]; then
    as_pg "$bin/pg_ctl" -D "$2/data" -m immediate stop >&2 || true
    exit 0
fi

dir="$1" port="$2" cert="$3" key="$4"
mkdir -p "$dir"
chmod 0755 "$(dirname "$dir")"
cp "$cert" "$dir/server.crt"
cp "$key" "$dir/server.key"
chown -R postgres:postgres "$dir"
chmod 0700 "$dir"
chmod 0600 "$dir/server.key"
as_pg "$bin/initdb" -D "$dir/data" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
    -E UTF8 --locale=C.UTF-8 >/dev/null
as_pg "$bin/pg_ctl" -D "$dir/data" -l "$dir/server.log" -w -t 60 \
    -o "-c listen_addresses=127.0.0.1 -p $port -k $dir -c ssl=on -c ssl_cert_file=$dir/server.crt -c ssl_key_file=$dir/server.key -c fsync=off" \
    start >&2 || {
    say "server did not start; last lines of its log:"
    tail -n 30 "$dir/server.log" >&2 || true
    exit 1
}
as_pg psql -X -q -v ON_ERROR_STOP=1 -h "$dir" -p "$port" -U postgres \
    -c "CREATE ROLE threadgate LOGIN PASSWORD 'fake_key_tls_pw' CREATEDB" \
    -c "CREATE DATABASE threadgate OWNER threadgate" >&2
echo "postgres://threadgate:fake_key_tls_pw@127.0.0.1:$port/threadgate"
