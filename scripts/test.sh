#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs what the tests need (OpenSSH server),
# starts a throwaway PostgreSQL as an unprivileged user under /tmp, runs `cargo test`, and
# cleans up. Extra arguments go to `cargo test` (e.g. `bash scripts/test.sh lark`).
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '[test.sh] %s\n' "$*" >&2; }
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi; }

# --- packages -------------------------------------------------------------------------------
need=()
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
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

# --- throwaway PostgreSQL --------------------------------------------------------------------
work=$(mktemp -d /tmp/sshmode-test.XXXXXX)
chmod 755 "$work"
pg_user=$(id -un)
run_pg() { "$@"; }
if [ "$(id -u)" = 0 ]; then
  pg_user=postgres
  id -u postgres >/dev/null 2>&1 || useradd --system --no-create-home --shell /usr/sbin/nologin postgres
  run_pg() { runuser -u postgres -- "$@"; }
fi
pgdata="$work/pg"
mkdir -p "$pgdata" && touch "$work/pg.log" && chown "$pg_user" "$pgdata" "$work/pg.log" && chmod 700 "$pgdata"
cleanup() {
  run_pg "$pg_bin/pg_ctl" -D "$pgdata" -m immediate stop >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT
port=$(python3 -c 'import socket;s=socket.socket();s.bind(("127.0.0.1",0));print(s.getsockname()[1])')
run_pg "$pg_bin/initdb" -D "$pgdata" -U postgres --auth=trust -E UTF8 --locale=C >/dev/null
run_pg "$pg_bin/pg_ctl" -D "$pgdata" -l "$work/pg.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$pgdata -c max_connections=400 -c fsync=off -c shared_buffers=128MB" \
  start >/dev/null
export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$port/postgres"
log "PostgreSQL on 127.0.0.1:$port"

# --- tests ----------------------------------------------------------------------------------
export RUST_BACKTRACE=1
# Benchmarks are compiled (so they cannot rot) but not run here; see BENCHMARKS.md.
cargo test --locked --benches --no-run
cargo test --locked --lib --bins --tests "$@" -- --test-threads="${SSHMODE_TEST_THREADS:-4}"
