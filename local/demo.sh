#!/usr/bin/env bash
# Runs the semaphore locally, no AWS account needed: starts the local DynamoDB-compatible
# server on 127.0.0.1, then walks through the protocol with `semctl`: two executions fill a
# limit-2 lock, a third finds it full, one execution ends and is cleaned up, its zombie acquire
# is refused, the waiting execution gets the freed slot, a released acquisition cannot take a
# slot again (a new one can), and the status shows the holders and the fences.
# Exit codes: 0 acquired / released / done, 2 full, 3 fenced, 4 expired (ask again), 1 error.
set -euo pipefail
source "$(dirname "$0")/../scripts/local-aws-env.sh"
cd "$ROOT"
ensure_venv
cargo build --quiet --locked -p semctl
start_local_aws
export TABLE_NAME=demo-semaphores
# The template's defaults: an acquire may land up to 8 s after it was requested, clocks may be
# 2 s apart, so fences are kept at least 10 s (the fence window).
export ACQUIRE_HORIZON_SECONDS=8 CLOCK_SKEW_SECONDS=2

run() {
  local code=0
  printf '\n$ semctl %s\n' "$*"
  target/debug/semctl --endpoint-url "$LOCAL_AWS_ENDPOINT" "$@" || code=$?
  printf '(exit %s)\n' "$code"
}

run init
run acquire --lock demo-lock --limit 2 --holder exec-1
run acquire --lock demo-lock --limit 2 --holder exec-2
echo "# the lock is full: exec-3 waits (exit 2)"
run acquire --lock demo-lock --limit 2 --holder exec-3
echo "# exec-1 ends without releasing (FAILED); cleanup-from-incomplete fences it, then frees its slot:"
run cleanup --lock demo-lock --holder exec-1
echo "# exec-1's zombie Lambda retries its acquire after the cleanup: refused by the fence (exit 3)"
run acquire --lock demo-lock --limit 2 --holder exec-1
echo "# exec-3 retries and gets the freed slot"
run acquire --lock demo-lock --limit 2 --holder exec-3
echo "# exec-2 releases (twice: the second is a no-op), which fences its acquisition..."
run release --lock demo-lock --holder exec-2
run release --lock demo-lock --holder exec-2
echo "# ...so a late retry of that same acquisition is refused (exit 3); a new acquisition is not"
run acquire --lock demo-lock --limit 2 --holder exec-2
run acquire --lock demo-lock --limit 2 --holder exec-2 --acquisition second
echo "# holders, fences (young and old generations, rotated at most once per fence window), item size"
run status --lock demo-lock
