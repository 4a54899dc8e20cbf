#!/usr/bin/env bash
# `sam package` of template.yaml, for the AWS Serverless Application Repository, against the
# local server's S3 (local/moto_server.py on a free port of 127.0.0.1): no AWS account, dummy
# credentials. Checks that the packaged template is what `sam publish` takes: the application
# metadata's LicenseUrl and ReadmeUrl, every function's CodeUri and every state machine's
# DefinitionUri became s3:// URIs of objects in the bucket, with the README and LICENSE uploaded
# byte for byte.
#
#   bash .ci/sam-package.sh             (after .ci/check-deploy.sh, which installs sam into .venv-deploy)
#   OUT=packaged.yaml bash .ci/sam-package.sh     to keep the packaged template
#
# What it packages:
# - after `bash .ci/sam-build.sh` (.aws-sam/build/template.yaml exists): the built template with
#   the real arm64 bootstraps, as `sam deploy` ships them;
# - otherwise a stand-in build: template.yaml moved into a temporary directory by SAM CLI's own
#   move_template (every relative path rewritten, as `sam build` does), each function's CodeUri
#   a directory holding a stub `bootstrap`. Packaging template.yaml itself is not an option:
#   Globals.CodeUri is the workspace root, and `sam package` would zip all of it (target/ too).
#   The stub run checks the template, the metadata, README, LICENSE and the definitions, not the
#   binaries.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
VENV="${VENV:-.venv-deploy}"
SAM="$VENV/bin/sam"
PY="$VENV/bin/python"
[ -x "$SAM" ] || { echo "run .ci/check-deploy.sh first (it installs sam into $VENV)" >&2; exit 1; }
[ -x .venv/bin/python ] || { echo "run local/run.sh or tests/run.sh first (they make .venv with the pinned moto)" >&2; exit 1; }

# Offline, and never with anyone's real credentials.
export AWS_DEFAULT_REGION=us-east-1 AWS_REGION=us-east-1
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
unset AWS_SESSION_TOKEN AWS_PROFILE AWS_DEFAULT_PROFILE
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
export AWS_EC2_METADATA_DISABLED=true
export SAM_CLI_TELEMETRY=0 SAM_CLI_UPDATE_CHECK=0

WORK="$(mktemp -d)"
SERVER_PID=""
cleanup() {
  if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# ------------------------------------------------------------- the local S3
.venv/bin/python local/moto_server.py --port 0 --port-file "$WORK/port" --parent-pid $$ \
  >"$WORK/server.log" 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 300); do
  [ -s "$WORK/port" ] && break
  kill -0 "$SERVER_PID" 2>/dev/null || { echo "FAIL the local server did not start:"; sed 's/^/    /' "$WORK/server.log"; exit 1; }
  sleep 0.1
done
[ -s "$WORK/port" ] || { echo "FAIL the local server wrote no port in 30 s"; exit 1; }
ENDPOINT="http://127.0.0.1:$(cat "$WORK/port")"
# Only S3 goes to the local server: `sam package` talks to S3 alone.
export AWS_ENDPOINT_URL_S3="$ENDPOINT"
BUCKET=sam-package-check
"$PY" - "$BUCKET" <<'PY'
import sys, boto3
boto3.client("s3").create_bucket(Bucket=sys.argv[1])
PY
echo "local S3 $ENDPOINT, bucket $BUCKET"

# -------------------------------------------------------- what to package
if [ -f .aws-sam/build/template.yaml ]; then
  TEMPLATE=.aws-sam/build/template.yaml
  echo "packaging $TEMPLATE (the build of .ci/sam-build.sh)"
else
  TEMPLATE="$WORK/build/template.yaml"
  "$PY" - template.yaml "$TEMPLATE" <<'PY'
import os, sys
from samcli.commands._utils.template import get_template_data, move_template
from samcli.yamlhelper import yaml_dump

src, dest = sys.argv[1], sys.argv[2]
template = get_template_data(src)
# As `sam build` leaves it: every relative path made relative to the new place...
move_template(src, dest, template)
template = get_template_data(dest)
# ...and each function's CodeUri its own artefact directory, here with a stub bootstrap.
for name, resource in template["Resources"].items():
    if resource.get("Type") == "AWS::Serverless::Function":
        os.makedirs(os.path.join(os.path.dirname(dest), name), exist_ok=True)
        with open(os.path.join(os.path.dirname(dest), name, "bootstrap"), "w") as f:
            f.write("#!/bin/sh\necho 'stub: sam-package.sh checks the packaging, not the code' >&2\nexit 1\n")
        resource.setdefault("Properties", {})["CodeUri"] = name
with open(dest, "w") as f:
    f.write(yaml_dump(template))
PY
  echo "packaging template.yaml with stub bootstraps (no .aws-sam/build: run .ci/sam-build.sh for the real ones)"
fi

OUT="${OUT:-$WORK/packaged.yaml}"
"$SAM" package --template-file "$TEMPLATE" --s3-bucket "$BUCKET" --s3-prefix stepfunctions-semaphore \
  --output-template-file "$OUT" --no-progressbar >"$WORK/package.log" 2>&1 \
  || { echo "FAIL sam package:"; sed 's/^/    /' "$WORK/package.log"; exit 1; }
echo "PASS sam package -> $OUT"

# ------------------------------------------------------------------ checks
"$PY" - "$OUT" "$BUCKET" <<'PY'
import sys, boto3
from samcli.commands._utils.template import get_template_data

packaged, bucket = sys.argv[1], sys.argv[2]
t = get_template_data(packaged)
s3 = boto3.client("s3")
failed = 0

def s3_object(uri):
    """The object's bytes if uri is s3://<our bucket>/<key> and the object exists, else None."""
    if not isinstance(uri, str) or not uri.startswith(f"s3://{bucket}/"):
        return None
    try:
        return s3.get_object(Bucket=bucket, Key=uri[len(f"s3://{bucket}/"):])["Body"].read()
    except s3.exceptions.NoSuchKey:
        return None

def check(name, ok, detail):
    global failed
    print(f"{'PASS' if ok else 'FAIL'} {name}: {detail}")
    failed += not ok

app = t.get("Metadata", {}).get("AWS::ServerlessRepo::Application", {})
for prop, local in (("LicenseUrl", "LICENSE"), ("ReadmeUrl", "README.md")):
    body = s3_object(app.get(prop))
    check(f"Metadata {prop}", body == open(local, "rb").read(),
          f"{app.get(prop)} ({'the bytes of ' + local if body is not None else 'not an object of the bucket'})")
for prop in ("Name", "Author", "SpdxLicenseId", "SemanticVersion", "HomePageUrl", "SourceCodeUrl"):
    check(f"Metadata {prop}", bool(app.get(prop)), repr(app.get(prop)))

kinds = {"AWS::Serverless::Function": "CodeUri", "AWS::Serverless::StateMachine": "DefinitionUri"}
for name, resource in t["Resources"].items():
    prop = kinds.get(resource.get("Type"))
    if prop is None:
        continue
    uri = resource.get("Properties", {}).get(prop)
    if isinstance(uri, dict):  # DefinitionUri / CodeUri as {Bucket, Key}
        uri = f"s3://{uri.get('Bucket')}/{uri.get('Key')}"
    if uri is None and prop == "DefinitionUri" and "Definition" in resource.get("Properties", {}):
        continue  # an inline definition has nothing to upload
    body = s3_object(uri)
    check(f"{name} {prop}", body is not None and len(body) > 0,
          f"{uri} ({len(body)} bytes)" if body is not None else f"{uri!r} is not an object of the bucket")
sys.exit(1 if failed else 0)
PY
