#!/usr/bin/env bash
# Sourced by test.sh and bench.sh: installs what is missing (OpenSSH server and client, Dropbear, PostgreSQL), starts
# a throwaway PostgreSQL cluster under /tmp as an unprivileged user, exports TEST_DATABASE_URL,
# and stops and removes the cluster when the sourcing shell exits.

log() { printf '[%s] %s\n' "$(basename "$0")" "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }

need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
# The SSH tests also run against Dropbear, the server of routers and small images.
[ -x /usr/sbin/dropbear ] || need+=(dropbear-bin)
# `target import` is checked against the OpenSSH client's own reading (`ssh -G`).
[ -x /usr/bin/ssh ] || need+=(openssh-client)
# The deploy tests verify the systemd unit with systemd-analyze.
command -v systemd-analyze >/dev/null || need+=(systemd)
pg_bin=""
for d in $(dirname "$(command -v pg_ctl 2>/dev/null || echo /nonexistent/x)") /usr/lib/postgresql/*/bin; do
  if [ -x "$d/initdb" ] && [ -x "$d/pg_ctl" ]; then pg_bin="$d"; fi
done
[ -n "$pg_bin" ] || need+=(postgresql)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]}"
  as_root apt-get update -qq
  DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq "${need[@]}" >/dev/null
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && pg_bin="$d"; done
fi
[ -n "$pg_bin" ] || { log "no PostgreSQL binaries found"; exit 1; }

pg_work=$(mktemp -d /tmp/sshmode-pg.XXXXXX)
chmod 755 "$pg_work"
pg_user=$(id -un)
run_pg() { "$@"; }
if [ "$(id -u)" = 0 ]; then
  pg_user=postgres
  id -u postgres >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin postgres
  run_pg() { runuser -u postgres -- "$@"; }
fi
pgdata="$pg_work/pg"
mkdir -p "$pgdata"
touch "$pg_work/pg.log"
chown "$pg_user" "$pgdata" "$pg_work/pg.log"
chmod 700 "$pgdata"
pg_cleanup() {
  run_pg "$pg_bin/pg_ctl" -D "$pgdata" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$pg_work"
}
trap pg_cleanup EXIT
pg_port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
run_pg "$pg_bin/initdb" -D "$pgdata" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
run_pg "$pg_bin/pg_ctl" -D "$pgdata" -l "$pg_work/pg.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $pg_port -c unix_socket_directories=$pgdata -c max_connections=400 ${PG_EXTRA_OPTS:-}" \
  start >/dev/null
export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$pg_port/postgres"
export PG_BIN="$pg_bin"
log "PostgreSQL on 127.0.0.1:$pg_port"
