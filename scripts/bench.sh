#!/usr/bin/env bash
# Runs one benchmark (or all) in release mode against a throwaway PostgreSQL with default
# durability settings: `bash scripts/bench.sh [lark_ingress|exec|router|claim|agent|receipt|mcp|…]`. Figures go to
# BENCHMARKS.md by hand, with this command.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pg.sh
if [ $# -gt 0 ]; then
  cargo bench --locked --bench "$1" -- "${@:2}"
else
  cargo bench --locked
fi
