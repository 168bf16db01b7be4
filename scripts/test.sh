#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine: installs what the tests need (OpenSSH server,
# PostgreSQL if absent), starts a throwaway PostgreSQL as an unprivileged user under /tmp, runs
# `cargo test`, and cleans up. Extra arguments go to `cargo test` (e.g. `bash scripts/test.sh lark`).
set -euo pipefail
cd "$(dirname "$0")/.."
# Tests do not need durability; benchmarks (scripts/bench.sh) keep the defaults.
PG_EXTRA_OPTS="-c fsync=off" source scripts/pg.sh

export RUST_BACKTRACE=1
# Benchmarks are compiled (so they cannot rot) but not run here; see BENCHMARKS.md.
cargo test --locked --benches --no-run
cargo test --locked --lib --bins --tests "$@" -- --test-threads="${SSHMODE_TEST_THREADS:-4}"
