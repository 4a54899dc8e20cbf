#!/usr/bin/env bash
# Runs the whole app locally, no AWS account needed: moto's server on 127.0.0.1 runs the real
# state machines (its Step Functions interpreter), cargo lambda's emulator runs our Rust Lambda
# binaries, everything deployed from template.yaml; then 100 executions contend for 5 slots
# while events are dropped, duplicated and delayed, executions are stopped mid-acquire (their
# acquire write held in flight: the seed race) and mid-work. Ends with a report; exit 1 if an
# invariant failed. Installs what it needs (.venv: pinned moto and cargo-lambda).
# Options go to the runner: `bash local/run.sh --help`.
set -euo pipefail
source "$(dirname "$0")/../scripts/local-aws-env.sh"
cd "$ROOT"
ensure_venv
ensure_emulator
cargo build --quiet --locked -p local-run
exec "${CARGO_TARGET_DIR:-$ROOT/target}/debug/local-run" --root "$ROOT" "$@"
