#!/usr/bin/env python3
"""Check DefinitionSubstitutions of every AWS::Serverless::StateMachine.

For each state machine in a SAM template that loads its definition from a
local file (DefinitionUri), every ${Name} used in that file must be a key of
the machine's DefinitionSubstitutions, and every key must be used. A ${...}
left unsubstituted reaches Step Functions as literal text (an invalid ARN, a
wrong lock name); an unused key is a sign of a renamed placeholder.

The template is read with the SAM translator's own YAML parser
(samtranslator.yaml_helper, the one `sam deploy` and the local run's
local/deploy_stack.py use): short-form tags such as !Ref become the intrinsic
objects CloudFormation sees. Run it with a Python that has aws-sam-translator
(.venv-deploy, or .venv).

Usage: check_substitutions.py [template.yaml]
Prints one PASS/FAIL line per state machine; exits 1 on any failure.
"""

import json
import os
import re
import sys

import yaml
from samtranslator.yaml_helper import yaml_parse

PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


def check_template(template_path):
    base = os.path.dirname(os.path.abspath(template_path))
    with open(template_path, encoding="utf-8") as f:
        doc = yaml_parse(f.read())
    resources = (doc or {}).get("Resources")
    if not isinstance(resources, dict):
        print(f"FAIL substitutions: no Resources mapping in {template_path}")
        return 1

    failures = 0
    machines = 0
    for logical_id, resource in resources.items():
        if not isinstance(resource, dict) or resource.get("Type") != "AWS::Serverless::StateMachine":
            continue
        machines += 1
        props = resource.get("Properties") or {}
        uri = props.get("DefinitionUri")
        if not isinstance(uri, str) or not uri or uri.startswith("s3://"):
            print(f"FAIL substitutions {logical_id}: DefinitionUri must be a local file path, got {uri!r}")
            failures += 1
            continue
        path = os.path.join(base, uri)
        try:
            with open(path, encoding="utf-8") as f:
                definition = f.read()
        except OSError as e:
            print(f"FAIL substitutions {logical_id}: cannot read {uri}: {e.strerror}")
            failures += 1
            continue
        try:
            json.loads(definition)
        except ValueError as e:
            print(f"FAIL substitutions {logical_id}: {uri} is not valid JSON: {e}")
            failures += 1
            continue

        subs = props.get("DefinitionSubstitutions") or {}
        if not isinstance(subs, dict):
            print(f"FAIL substitutions {logical_id}: DefinitionSubstitutions is not a mapping")
            failures += 1
            continue
        keys = set(subs)
        used = set(PLACEHOLDER.findall(definition))
        missing = sorted(used - keys)
        unused = sorted(keys - used)
        if missing or unused:
            problems = []
            if missing:
                problems.append("used in " + uri + " but not in DefinitionSubstitutions: "
                                + ", ".join("${" + k + "}" for k in missing))
            if unused:
                problems.append("DefinitionSubstitutions keys never used in " + uri + ": " + ", ".join(unused))
            print(f"FAIL substitutions {logical_id}: " + "; ".join(problems))
            failures += 1
        else:
            print(f"PASS substitutions {logical_id}: {len(keys)} key{'' if len(keys) == 1 else 's'}, each used in {uri},"
                  " no other ${...} in it"
                  + (" (" + ", ".join(sorted(keys)) + ")" if keys else ""))

    if machines == 0:
        print(f"FAIL substitutions: no AWS::Serverless::StateMachine in {template_path}")
        return 1
    return 1 if failures else 0


def main(argv):
    template = argv[1] if len(argv) > 1 else "template.yaml"
    try:
        return check_template(template)
    except (OSError, yaml.YAMLError) as e:
        print(f"FAIL substitutions: cannot read {template}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
