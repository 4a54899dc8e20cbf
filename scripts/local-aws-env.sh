# Sourced by the scripts that need the local AWS: makes .venv (pinned moto from
# local/requirements.txt) if it is missing or out of date, and defines the start helper.
# Everything listens on 127.0.0.1 only; the credentials are dummies that reach nothing.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing AWS_DEFAULT_REGION=us-east-1 AWS_REGION=us-east-1

ensure_venv() {
  local stamp="$VENV/.requirements"
  if [ ! -x "$VENV/bin/python" ] || ! cmp -s "$ROOT/local/requirements.txt" "$stamp"; then
    echo "setting up $VENV (moto server, pinned in local/requirements.txt)" >&2
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$ROOT/local/requirements.txt"
    cp "$ROOT/local/requirements.txt" "$stamp"
  fi
}

# start_local_aws: starts the local AWS the one way the tests, the bench and the local run do too
# (harness/local-aws: local/moto_server.py on a free port of 127.0.0.1, waited for until it
# listens), exports LOCAL_AWS_ENDPOINT; the server stops when the calling shell is gone. The
# binary is built only if missing or older than the kit's sources: a workspace test build makes
# it with the tests' features, and `cargo build -p local-aws` would build the SDK again with its
# own.
start_local_aws() {
  local bin="${CARGO_TARGET_DIR:-$ROOT/target}/debug/local-aws"
  if [ ! -x "$bin" ] || [ -n "$(find "$ROOT/harness/local-aws/src" -newer "$bin" -print -quit)" ]; then
    cargo build --quiet --locked -p local-aws --bin local-aws
  fi
  LOCAL_AWS_ENDPOINT=$("$bin" --parent-pid $$)
  export LOCAL_AWS_ENDPOINT
}

# ensure_emulator: adds the pinned Lambda emulator (cargo-lambda, local/requirements-emulator.txt)
# to .venv, for the local run. --no-deps: its only dependency (ziglang) is for cross builds.
ensure_emulator() {
  local stamp="$VENV/.requirements-emulator"
  if [ ! -x "$VENV/bin/cargo-lambda" ] || ! cmp -s "$ROOT/local/requirements-emulator.txt" "$stamp"; then
    echo "adding the Lambda emulator to $VENV (cargo-lambda, pinned in local/requirements-emulator.txt)" >&2
    "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$ROOT/local/requirements-emulator.txt"
    cp "$ROOT/local/requirements-emulator.txt" "$stamp"
  fi
}
