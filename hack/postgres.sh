#!/usr/bin/env bash
# hack/postgres.sh — a real, throwaway PostgreSQL (Debian's postgresql-15) for baton's tests of
# the PostgreSQL ledger. One cluster per state dir, owned by the `postgres` OS user (initdb and
# postgres refuse to run as root), listening on a Unix socket in the state dir and on one
# address (127.0.0.1 by default; the real node's scripts give it the node's address, which its
# pods reach).
#
#   hack/postgres.sh up        initdb (once per state dir), start, wait until it accepts
#   hack/postgres.sh down      stop the server `up` started (pg_ctl, by its data dir's
#                              postmaster.pid), remove the state dir
#   hack/postgres.sh status    exit 0 when it is up and accepts connections
#   hack/postgres.sh env       print `export BATON_TEST_POSTGRES_URL=...` (the `baton` role,
#                              which owns the `baton` database and is no superuser)
#   hack/postgres.sh crash     stop it the way a crash does (pg_ctl -m immediate)
#   hack/postgres.sh start     start it again after `crash` (same data, same port)
#
# Environment:
#   BATON_PG_DIR      state dir (data, socket, log, password), default ${TMPDIR:-/tmp}/baton-postgres
#   BATON_PG_PORT     TCP port (default 5432; a busy default is replaced by a free port)
#   BATON_PG_LISTEN   address to listen on besides the socket (default 127.0.0.1)
#   BATON_PG_TLS_CERT, BATON_PG_TLS_KEY
#                     at `up`: a server certificate and its key (PEM). TCP connections must
#                     then use TLS (`hostssl` only), and `env` adds `sslmode=require`.
set -euo pipefail

CACHE_DIR=${BATON_CACHE_DIR:-${HOME:?HOME is not set}/.cache/baton}
PG_DIR=${BATON_PG_DIR:-${TMPDIR:-/tmp}/baton-postgres}
LISTEN=${BATON_PG_LISTEN:-127.0.0.1}
readonly MARKER=.baton-postgres
LOG_TAG=postgres
STATE_DIR=$PG_DIR
# shellcheck source=hack/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

pg_bin() { # the directory of Debian's newest installed PostgreSQL server binaries
  local dir
  dir=$(find /usr/lib/postgresql -mindepth 2 -maxdepth 2 -name bin -type d 2>/dev/null | sort -V | tail -1)
  [[ -n $dir && -x $dir/pg_ctl ]] || die "no PostgreSQL server binaries under /usr/lib/postgresql (hack/setup.sh installs postgresql)"
  echo "$dir"
}

as_postgres() { runuser -u postgres -- "$@"; }

accepts() { # the server answers on its socket
  local port
  port=$(read_state PORT) || return 1
  as_postgres "$(pg_bin)/pg_isready" -q -h "$PG_DIR" -p "$port" -d postgres
}

start_server() {
  local port bin
  port=$(read_state PORT)
  bin=$(pg_bin)
  as_postgres "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/postgres.log" -w -t 60 \
    -o "-c listen_addresses='$LISTEN' -p $port -k $PG_DIR" start >/dev/null
  log "started PostgreSQL (pid $(head -1 "$PG_DIR/data/postmaster.pid"), $LISTEN:$port, log $PG_DIR/postgres.log)"
}

stop_server() { # stop_server MODE — only the server of this data dir, by its postmaster.pid
  [[ -f $PG_DIR/data/postmaster.pid ]] || return 0
  as_postgres "$(pg_bin)/pg_ctl" -D "$PG_DIR/data" -m "$1" -w -t 60 stop >/dev/null || true
  log "stopped PostgreSQL ($1)"
}

cmd_up() {
  if accepts 2>/dev/null; then
    log "already up ($PG_DIR)"
    return 0
  fi
  if [[ -e $PG_DIR ]]; then
    [[ -f $PG_DIR/$MARKER ]] || die "$PG_DIR exists and is not ours; remove it or set BATON_PG_DIR"
    stop_server immediate
    rm -rf "$PG_DIR"
  fi
  local bin port password
  bin=$(pg_bin)
  mkdir -p "$PG_DIR"
  touch "$PG_DIR/$MARKER"
  port=$(choose_port "${BATON_PG_PORT:-}" 5432 postgres)
  password=$(head -c 18 /dev/urandom | base64 | tr '+/' '-_')
  printf 'PORT=%s\nLISTEN=%s\n' "$port" "$LISTEN" >"$PG_DIR/state"
  printf '%s\n' "$password" >"$PG_DIR/password"
  chmod 600 "$PG_DIR/password"
  chown postgres "$PG_DIR"
  # Peer auth on the socket (only the postgres OS user, for this script), passwords over TCP.
  as_postgres "$bin/initdb" -D "$PG_DIR/data" -U postgres --auth-local=peer \
    --auth-host=scram-sha-256 -E UTF8 --locale=C.UTF-8 >"$PG_DIR/initdb.log" 2>&1 ||
    { tail -20 "$PG_DIR/initdb.log" >&2; die "initdb failed"; }
  # initdb lets TCP clients in from loopback only; on another address (the node's) they come
  # from elsewhere (its pods).
  if [[ $LISTEN != 127.0.0.1 ]]; then
    echo "host all all 0.0.0.0/0 scram-sha-256" >>"$PG_DIR/data/pg_hba.conf"
  fi
  [[ -n ${BATON_PG_TLS_CERT:-} ]] && tls_only
  start_server
  # The role baton connects as: it owns its database (baton migrates the schema itself) and is
  # no superuser, so row-level security applies to it. CREATEDB: a test migrates a fresh one.
  as_postgres "$bin/psql" -q -h "$PG_DIR" -p "$port" -d postgres -v ON_ERROR_STOP=1 <<SQL
CREATE ROLE baton LOGIN NOSUPERUSER NOBYPASSRLS CREATEDB PASSWORD '$password';
CREATE DATABASE baton OWNER baton;
SQL
  log "PostgreSQL up: database baton, role baton, $LISTEN:$port"
}

tls_only() { # TLS on, with the given certificate; TCP clients without TLS refused
  [[ -n ${BATON_PG_TLS_KEY:-} ]] || die "BATON_PG_TLS_CERT needs BATON_PG_TLS_KEY"
  install -o postgres -m 644 "$BATON_PG_TLS_CERT" "$PG_DIR/data/server.crt"
  install -o postgres -m 600 "$BATON_PG_TLS_KEY" "$PG_DIR/data/server.key"
  printf "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n" \
    >>"$PG_DIR/data/postgresql.conf"
  sed -i 's/^host /hostssl /' "$PG_DIR/data/pg_hba.conf"
  printf 'TLS=1\n' >>"$PG_DIR/state"
}

cmd_down() {
  [[ -e $PG_DIR ]] || { log "not up"; return 0; }
  [[ -f $PG_DIR/$MARKER ]] || die "$PG_DIR is not ours; not touching it"
  stop_server fast
  rm -rf "$PG_DIR"
  log "PostgreSQL down; removed $PG_DIR"
}

cmd_env() {
  local port password
  port=$(read_state PORT) || die "not up (no $PG_DIR/state)"
  password=$(<"$PG_DIR/password")
  local query=""
  [[ $(read_state TLS 2>/dev/null) == 1 ]] && query="?sslmode=require"
  echo "export BATON_TEST_POSTGRES_URL=postgres://baton:$password@$LISTEN:$port/baton$query"
}

main() {
  case ${1:-help} in
    up) cmd_up ;;
    down) cmd_down ;;
    status) accepts ;;
    env) cmd_env ;;
    crash) stop_server immediate ;;
    start) start_server ;;
    *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; [[ ${1:-help} == help ]] ;;
  esac
}

main "$@"
