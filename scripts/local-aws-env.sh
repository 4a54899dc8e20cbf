# Sourced by the scripts that need the local AWS: makes .venv (pinned moto from
# local/requirements.txt) if it is missing or out of date, and defines start/stop helpers.
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

# start_local_aws: starts the serialized moto server on a free port, sets LOCAL_AWS_PID and
# LOCAL_AWS_ENDPOINT, and arranges for it to stop when the calling shell exits.
start_local_aws() {
  local dir="$ROOT/target/local-aws"
  mkdir -p "$dir"
  local port_file="$dir/server-$$.port"
  rm -f "$port_file"
  "$VENV/bin/python" "$ROOT/local/moto_server.py" --port 0 --port-file "$port_file" --parent-pid $$ \
    >"$dir/server-$$.log" 2>&1 &
  LOCAL_AWS_PID=$!
  trap 'kill "$LOCAL_AWS_PID" 2>/dev/null || true' EXIT
  for _ in $(seq 1 600); do
    [ -s "$port_file" ] && break
    kill -0 "$LOCAL_AWS_PID" 2>/dev/null || { cat "$dir/server-$$.log" >&2; echo "local AWS failed to start" >&2; return 1; }
    sleep 0.1
  done
  [ -s "$port_file" ] || { echo "local AWS did not start in 60 s" >&2; return 1; }
  LOCAL_AWS_ENDPOINT="http://127.0.0.1:$(cat "$port_file")"
  export LOCAL_AWS_ENDPOINT
  echo "local AWS (moto, serialized) at $LOCAL_AWS_ENDPOINT" >&2
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
