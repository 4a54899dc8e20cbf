#!/usr/bin/env bash
# Runs the benchmarks on a fresh machine: installs the local server (pinned moto in .venv),
# builds the bench and the four Lambda handlers natively, and runs `bench`, which starts the
# local server on 127.0.0.1 (harness/local-aws), writes every number to a JSON file and prints
# the tables that BENCHMARKS.md quotes. Extra arguments go to `bench` (see `bench --help`).
#
#   bash bench/run.sh --out BENCHMARKS-results.json   # full run, release build: ~10 minutes
#   bash bench/run.sh --smoke --out target/bench-smoke.json
#       # CI: a dev build (what the tests already built), well under a minute of running; it
#       # checks that every part runs and its numbers are sane, not how fast anything is.
#   bash bench/run.sh charts    # redraw bench/charts/*.svg from BENCHMARKS-results.json, no run
#
# A run draws the headline tables' charts from the file it wrote: a full run into bench/charts
# (what BENCHMARKS.md shows), a smoke run into target/bench-smoke-charts; `--charts DIR` says
# where instead.
set -euo pipefail
source "$(dirname "$0")/../scripts/local-aws-env.sh"
cd "$ROOT"
if [ "${1:-}" = charts ]; then
  # Drawing needs no server and no speed: the dev build the tests already made.
  exec cargo run --locked -q -p semaphore-bench --bin bench -- "$@"
fi
ensure_venv
profile=release
charts=bench/charts
for arg in "$@"; do
  [ "$arg" = "--smoke" ] && profile=debug && charts=target/bench-smoke-charts
  case "$arg" in --charts | --charts=*) charts= ;; esac
done
[ -n "$charts" ] && set -- "$@" --charts "$charts"
flags=(--locked -p semaphore-bench -p lambda-acquire -p lambda-release -p lambda-cleanup -p lambda-sweeper)
[ "$profile" = release ] && flags+=(--release)
# The bench finds the handler binaries next to itself, in the same target/<profile>.
cargo build "${flags[@]}"
"${CARGO_TARGET_DIR:-$ROOT/target}/$profile/bench" "$@"
