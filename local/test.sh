#!/usr/bin/env bash
# CI check of the local run: a short chaos run of the real app that must keep every invariant,
# and the same chaos against the original sample's protocol (sample mode), which must leak.
# Installs what it needs, like local/run.sh. Extra arguments go to `cargo test`.
set -euo pipefail
source "$(dirname "$0")/../scripts/local-aws-env.sh"
cd "$ROOT"
ensure_venv
ensure_emulator
cargo test --locked -p local-run --test local_run -- --ignored --test-threads=1 --nocapture "$@"
