#!/usr/bin/env bash
# Runs every test on a fresh machine: installs the local server, starts it on 127.0.0.1, runs
# the whole workspace's tests against it, stops it. Extra arguments go to `cargo test`.
set -euo pipefail
source "$(dirname "$0")/../scripts/local-aws-env.sh"
cd "$ROOT"
ensure_venv
# With no arguments, the whole workspace; otherwise exactly what was asked (e.g. -p semctl).
[ $# -gt 0 ] || set -- --workspace
# Build first: a build of the whole workspace's tests makes the local-aws binary too (the kit's
# own test runs it), with the tests' features, so starting the server builds nothing more.
cargo test --locked --no-run "$@"
start_local_aws
export SEMAPHORE_TEST_ENDPOINT="$LOCAL_AWS_ENDPOINT"
cargo test --locked "$@"
