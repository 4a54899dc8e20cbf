#!/usr/bin/env bash
# Runs every test on a fresh machine: installs the local server, starts it on 127.0.0.1, runs
# the whole workspace's tests against it, stops it. Extra arguments go to `cargo test`.
set -euo pipefail
source "$(dirname "$0")/../scripts/local-aws-env.sh"
cd "$ROOT"
ensure_venv
start_local_aws
export SEMAPHORE_TEST_ENDPOINT="$LOCAL_AWS_ENDPOINT"
# With no arguments, the whole workspace; otherwise exactly what was asked (e.g. -p semctl).
[ $# -gt 0 ] || set -- --workspace
cargo test --locked "$@"
