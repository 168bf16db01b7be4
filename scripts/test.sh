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

export RUST_BACKTRACE=1
# Benchmarks are compiled (so they cannot rot) but not run here; see BENCHMARKS.md.
cargo test --locked --benches --no-run
cargo test --locked --lib --bins --tests "$@" -- --test-threads="${SSHMODE_TEST_THREADS:-4}"
