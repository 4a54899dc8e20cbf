#!/usr/bin/env bash
# Checks what a user deploys, apart from the Rust code: the Amazon States
# Language definitions (statemachines/*.asl.json), template.yaml and the
# DefinitionSubstitutions that join them, the docs' statements about the template, and the
# consumer example's build. Offline: only the installs reach PyPI, the npm registry and
# crates.io (the consumer example's dependencies).
#
#   bash .ci/check-deploy.sh          (VENV=path to put the Python tools elsewhere)
#
# Installs, pinned:
#   ${VENV:-.venv-deploy}: aws-sam-cli, cfn-lint, parliament   (pip)
#   .ci/node_modules:      @wmfs/statelint, asl-validator      (npm ci, .ci/package-lock.json)
# Then prints one PASS/FAIL line per check, a closing count, and exits
# non-zero if any check failed. `sam build` is not run here (it needs the Rust
# crates and cargo-lambda).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

VENV="${VENV:-.venv-deploy}"
PY_PINS=(aws-sam-cli==1.170.0 cfn-lint==1.58.0 parliament==1.6.4)

# Offline, and never with anyone's real credentials: dummy region and keys,
# no profile or config files, no instance metadata look-ups, no telemetry.
export AWS_DEFAULT_REGION=us-east-1 AWS_REGION=us-east-1
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
unset AWS_SESSION_TOKEN AWS_PROFILE AWS_DEFAULT_PROFILE
export AWS_CONFIG_FILE=/dev/null AWS_SHARED_CREDENTIALS_FILE=/dev/null
export AWS_EC2_METADATA_DISABLED=true
export SAM_CLI_TELEMETRY=0 SAM_CLI_UPDATE_CHECK=0
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

now() { date +%s; }

# ------------------------------------------------------------------ installs
t0=$(now)
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
fi
# Keep the venv out of git without touching the project's .gitignore.
printf '*\n' > "$VENV/.gitignore"
"$VENV/bin/python" -m pip install --quiet "${PY_PINS[@]}"
t1=$(now)
echo "installed ${PY_PINS[*]} into $VENV in $((t1 - t0)) s"

if ! command -v npm >/dev/null 2>&1; then
  echo "npm not found: installing Debian's nodejs and npm"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm >/dev/null
fi
npm ci --prefix .ci --no-audit --no-fund --loglevel=error >/dev/null
t2=$(now)
echo "installed $(node -p "Object.entries(require('./.ci/package.json').devDependencies).map(([n, v]) => n + '@' + v).join(' ')") into .ci/node_modules in $((t2 - t1)) s"

SAM="$VENV/bin/sam"
CFN_LINT="$VENV/bin/cfn-lint"
STATELINT=.ci/node_modules/.bin/statelint
ASL_VALIDATOR=.ci/node_modules/.bin/asl-validator

echo "versions: $("$SAM" --version), $("$CFN_LINT" --version), statelint $(node -p "require('./.ci/node_modules/@wmfs/statelint/package.json').version"), asl-validator $("$ASL_VALIDATOR" --version)"

# -------------------------------------------------------------------- checks
passed=0
failed=0

# check [--show] NAME COMMAND...: runs COMMAND, prints PASS or FAIL; the
# command's output follows a FAIL (and a PASS too with --show).
check() {
  local show=0
  if [ "$1" = --show ]; then
    show=1
    shift
  fi
  local name="$1"
  shift
  local log
  log="$(mktemp)"
  if "$@" >"$log" 2>&1; then
    echo "PASS $name"
    if [ "$show" -eq 1 ]; then sed 's/^/    /' "$log"; fi
    passed=$((passed + 1))
  else
    echo "FAIL $name"
    sed 's/^/    /' "$log"
    failed=$((failed + 1))
  fi
  rm -f "$log"
}

shopt -s nullglob
definitions=(statemachines/*.asl.json examples/*/*.asl.json)
shopt -u nullglob
if [ "${#definitions[@]}" -eq 0 ]; then
  echo "FAIL no statemachines/*.asl.json found"
  failed=$((failed + 1))
fi
for def in "${definitions[@]}"; do
  check "statelint $def" "$STATELINT" "$def"
  check "asl-validator $def" "$ASL_VALIDATOR" --json-path "$def"
done

check "sam validate --lint" "$SAM" validate --lint --template-file template.yaml
check "cfn-lint template.yaml" "$CFN_LINT" template.yaml
# The consumer example: a SAM application of its own that imports the semaphore's exports.
check "sam validate --lint examples/consumer" "$SAM" validate --lint --template-file examples/consumer/template.yaml
check "cfn-lint examples/consumer/template.yaml" "$CFN_LINT" examples/consumer/template.yaml
PY="$VENV/bin/python"
check --show "DefinitionSubstitutions keys == \${...} used, per state machine" "$PY" .ci/check_substitutions.py template.yaml
check --show "DefinitionSubstitutions keys == \${...} used, the consumer example" "$PY" .ci/check_substitutions.py examples/consumer/template.yaml
# The template as the SAM translator emits it, measured against AWS's deploy-time limits
# (.ci/check_template.py names the AWS quota of each).
check --show "names built from the stack name fit their AWS limits at the longest stack name" "$PY" .ci/check_template.py names template.yaml
check --show "every DynamoDB table has the same point-in-time recovery" "$PY" .ci/check_template.py pitr template.yaml
check --show "every DynamoDB table keeps its data on a replacing update and on the stack's deletion" "$PY" .ci/check_template.py retain template.yaml
check --show "environments, policies and event patterns fit AWS quotas with every parameter at its longest, and no parameter takes an ARN list" "$PY" .ci/check_template.py sizes template.yaml
check --show "the cleanup rule, IAM and the functions cover the same machines at every prefix" "$PY" .ci/check_template.py prefixes template.yaml
check --show "the dashboard body is JSON within CloudWatch's limits and plots exactly the metrics the functions write" "$PY" .ci/check_template.py dashboard template.yaml
check --show "parliament: no IAM finding but the recorded exceptions (.ci/iam-exceptions.json)" "$PY" .ci/check_template.py iam template.yaml
check --show "what the docs quote of the template (counts, parameters and defaults, exports, alarms and their runbook, DynamoDB actions) is its own, and samconfig.toml deploys its defaults" "$PY" .ci/check_template.py docs template.yaml
check --show "a \"*\" prefix needs AllowAccountWidePrefixes=true (Rules), execution data is logged only with LogExecutionData=true, the acquire function gets RequireConfiguredLocks" "$PY" .ci/check_template.py trust template.yaml
check --show "every resource type, before and after the SAM transform, is one the Serverless Application Repository supports" "$PY" .ci/check_template.py sar template.yaml
check --show "each template check fails on a template broken for it" "$PY" .ci/check_template.py selftest template.yaml

# examples/consumer is copied into a team's own repository: it must build there, with nothing
# of this workspace (no workspace inheritance, its own Cargo.lock). Built from a copy outside the
# repository; the copy's target directory is kept under target/ so that a second run builds
# only the crate itself. Needs cargo and crates.io.
consumer_builds_alone() {
  local copy
  copy="$(mktemp -d)"
  cp -r examples/consumer "$copy/"
  (
    cd "$copy/consumer/work" &&
      CARGO_TARGET_DIR="$ROOT/target/consumer-copy" cargo build --locked &&
      cargo fmt --check &&
      CARGO_TARGET_DIR="$ROOT/target/consumer-copy" cargo clippy --locked --all-targets -- -D warnings
  )
  local status=$?
  rm -rf "$copy"
  return $status
}
check "examples/consumer builds on its own, copied outside the repository (cargo build --locked, fmt, clippy)" consumer_builds_alone

echo "deploy-checks: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
