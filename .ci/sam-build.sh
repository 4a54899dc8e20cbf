#!/usr/bin/env bash
# Builds what `sam deploy` ships: the four Lambda bootstraps for provided.al2023 on arm64,
# cross-compiled with cargo-lambda + zig, then `sam build` from template.yaml (which reuses that
# cargo build). Offline apart from the installs. Prints each bootstrap's size and checks that it
# is an arm64 ELF executable.
#
#   bash .ci/sam-build.sh      (after .ci/check-deploy.sh, which creates the venv with sam)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-.venv-deploy}"
export AWS_DEFAULT_REGION=us-east-1 AWS_REGION=us-east-1 AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null AWS_EC2_METADATA_DISABLED=true
export SAM_CLI_TELEMETRY=0 SAM_CLI_UPDATE_CHECK=0 PIP_DISABLE_PIP_VERSION_CHECK=1

[ -x "$VENV/bin/sam" ] || { echo "run .ci/check-deploy.sh first (it installs sam into $VENV)" >&2; exit 1; }
"$VENV/bin/python" -m pip install --quiet cargo-lambda==1.9.2 ziglang==0.17.0
rustup target add aarch64-unknown-linux-gnu >/dev/null
export PATH="$ROOT/$VENV/bin:$PATH"

functions=(acquire:AcquireFunction release:ReleaseFunction cleanup:CleanupFunction sweeper:SweeperFunction)
bins=()
for f in "${functions[@]}"; do bins+=(--bin "${f%%:*}"); done

start=$(date +%s)
cargo lambda build --release --arm64 "${bins[@]}"
built=$(date +%s)
sam build --template-file template.yaml
done_at=$(date +%s)
echo "cargo lambda build: $((built - start)) s; sam build: $((done_at - built)) s"

status=0
for f in "${functions[@]}"; do
  bootstrap=".aws-sam/build/${f#*:}/bootstrap"
  if python3 - "$bootstrap" <<'PY'
import struct, sys
with open(sys.argv[1], "rb") as f:
    head = f.read(20)
# ELF magic, then e_machine at offset 18 (little-endian): 183 is AArch64.
ok = head[:4] == b"\x7fELF" and struct.unpack_from("<H", head, 18)[0] == 183
sys.exit(0 if ok else 1)
PY
  then
    echo "PASS $bootstrap: arm64 ELF, $(($(stat -c %s "$bootstrap") / 1024)) KiB"
  else
    echo "FAIL $bootstrap is missing or not an arm64 ELF executable"
    status=1
  fi
done
exit $status
