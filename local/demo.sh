#!/usr/bin/env bash
# Runs the semaphore locally, no AWS account needed: starts the local DynamoDB-compatible
# server on 127.0.0.1, then walks through the protocol with `semctl`: two executions fill a
# limit-2 lock, a third finds it full, one execution ends and is cleaned up, its zombie acquire
# is refused, and the waiting execution gets the freed slot.
set -euo pipefail
source "$(dirname "$0")/../scripts/local-aws-env.sh"
cd "$ROOT"
ensure_venv
cargo build --quiet --locked -p semctl
start_local_aws
export TABLE_NAME=demo-semaphores

run() {
  local code=0
  printf '\n$ semctl %s\n' "$*"
  target/debug/semctl --endpoint-url "$LOCAL_AWS_ENDPOINT" "$@" || code=$?
  printf '(exit %s)\n' "$code"
}

run init
run acquire --lock demo-lock --limit 2 --holder exec-1
run acquire --lock demo-lock --limit 2 --holder exec-2
run acquire --lock demo-lock --limit 2 --holder exec-3
echo "# exec-1 ends without releasing (FAILED); cleanup-from-incomplete frees and fences it:"
run cleanup --lock demo-lock --holder exec-1
echo "# exec-1's zombie Lambda retries its acquire after the cleanup: refused (exit 3)"
run acquire --lock demo-lock --limit 2 --holder exec-1
echo "# exec-3 retries and gets the freed slot"
run acquire --lock demo-lock --limit 2 --holder exec-3
run release --lock demo-lock --holder exec-2
run release --lock demo-lock --holder exec-2
run status --lock demo-lock
