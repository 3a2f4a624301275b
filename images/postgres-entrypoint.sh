#!/bin/sh
# Start PostgreSQL from $PGDATA, first making the cluster if the folder is empty: superuser
# $POSTGRES_USER with $POSTGRES_PASSWORD (SCRAM), database $POSTGRES_DB, password logins from any
# address. The password goes to initdb through a 0600 file in /dev/shm (memory), removed at once;
# it is never logged and never stored in the image.
set -eu
PGDATA=${PGDATA:-/var/lib/postgresql/data}
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
as_postgres() { setpriv --reuid postgres --regid postgres --init-groups "$@"; }

install -d -o postgres -g postgres -m 0700 "$PGDATA"
install -d -o postgres -g postgres -m 0775 /run/postgresql

if [ ! -s "$PGDATA/PG_VERSION" ]; then
  if [ -z "${POSTGRES_PASSWORD:-}" ]; then
    echo "postgres: POSTGRES_PASSWORD is empty: refusing to make a cluster without a password" >&2
    exit 1
  fi
  echo "postgres: making the cluster in $PGDATA (user $POSTGRES_USER, database $POSTGRES_DB)" >&2
  pwfile=$(mktemp /dev/shm/pw.XXXXXX)
  trap 'rm -f "$pwfile"' EXIT
  printf '%s\n' "$POSTGRES_PASSWORD" >"$pwfile"
  chown postgres "$pwfile"
  as_postgres "$bin/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile="$pwfile" \
    --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8 >/dev/null
  rm -f "$pwfile"
  echo "host all all all scram-sha-256" >>"$PGDATA/pg_hba.conf"
  # A private socket folder while the database is made, so pg_isready stays false until the end.
  init_sock=$(mktemp -d /tmp/pg-init.XXXXXX)
  chown postgres "$init_sock"
  as_postgres "$bin/pg_ctl" -D "$PGDATA" -w -s -o "-c listen_addresses='' -k $init_sock" start
  if [ "$POSTGRES_DB" != postgres ]; then
    as_postgres "$bin/createdb" -h "$init_sock" -U "$POSTGRES_USER" "$POSTGRES_DB"
  fi
  as_postgres "$bin/pg_ctl" -D "$PGDATA" -w -s -m fast stop
  rmdir "$init_sock"
fi

exec setpriv --reuid postgres --regid postgres --init-groups \
  "$bin/postgres" -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/run/postgresql "$@"
