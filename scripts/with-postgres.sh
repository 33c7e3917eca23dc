#!/usr/bin/env bash
# Run a command with a throwaway PostgreSQL 15 server on a loopback port.
# Exports RUNIFOLD_TEST_POSTGRES (a DSN) to the command; stops the server after.
# If RUNIFOLD_TEST_POSTGRES is already set, the command runs against that server.
set -euo pipefail

if [ -n "${RUNIFOLD_TEST_POSTGRES:-}" ]; then
  exec "$@"
fi

PGBIN=""
for dir in /usr/lib/postgresql/15/bin /usr/lib/postgresql/*/bin; do
  if [ -x "$dir/initdb" ]; then PGBIN="$dir"; break; fi
done
if [ -z "$PGBIN" ]; then
  PGBIN="$(dirname "$(command -v initdb || echo /nonexistent/initdb)")"
fi
if [ ! -x "$PGBIN/initdb" ]; then
  echo "with-postgres: initdb not found; install PostgreSQL 15 (apt-get install postgresql-15)" >&2
  exit 1
fi

# The server refuses to run as root: run it as the postgres user when we are root.
AS=()
if [ "$(id -u)" = "0" ]; then
  id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
  AS=(runuser -u postgres --)
fi

DATA="$(mktemp -d /tmp/runifold-pg.XXXXXX)"
chmod 755 "$DATA"
[ "$(id -u)" = "0" ] && chown postgres "$DATA"
PORT="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"

cleanup() {
  "${AS[@]}" "$PGBIN/pg_ctl" -D "$DATA/db" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$DATA"
}
trap cleanup EXIT

"${AS[@]}" "$PGBIN/initdb" -D "$DATA/db" -U postgres -A trust --no-sync >/dev/null
"${AS[@]}" "$PGBIN/pg_ctl" -D "$DATA/db" -l "$DATA/server.log" -w -t 60 \
  -o "-h 127.0.0.1 -p $PORT -k $DATA -c fsync=on -c max_connections=200" start >/dev/null
"${AS[@]}" "$PGBIN/psql" -h 127.0.0.1 -p "$PORT" -U postgres -qc "CREATE DATABASE runifold_test" >/dev/null 2>&1 \
  || "$PGBIN/createdb" -h 127.0.0.1 -p "$PORT" -U postgres runifold_test

export RUNIFOLD_TEST_POSTGRES="postgresql://postgres@127.0.0.1:$PORT/runifold_test"
echo "with-postgres: PostgreSQL $("$PGBIN/postgres" --version | awk '{print $3}') on 127.0.0.1:$PORT"
"$@"
