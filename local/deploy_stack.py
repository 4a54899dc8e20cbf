"""Deploy template.yaml to the local AWS as `sam deploy` would, and describe what was deployed.

The template goes through the SAM transform (aws-sam-translator, the SAM CLI's own, pinned in
local/requirements.txt) and is created as a stack in moto's CloudFormation: the functions,
roles and policies, names, environment variables, state machines with their
DefinitionSubstitutions, event rules and schedule are what SAM generates and CloudFormation
resolves, not a reading of the template of our own. What `sam build`/`sam package` would
upload is staged first: each function's CodeUri becomes an S3 object (the local run runs the
binary itself under cargo lambda's emulator, by the deployed function's name), each
DefinitionUri the definition file's JSON.

The translated template is uploaded to S3 and the stack created from its URL, as `sam deploy`
does with samconfig.toml's resolve_s3. The local server refuses what CloudFormation refuses at
deploy time and moto would accept (local/moto_server.py, patch_deploy_time_rules: the template's
size and counts, its Rules, its exports as resolved, an SSM parameter's value); a refused or
rolled-back stack is an error naming the rule, the output or resource, and the fix (exit 1).

Moto deploys what it supports and silently skips the rest, so the deployment is checked
before it is described: every resource SAM generated exists or is listed as skipped, no
`${` is left in any state machine's definition, every environment variable the template
gives a function is set on it and resolved. Any gap is an error (exit 1), not a quieter run.

Prints one JSON object (stdout): the stack, its parameters, tables, topic, the functions
(name, ARN, binary, environment), state machines (name, ARN, type, definition), the
EventBridge rule (pattern, target, input transformer, dead-letter queue) and the schedule
(null when the template has none: a consumer's stack, examples/consumer), the skipped
resources, the outputs and their export names, and an SQS queue subscribed to every topic
(the local run reads the notices back from it: an observer, not part of the stack).

A run that compresses time (the local run's) may shorten the timeout of a named state in every
definition, `--state-timeout "Acquire slot=20"`: the acquire state's TimeoutSeconds is the
period of a waiting execution's checks, a number in the definition file that no parameter can
substitute (a definition must be valid JSON as written), so it is changed where the file is
staged, as the local run plays the sweeper's schedule faster. A name that no state with a
timeout has fails the deploy.

Usage: python deploy_stack.py --endpoint URL [--template template.yaml]
                              [--stack-name NAME] [--parameter KEY=VALUE ...]
                              [--state-timeout STATE=SECONDS ...]
"""

import argparse
import copy
import io
import json
import os
import re
import sys
import time
import zipfile

import boto3
import botocore.exceptions
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

ACCOUNT = "123456789012"  # moto's default account, which it builds every ARN with
PLACEHOLDER = re.compile(r"\$\{[^}]*\}")


class DeployError(Exception):
    pass


class NoManagedPolicies:
    """The translator's managed-policy loader: it is asked only for a policy named by its bare
    name, which template.yaml never does (its policies are ARNs, !Refs and SAM's templates)."""

    def load(self):
        return {}


def shorten_timeouts(definition, state_timeouts):
    """Sets TimeoutSeconds of the states named in `state_timeouts` that have one, in the
    definition's own states and those of its Parallel branches and Map processors; returns the
    names it set."""
    pending, shortened = [definition.get("States", {})], set()
    while pending:
        for name, state in pending.pop().items():
            if name in state_timeouts and "TimeoutSeconds" in state:
                state["TimeoutSeconds"] = state_timeouts[name]
                shortened.add(name)
            inner = state.get("Branches", []) + [state.get("ItemProcessor") or state.get("Iterator") or {}]
            pending.extend(part.get("States", {}) for part in inner)
    return shortened


def stage(template, template_dir, s3, bucket, state_timeouts):
    """Replaces each function's local CodeUri with an S3 object and each DefinitionUri with the
    definition (its named states' timeouts shortened), as `sam package` would; returns {function
    logical id: cargo binary}."""
    s3.create_bucket(Bucket=bucket)
    binaries, shortened = {}, set()
    globals_function = template.get("Globals", {}).get("Function", {})
    for logical_id, resource in template["Resources"].items():
        properties = resource.setdefault("Properties", {})
        if resource["Type"] == "AWS::Serverless::Function":
            binary = resource.get("Metadata", {}).get("BuildProperties", {}).get("Binary")
            if not binary:
                raise DeployError(f"{logical_id}: no Metadata.BuildProperties.Binary (the cargo binary)")
            binaries[logical_id] = binary
            # What `sam build` would zip: the local run runs the binary itself.
            archive = io.BytesIO()
            with zipfile.ZipFile(archive, "w") as z:
                z.writestr("bootstrap", f"#!/bin/sh\n# the cargo binary {binary}, run by the local run\n")
            # Named after the binary: local/moto_server.py's Lambda bridge hands an invoke of
            # the deployed function to the emulator's binary of that name.
            key = f"{binary}.zip"
            s3.put_object(Bucket=bucket, Key=key, Body=archive.getvalue())
            properties["CodeUri"] = {"Bucket": bucket, "Key": key}
        elif resource["Type"] == "AWS::Serverless::StateMachine" and "DefinitionUri" in properties:
            uri = properties.pop("DefinitionUri")
            if not isinstance(uri, str) or uri.startswith("s3://"):
                raise DeployError(f"{logical_id}: DefinitionUri {uri!r} is not a local file")
            with open(os.path.join(template_dir, uri), encoding="utf-8") as f:
                properties["Definition"] = json.load(f)
            shortened |= shorten_timeouts(properties["Definition"], state_timeouts)
            resource.setdefault("Metadata", {})["DefinitionUri"] = uri
    globals_function.pop("CodeUri", None)
    missing = sorted(set(state_timeouts) - shortened)
    if missing:
        raise DeployError(f"--state-timeout: no state named {missing} with a TimeoutSeconds in any definition")
    return binaries


def create_stack(cfn, s3, bucket, name, body, parameters):
    """Creates the stack from `body` (the translated template) as `sam deploy` with resolve_s3
    does: the template uploaded to S3, CreateStack given its URL. CloudFormation's deploy-time
    rules (template size and counts, Rules, exports, SSM parameter values) are the local server's
    (local/moto_server.py, patch_deploy_time_rules): a refusal, or a rollback, is an error that
    names the rule, the output or resource, and the fix."""
    key = f"{name}.template.json"
    s3.put_object(Bucket=bucket, Key=key, Body=json.dumps(body).encode())
    try:
        cfn.create_stack(
            StackName=name,
            TemplateURL=f"https://s3.amazonaws.com/{bucket}/{key}",
            Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
            Capabilities=["CAPABILITY_IAM", "CAPABILITY_NAMED_IAM", "CAPABILITY_AUTO_EXPAND"],
        )
    except botocore.exceptions.ClientError as error:
        message = error.response["Error"].get("Message", error)
        raise DeployError(f"CloudFormation refuses stack {name}: {message}")
    deadline = time.monotonic() + 120
    while True:
        stack = cfn.describe_stacks(StackName=name)["Stacks"][0]
        status = stack["StackStatus"]
        if status == "CREATE_COMPLETE":
            return stack
        if status == "ROLLBACK_COMPLETE":
            reason = stack.get("StackStatusReason", "")
            raise DeployError(f"CloudFormation rolled stack {name} back: {reason}")
        if not status.endswith("IN_PROGRESS") or time.monotonic() > deadline:
            raise DeployError(f"stack {name}: {status} {stack.get('StackStatusReason', '')}")
        time.sleep(0.2)


def unresolved(value):
    """A value CloudFormation should have resolved: an intrinsic left as an object, or a ${...}."""
    return not isinstance(value, (str, int, float, bool)) or bool(PLACEHOLDER.search(str(value)))


def may_be_absent(value):
    """A declared value that may resolve to nothing: an Fn::If with an AWS::NoValue branch."""
    branches = value.get("Fn::If", [None])[1:] if isinstance(value, dict) else []
    return {"Ref": "AWS::NoValue"} in branches


def describe(session, endpoint, name, translated, binaries):
    cfn, lam, sfn, events, sns, sqs = (
        session.client(service, endpoint_url=endpoint)
        for service in ("cloudformation", "lambda", "stepfunctions", "events", "sns", "sqs")
    )
    stack = cfn.describe_stacks(StackName=name)["Stacks"][0]
    deployed = {
        r["LogicalResourceId"]: r
        for r in cfn.list_stack_resources(StackName=name)["StackResourceSummaries"]
    }
    problems = []
    skipped = []
    for logical_id, resource in translated["Resources"].items():
        if logical_id not in deployed or not deployed[logical_id].get("PhysicalResourceId"):
            if resource.get("Condition") is None:
                skipped.append({"logical_id": logical_id, "type": resource["Type"]})
    physical = {k: r["PhysicalResourceId"] for k, r in deployed.items()}

    functions = []
    for logical_id, binary in binaries.items():
        config = lam.get_function_configuration(FunctionName=physical[logical_id])
        variables = config.get("Environment", {}).get("Variables", {})
        declared = translated["Resources"][logical_id]["Properties"].get("Environment", {})
        for variable, value in declared.get("Variables", {}).items():
            if variable not in variables and not may_be_absent(value):
                problems.append(f"function {logical_id}: {variable} is not set")
        for variable, value in variables.items():
            if unresolved(value):
                problems.append(f"function {logical_id}: {variable} is unresolved: {value}")
        # Lambda's variables are text; moto keeps a parameter's number as CloudFormation's
        # resolution left it (8, not "8"), which the API would never answer.
        environment = {
            variable: value if isinstance(value, str) else json.dumps(value)
            for variable, value in variables.items()
        }
        functions.append(
            {
                "logical_id": logical_id,
                "binary": binary,
                "name": config["FunctionName"],
                "arn": config["FunctionArn"],
                "environment": environment,
                "memory_mb": config.get("MemorySize", 128),
                "timeout_seconds": config.get("Timeout", 3),
            }
        )

    machines = []
    for logical_id, resource in translated["Resources"].items():
        if resource["Type"] != "AWS::StepFunctions::StateMachine":
            continue
        machine = sfn.describe_state_machine(stateMachineArn=physical[logical_id])
        if PLACEHOLDER.search(machine["definition"]):
            problems.append(
                f"state machine {logical_id}: {sorted(set(PLACEHOLDER.findall(machine['definition'])))} left in its definition"
            )
        machines.append(
            {
                "logical_id": logical_id,
                "name": machine["name"],
                "arn": machine["stateMachineArn"],
                "type": machine.get("type", "STANDARD"),
                "definition": machine["definition"],
                "definition_uri": resource.get("Metadata", {}).get("DefinitionUri", ""),
            }
        )

    rules, schedules = [], []
    for logical_id, resource in translated["Resources"].items():
        if resource["Type"] != "AWS::Events::Rule":
            continue
        rule = events.describe_rule(Name=physical[logical_id])
        targets = events.list_targets_by_rule(Rule=rule["Name"])["Targets"]
        if len(targets) != 1:
            problems.append(f"rule {logical_id}: {len(targets)} targets, the local run plays one")
            continue
        target = targets[0]
        if "ScheduleExpression" in rule:
            schedules.append(
                {
                    "name": rule["Name"],
                    "expression": rule["ScheduleExpression"],
                    "target": target["Arn"],
                    "input": target.get("Input", "{}"),
                }
            )
        else:
            transformer = target.get("InputTransformer")
            rules.append(
                {
                    "name": rule["Name"],
                    "pattern": json.loads(rule["EventPattern"]),
                    "target": target["Arn"],
                    "transformer": transformer
                    and {"paths": transformer.get("InputPathsMap", {}), "template": transformer["InputTemplate"]},
                    "dead_letter_queue": target.get("DeadLetterConfig", {}).get("Arn"),
                }
            )
    if len(rules) > 1 or len(schedules) > 1:
        problems.append(f"{len(rules)} event rules and {len(schedules)} schedules: the local run plays at most one of each")

    tables = {
        logical_id: physical[logical_id]
        for logical_id, resource in translated["Resources"].items()
        if resource["Type"] == "AWS::DynamoDB::Table"
    }
    topics = [
        physical[logical_id]
        for logical_id, resource in translated["Resources"].items()
        if resource["Type"] == "AWS::SNS::Topic"
    ]
    for kind, count in (("function", len(functions)), ("state machine", len(machines))):
        if count == 0:
            problems.append(f"no {kind} deployed")
    if problems:
        raise DeployError("the deployed stack is not what template.yaml makes:\n  " + "\n  ".join(problems))

    # The observer of the notices: a queue subscribed to every topic.
    queue_url = sqs.create_queue(QueueName=f"{name}-notices")["QueueUrl"]
    queue_arn = sqs.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["QueueArn"])["Attributes"]["QueueArn"]
    for topic in topics:
        sns.subscribe(TopicArn=topic, Protocol="sqs", Endpoint=queue_arn)

    return {
        "stack": {
            "name": name,
            "region": session.region_name,
            "account": ACCOUNT,
            "partition": "aws",
        },
        "parameters": {p["ParameterKey"]: p["ParameterValue"] for p in stack.get("Parameters", [])},
        "tables": tables,
        "topics": topics,
        "notice_queue_url": queue_url,
        "functions": functions,
        "machines": machines,
        "rule": rules[0] if rules else None,
        "schedule": schedules[0] if schedules else None,
        "skipped": skipped,
        # What the stack exports (a consumer stack imports it).
        "outputs": {
            o["OutputKey"]: {"value": o["OutputValue"], "export": o.get("ExportName")}
            for o in stack.get("Outputs", [])
        },
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--endpoint", required=True, metavar="URL")
    parser.add_argument("--template", default=os.path.join(os.path.dirname(__file__), "..", "template.yaml"))
    parser.add_argument("--stack-name", default="semaphore-local")
    parser.add_argument("--region", default="us-east-1")
    parser.add_argument("--parameter", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--state-timeout", action="append", default=[], metavar="STATE=SECONDS")
    args = parser.parse_args()
    parameters = {}
    for item in args.parameter:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--parameter {item!r}: expected KEY=VALUE")
        parameters[key] = value
    state_timeouts = {}
    for item in args.state_timeout:
        name, sep, seconds = item.rpartition("=")
        if not sep or not seconds.isdigit() or int(seconds) < 1:
            parser.error(f"--state-timeout {item!r}: expected STATE=SECONDS, whole seconds from 1")
        state_timeouts[name] = int(seconds)

    session = boto3.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name=args.region
    )
    # The translator reads the region from the environment (botocore), as the SAM CLI does.
    os.environ["AWS_DEFAULT_REGION"] = args.region
    try:
        with open(args.template, encoding="utf-8") as f:
            template = yaml_parse(f.read())
        declared = template.get("Parameters", {})
        unknown = sorted(set(parameters) - set(declared))
        if unknown:
            raise DeployError(f"parameters {unknown} are not declared by {args.template}")
        sam = copy.deepcopy(template)
        binaries = stage(
            sam,
            os.path.dirname(os.path.abspath(args.template)),
            session.client("s3", endpoint_url=args.endpoint),
            f"{args.stack_name}-artifacts",
            state_timeouts,
        )
        translated = transform(sam, dict(parameters), NoManagedPolicies())
        create_stack(
            session.client("cloudformation", endpoint_url=args.endpoint),
            session.client("s3", endpoint_url=args.endpoint),
            f"{args.stack_name}-artifacts",
            args.stack_name,
            translated,
            parameters,
        )
        description = describe(session, args.endpoint, args.stack_name, translated, binaries)
    except DeployError as error:
        print(f"deploy_stack.py: {error}", file=sys.stderr)
        return 1
    json.dump(description, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
