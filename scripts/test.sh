#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs what the tests need (OpenSSH server,
# Dropbear, PostgreSQL if absent), starts a throwaway PostgreSQL as an unprivileged user under /tmp, runs
# `cargo test`, and cleans up. Extra arguments go to `cargo test` (e.g. `bash scripts/test.sh lark`).
set -euo pipefail
cd "$(dirname "$0")/.."

# The SSH tests run a real sshd and create a test user: without root or sshd they FAIL, here
# and so in CI. A developer without them may skip them, loudly, with SSHMODE_TEST_SKIP_SSH=1.
if [ "${SSHMODE_TEST_SKIP_SSH:-}" = 1 ]; then
  printf '\n!!!!! [test.sh] SSHMODE_TEST_SKIP_SSH=1: THE SSH TESTS ARE SKIPPED — never do this in CI !!!!!\n\n' >&2
elif [ "$(id -u)" != 0 ]; then
  printf '[test.sh] the SSH tests need root (useradd, sshd): run as root, or set SSHMODE_TEST_SKIP_SSH=1 to skip them on a developer machine\n' >&2
  exit 1
fi
# Tests do not need durability; benchmarks (scripts/bench.sh) keep the defaults.
PG_EXTRA_OPTS="-c fsync=off" source scripts/pg.sh
if [ "${SSHMODE_TEST_SKIP_SSH:-}" != 1 ] && [ ! -x /usr/sbin/sshd ]; then
  log "/usr/sbin/sshd is missing after installing openssh-server: the SSH tests cannot run"
  exit 1
fi
if [ "${SSHMODE_TEST_SKIP_SSH:-}" != 1 ] && [ ! -x /usr/sbin/dropbear ]; then
  log "/usr/sbin/dropbear is missing after installing dropbear-bin: the Dropbear tests cannot run"
  exit 1
fi

# The MCP tests (tests/api/mcp.rs) drive the endpoint with the official MCP Python SDK, pinned,
# in a virtualenv beside the build (made once, remade when the pin changes); without it they
# fail.
mcp_pin="2.3.0"
mcp_venv="${CARGO_TARGET_DIR:-$PWD/target}/mcp-venv"
if ! "$mcp_venv/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('mcp') != '$mcp_pin')" 2>/dev/null; then
  if ! python3 -c 'import ensurepip, venv' 2>/dev/null; then
    log "installing python3-venv"
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq python3 python3-venv >/dev/null
  fi
  rm -rf "$mcp_venv"
  python3 -m venv "$mcp_venv"
  "$mcp_venv/bin/pip" install --quiet --disable-pip-version-check "mcp==$mcp_pin"
fi
export SSHMODE_TEST_MCP_PYTHON="$mcp_venv/bin/python"

# deploy/ against the Kubernetes and compose-spec schemas and apparmor_parser, offline, with
# pinned validators in a virtualenv beside the build; a missing validator fails the run.
bash scripts/check-deploy.sh

# The previous version, for the rolling-upgrade test (tests/api/upgrade.rs names its commit):
# built once from that commit into a target directory of its own beside the build, and kept
# there (a first build costs the dependencies again, once; later runs reuse it).
previous="$(sed -n 's/^const PREVIOUS: &str = "\([0-9a-f]\{40\}\)";$/\1/p' tests/api/upgrade.rs)"
if [ -z "$previous" ]; then
  log "tests/api/upgrade.rs names no previous version"
  exit 1
fi
previous_dir="${CARGO_TARGET_DIR:-$PWD/target}/previous"
previous_bin="$previous_dir/sshmode-$previous"
if [ ! -x "$previous_bin" ]; then
  log "building the previous version $previous (once)"
  rm -rf "$previous_dir/src"
  mkdir -p "$previous_dir/src"
  git archive "$previous" | tar -x -C "$previous_dir/src"
  (cd "$previous_dir/src" && CARGO_TARGET_DIR="$previous_dir/target" cargo build --locked --bin sshmode)
  cp "$previous_dir/target/debug/sshmode" "$previous_bin.part"
  mv "$previous_bin.part" "$previous_bin"
fi
export SSHMODE_TEST_PREVIOUS_BIN="$previous_bin"

export RUST_BACKTRACE=1
# Benchmarks are compiled (so they cannot rot) but not run here; see BENCHMARKS.md.
cargo test --locked --benches --no-run
cargo test --locked --lib --bins --tests "$@" -- --test-threads="${SSHMODE_TEST_THREADS:-4}"
