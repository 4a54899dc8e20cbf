#!/usr/bin/env python3
"""Deploy-time checks of template.yaml as the SAM translator emits it.

AWS enforces limits at deploy time that no local run meets: a state machine
name longer than 80 characters, a function's environment over 4 KB, a policy
over IAM's size quotas, an event pattern over EventBridge's. This script
translates the template with the SAM translator (samtranslator, which
aws-sam-cli brings into .venv-deploy; its own YAML reader), evaluates the
CloudFormation intrinsics with the parameters at their longest accepted values
and the stack name at the longest the template allows, and measures each
limited thing against its AWS quota (the AWS documentation's number is named
next to each one below).

Usage (the venv's python: samtranslator and parliament live there):
  check_template.py names  [template.yaml]  every name built from the stack name fits
  check_template.py sizes  [template.yaml]  environments, policies and event patterns fit
                                             with every parameter at its longest (and every
                                             prefix "*"); no parameter takes a list of ARNs
  check_template.py prefixes [template.yaml] for each prefix parameter (empty, "*", a short
                                             one, the longest), the cleanup rule, IAM and the
                                             functions' settings cover exactly the same
                                             machines and functions
  check_template.py iam    [template.yaml]  parliament finds nothing but the recorded
                                             exceptions (.ci/iam-exceptions.json)
  check_template.py pitr   [template.yaml]  every table has the same point-in-time recovery
  check_template.py dashboard [template.yaml] every dashboard body is JSON within CloudWatch's
                                             limits and plots only (and every one of) the
                                             metrics the functions write, where they write
                                             them; alarms on them watch written metrics too,
                                             and each function that counts its Failures has an
                                             alarm on them; every alarm is on an alarm widget
  check_template.py docs   [template.yaml]  what the docs quote of the template is its own:
                                             counts ("six machines are named ..."), the
                                             parameters and defaults (and samconfig.toml's),
                                             exports and SSM parameters, alarms (each with a
                                             runbook entry), the functions' DynamoDB actions
  check_template.py trust  [template.yaml]  a "*" prefix is refused by the Rules unless
                                             AllowAccountWidePrefixes=true; no machine logs
                                             execution data unless LogExecutionData=true; the
                                             acquire function gets RequireConfiguredLocks
  check_template.py retain [template.yaml]  every table is kept on a replacing update and on
                                             the stack's deletion
  check_template.py sar    [template.yaml]  every resource type, before and after the SAM
                                             transform, is on the Serverless Application
                                             Repository's list of supported resources
  check_template.py selftest [template.yaml] each check above fails on a template broken
                                             for it (and passes on the template itself)
Prints what it measured; exits 1 on any failure.
"""

import copy
import json
import logging
import os
import re
import sys

import yaml
from samtranslator.model.exceptions import InvalidDocumentException
from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse

# The translator's own usage metrics (a DummyMetricsPublisher here) warn when dropped.
logging.getLogger("samtranslator.metrics").setLevel(logging.ERROR)

HERE = os.path.dirname(os.path.abspath(__file__))
EXCEPTIONS = os.path.join(HERE, "iam-exceptions.json")

# CloudFormation: "a stack name can contain only alphanumeric characters
# (case-sensitive) and hyphens ... 128 characters" (CreateStack, StackName).
CFN_STACK_NAME_MAX = 128
# The longest partition and region names there are, so that every ARN the
# template builds is measured at its longest.
PARTITION = "aws-us-gov"
REGION = "ap-southeast-7"
ACCOUNT = "123456789012"

# Name properties and their AWS limits (characters).
NAME_LIMITS = {
    # Step Functions CreateStateMachine, name: "Maximum length of 80".
    ("AWS::StepFunctions::StateMachine", "StateMachineName"): 80,
    # CloudWatch Logs CreateLogGroup: "Log group names can be between 1 and 512 characters long".
    ("AWS::Logs::LogGroup", "LogGroupName"): 512,
    # Lambda CreateFunction, FunctionName: 64 characters (the name alone).
    ("AWS::Lambda::Function", "FunctionName"): 64,
    # IAM quotas: role names 64 characters, managed policy names 128.
    ("AWS::IAM::Role", "RoleName"): 64,
    ("AWS::IAM::ManagedPolicy", "ManagedPolicyName"): 128,
    # DynamoDB CreateTable, TableName: 3 to 255 characters.
    ("AWS::DynamoDB::Table", "TableName"): 255,
    # SNS CreateTopic: topic names up to 256 characters.
    ("AWS::SNS::Topic", "TopicName"): 256,
    # EventBridge PutRule, Name: 64 characters.
    ("AWS::Events::Rule", "Name"): 64,
    # CloudWatch PutMetricAlarm, AlarmName: 255 characters.
    ("AWS::CloudWatch::Alarm", "AlarmName"): 255,
    # SQS CreateQueue, QueueName: up to 80 characters.
    ("AWS::SQS::Queue", "QueueName"): 80,
    # CloudWatch PutDashboard, DashboardName: "The maximum length is 255".
    ("AWS::CloudWatch::Dashboard", "DashboardName"): 255,
    # Systems Manager PutParameter, Name: "The maximum length for a parameter name, including
    # the full length of the parameter Amazon Resource Name (ARN), is 1011 characters"; the
    # ARN adds arn:<partition>:ssm:<region>:<account>:parameter (at most about 60).
    ("AWS::SSM::Parameter", "Name"): 950,
}

# Size quotas.
# Lambda quotas: "Environment variables: 4 KB", the total of the function's set. Counted
# here as the JSON object of the variables (keys, values, quotes and separators), which
# is at least what Lambda counts however it counts keys and values.
LAMBDA_ENV_BYTES = 4096
# IAM and AWS STS quotas ("IAM doesn't count white space when calculating the size of a
# policy"): managed policy 6,144 characters; a role's inline policies 10,240 in all;
# a role trust policy 2,048; 10 managed policies attached to a role (default quota).
IAM_MANAGED_POLICY_CHARS = 6144
IAM_ROLE_INLINE_CHARS = 10240
IAM_TRUST_POLICY_CHARS = 2048
IAM_MANAGED_POLICIES_PER_ROLE = 10
# EventBridge quotas: "Event pattern size: 2,048 characters" (default; adjustable).
EVENT_PATTERN_CHARS = 2048
# CloudFormation quotas: a parameter value is at most 4,096 bytes.
CFN_PARAMETER_BYTES = 4096
# CloudWatch "Dashboard Body Structure and Syntax": a DashboardBody holds 0 to 500 widgets.
# CloudWatch service quotas (Dashboards): up to 500 metrics per graph widget and 2,500 per
# dashboard across its widgets (a SEARCH expression counts as one here; what it finds is
# bounded by the console, 500 series, not by the body). The body itself is a CloudFormation
# string within the template, which `sam deploy` uploads (1 MB: CloudFormation quotas,
# "Template body size in an Amazon S3 object").
DASHBOARD_WIDGETS = 500
DASHBOARD_WIDGET_METRICS = 500
DASHBOARD_METRICS = 2500
TEMPLATE_BYTES = 1_000_000

# The functions' metric catalogue: one `Metric { name, unit, dimensions }` literal per metric
# and dimension sets (crates/lambda-common/src/metrics.rs, CATALOGUE).
METRICS_SOURCE = os.path.join(os.path.dirname(HERE), "crates", "lambda-common", "src", "metrics.rs")

# The shortest and the longest element each list parameter's AllowedPattern accepts
# (the shortest is the worst case: every element adds quotes, ":*" and separators
# where it is copied). The check verifies both against the pattern.
LIST_ELEMENTS = {
    "states": (
        "arn:aws:states:a:123456789012:stateMachine:x",
        f"arn:{PARTITION}:states:{REGION}:123456789012:stateMachine:" + "m" * 80,
    ),
    "lambda": (
        "arn:aws:lambda:a:123456789012:function:x",
        f"arn:{PARTITION}:lambda:{REGION}:123456789012:function:" + "f" * 64 + ":" + "q" * 128,
    ),
}

NO_VALUE = object()


class CheckError(Exception):
    pass


# ------------------------------------------------------------------ template


def load(path):
    with open(path, encoding="utf-8") as f:
        return yaml_parse(f.read())


def translate(template, parameter_values):
    """The template as CloudFormation receives it from `sam deploy`."""
    template = copy.deepcopy(template)
    # `sam deploy` uploads the code and definitions and puts their S3 locations here;
    # the translator refuses local paths. What is uploaded measures nothing here.
    function_globals = template.get("Globals", {}).get("Function", {})
    if "CodeUri" in function_globals:
        function_globals["CodeUri"] = "s3://bucket/code.zip"
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        if "CodeUri" in props:
            props["CodeUri"] = "s3://bucket/code.zip"
        if "DefinitionUri" in props:
            props["DefinitionUri"] = "s3://bucket/definition.json"

    class NoManagedPolicies:
        # The template names AWS managed policies by ARN only.
        def load(self):
            return {}

    return transform(template, dict(parameter_values), NoManagedPolicies())


def stack_name_bound(template):
    """The longest stack name the template promises to deploy with."""
    description = " ".join(str(template.get("Description", "")).split())
    found = re.search(r"stack name at most (\d+) characters", description)
    if not found:
        raise CheckError(
            "template Description states no 'stack name at most N characters': the names "
            f"are checked at CloudFormation's {CFN_STACK_NAME_MAX}"
        )
    bound = int(found.group(1))
    if not 1 <= bound <= CFN_STACK_NAME_MAX:
        raise CheckError(f"Description's stack name bound {bound} is not 1..{CFN_STACK_NAME_MAX}")
    return bound


def longest_value(name, spec):
    """The longest value CloudFormation accepts for a parameter (as text)."""
    kind = spec.get("Type", "String")
    if "AllowedValues" in spec:
        return max((str(v) for v in spec["AllowedValues"]), key=len)
    if kind == "Number":
        if "MaxValue" not in spec or "MinValue" not in spec:
            raise CheckError(f"parameter {name}: a Number without MinValue and MaxValue")
        return max((str(spec["MinValue"]), str(spec["MaxValue"])), key=len)
    if kind != "String":
        raise CheckError(f"parameter {name}: type {kind} is not measured (use String and !Split)")
    if "MaxLength" not in spec:
        raise CheckError(
            f"parameter {name}: a String without MaxLength reaches the deployed resources "
            "unbounded"
        )
    n = int(spec["MaxLength"])
    if n > CFN_PARAMETER_BYTES:
        raise CheckError(f"parameter {name}: MaxLength {n} > CloudFormation's {CFN_PARAMETER_BYTES}")
    pattern = spec.get("AllowedPattern")
    element = list_element(pattern)
    if element:
        # A list parameter: its worst case is the most elements (the shortest ones).
        return list_value(name, spec, element[0])
    for candidate in ("a" * n, "1" * n, "a" * (n - 6) + "@a.com"):
        if len(candidate) == n and (not pattern or matches(pattern, candidate)):
            return candidate
    raise CheckError(f"parameter {name}: no value of its MaxLength {n} found that matches its pattern")


def matches(pattern, value):
    return re.fullmatch(pattern, value) is not None


def list_value(name, spec, element):
    """A comma-separated list of `element` as long as the parameter accepts."""
    n = int(spec["MaxLength"])
    pattern = spec.get("AllowedPattern", "")
    if not matches(pattern, element):
        raise CheckError(f"parameter {name}: its pattern refuses the element {element}")
    count = (n + 1) // (len(element) + 1)
    value = ",".join([element] * count)
    if count == 0 or not matches(pattern, value) or len(value) > n:
        raise CheckError(f"parameter {name}: its pattern refuses a list of {count} x {element}")
    return value


def list_parameters(template):
    """Parameters holding comma-separated ARN lists: name -> (short, long) element."""
    found = {}
    for name, spec in template.get("Parameters", {}).items():
        if spec.get("Type") == "CommaDelimitedList":
            raise CheckError(
                f"parameter {name}: CommaDelimitedList has no MaxLength; use a String with "
                "MaxLength and an AllowedPattern, and !Split where a list is needed"
            )
        element = list_element(spec.get("AllowedPattern"))
        if element:
            short, long_ = element
            if not matches(spec["AllowedPattern"], long_ + "," + short):
                raise CheckError(f"parameter {name}: its pattern refuses {long_}")
            found[name] = element
    return found


def list_element(pattern):
    """(shortest, longest) element if `pattern` accepts a comma-separated list of ARNs."""
    for short, long_ in LIST_ELEMENTS.values():
        if pattern and matches(pattern, short + "," + short):
            return short, long_
    return None


# ---------------------------------------------------------------- intrinsics


class Stack:
    """Evaluates CloudFormation intrinsics as CloudFormation would, with placeholder
    physical names for what CloudFormation generates ("<stack>-<logical id>-<random>",
    cut to the resource's name limit)."""

    def __init__(self, template, parameters, name, partition=PARTITION, region=REGION):
        self.template = template
        self.partition = partition
        self.region = region
        self.resources = template.get("Resources", {})
        self.conditions = template.get("Conditions", {})
        self.parameters = parameters
        self.name = name
        self._condition_cache = {}

    # physical names
    def generated(self, logical_id, limit):
        return f"{self.name}-{logical_id}-ABCDEFGHIJKLM"[:limit]

    def arn(self, service, resource, region=True):
        r = self.region if region else ""
        return f"arn:{self.partition}:{service}:{r}:{ACCOUNT}:{resource}"

    def physical_name(self, logical_id):
        resource = self.resources[logical_id]
        kind = resource["Type"]
        props = resource.get("Properties", {})
        for (k, prop), limit in NAME_LIMITS.items():
            if k == kind:
                if prop in props:
                    return self.resolve(props[prop])
                return self.generated(logical_id, limit)
        return self.generated(logical_id, 64)

    def ref(self, name):
        pseudo = {
            "AWS::StackName": self.name,
            "AWS::Region": self.region,
            "AWS::AccountId": ACCOUNT,
            "AWS::Partition": self.partition,
            "AWS::URLSuffix": "amazonaws.com",
            "AWS::StackId": self.arn("cloudformation", f"stack/{self.name}/" + "0" * 36),
            "AWS::NoValue": NO_VALUE,
        }
        if name in pseudo:
            return pseudo[name]
        if name in self.parameters:
            return self.parameters[name]
        if name not in self.resources:
            raise CheckError(f"Ref {name}: no such parameter or resource")
        kind = self.resources[name]["Type"]
        physical = self.physical_name(name)
        return {
            "AWS::StepFunctions::StateMachine": lambda: self.arn("states", f"stateMachine:{physical}"),
            "AWS::SNS::Topic": lambda: self.arn("sns", physical),
            "AWS::IAM::ManagedPolicy": lambda: self.arn("iam", f"policy/{physical}", region=False),
            "AWS::SQS::Queue": lambda: f"https://sqs.{self.region}.amazonaws.com/{ACCOUNT}/{physical}",
        }.get(kind, lambda: physical)()

    def get_att(self, logical_id, attribute):
        kind = self.resources[logical_id]["Type"]
        name = self.physical_name(logical_id)
        table = {
            ("AWS::DynamoDB::Table", "Arn"): lambda: self.arn("dynamodb", f"table/{name}"),
            ("AWS::Lambda::Function", "Arn"): lambda: self.arn("lambda", f"function:{name}"),
            ("AWS::StepFunctions::StateMachine", "Arn"): lambda: self.ref(logical_id),
            ("AWS::StepFunctions::StateMachine", "Name"): lambda: name,
            ("AWS::SNS::Topic", "TopicArn"): lambda: self.ref(logical_id),
            ("AWS::SNS::Topic", "TopicName"): lambda: name,
            ("AWS::Logs::LogGroup", "Arn"): lambda: self.arn("logs", f"log-group:{name}:*"),
            ("AWS::IAM::Role", "Arn"): lambda: self.arn("iam", f"role/{name}", region=False),
            ("AWS::Events::Rule", "Arn"): lambda: self.arn("events", f"rule/{name}"),
            ("AWS::SQS::Queue", "Arn"): lambda: self.arn("sqs", name),
            ("AWS::SQS::Queue", "QueueName"): lambda: name,
            ("AWS::SQS::Queue", "QueueUrl"): lambda: self.ref(logical_id),
            ("AWS::CloudWatch::Alarm", "Arn"): lambda: self.arn("cloudwatch", f"alarm:{name}"),
        }
        if (kind, attribute) not in table:
            raise CheckError(
                f"Fn::GetAtt {logical_id}.{attribute} ({kind}) is not emulated: add it to "
                "Stack.get_att in .ci/check_template.py"
            )
        return table[(kind, attribute)]()

    def condition(self, name):
        if name not in self._condition_cache:
            if name not in self.conditions:
                raise CheckError(f"condition {name} is not declared")
            self._condition_cache[name] = self.truth(self.conditions[name])
        return self._condition_cache[name]

    def truth(self, value):
        v = self.resolve(value)
        if isinstance(v, bool):
            return v
        if v in ("true", "false"):
            return v == "true"
        raise CheckError(f"a condition evaluated to {v!r}")

    def sub(self, text, variables):
        def one(m):
            inner = m.group(1)
            if inner.startswith("!"):
                return "${" + inner[1:] + "}"
            if inner in variables:
                return str(self.resolve(variables[inner]))
            if "." in inner and inner.split(".", 1)[0] in self.resources:
                return str(self.get_att(*inner.split(".", 1)))
            value = self.ref(inner)
            if isinstance(value, list):
                raise CheckError(f"Fn::Sub ${{{inner}}} is a list")
            return str(value)

        return re.sub(r"\$\{([^}]*)\}", one, text)

    def resolve(self, value):
        if isinstance(value, list):
            out = [self.resolve(v) for v in value]
            return [v for v in out if v is not NO_VALUE]
        if not isinstance(value, dict):
            return value
        if len(value) == 1:
            (key, arg), = value.items()
            if key == "Ref":
                return self.ref(arg)
            if key == "Condition":
                return self.condition(arg)
            if key.startswith("Fn::"):
                return self.intrinsic(key, arg)
        out = {k: self.resolve(v) for k, v in value.items()}
        return {k: v for k, v in out.items() if v is not NO_VALUE}

    def intrinsic(self, key, arg):
        if key == "Fn::Sub":
            if isinstance(arg, str):
                return self.sub(arg, {})
            return self.sub(arg[0], arg[1])
        if key == "Fn::GetAtt":
            logical_id, attribute = arg if isinstance(arg, list) else arg.split(".", 1)
            return self.get_att(logical_id, attribute)
        if key == "Fn::Join":
            sep, items = arg[0], self.resolve(arg[1])
            if not isinstance(items, list):
                raise CheckError(f"Fn::Join of {items!r}")
            return sep.join(str(i) for i in items)
        if key == "Fn::Split":
            sep, text = arg[0], self.resolve(arg[1])
            if not isinstance(text, str):
                raise CheckError(f"Fn::Split of {text!r}, not a string")
            return text.split(sep)
        if key == "Fn::Select":
            index, items = int(self.resolve(arg[0])), self.resolve(arg[1])
            return items[index]
        if key == "Fn::FindInMap":
            name, top, second = (str(self.resolve(a)) for a in arg)
            try:
                return self.template["Mappings"][name][top][second]
            except KeyError:
                raise CheckError(f"Fn::FindInMap [{name}, {top}, {second}]: no such entry") from None
        if key == "Fn::If":
            name, then, otherwise = arg
            return self.resolve(then if self.condition(name) else otherwise)
        if key == "Fn::Not":
            return not self.truth(arg[0])
        if key == "Fn::And":
            return all(self.truth(a) for a in arg)
        if key == "Fn::Or":
            return any(self.truth(a) for a in arg)
        if key == "Fn::Equals":
            a, b = (self.resolve(x) for x in arg)
            return str(a) == str(b)
        raise CheckError(f"{key} is not emulated")


def render(template, values, stack_name, **where):
    """The translated template, every intrinsic evaluated."""
    translated = translate(template, values)
    stack = Stack(translated, typed(template, values), stack_name, **where)
    rendered = {}
    for logical_id, resource in translated["Resources"].items():
        if "Condition" in resource and not stack.condition(resource["Condition"]):
            continue
        rendered[logical_id] = {
            "Type": resource["Type"],
            "Properties": stack.resolve(resource.get("Properties", {})),
        }
    return translated, rendered


def typed(template, values):
    """Parameter values as Ref gives them (a CommaDelimitedList is a list)."""
    out = {}
    for name, spec in template.get("Parameters", {}).items():
        value = values.get(name, spec.get("Default", ""))
        value = str(value)
        out[name] = value.split(",") if spec.get("Type") == "CommaDelimitedList" else value
    return out


def compact(document):
    """A policy or pattern as IAM and EventBridge count it: JSON without white space."""
    return json.dumps(document, separators=(",", ":"))


# -------------------------------------------------------------------- checks


def check_names(template, root):
    bound = stack_name_bound(template)
    stack_name = "s" * bound
    values = {n: str(s["Default"]) for n, s in template.get("Parameters", {}).items() if "Default" in s}
    translated, rendered = render(template, values, stack_name)
    failures = []
    print(f"stack name: {bound} characters (the template's Description)")
    samconfig = os.path.join(root, "samconfig.toml")
    if os.path.exists(samconfig):
        import tomllib

        with open(samconfig, "rb") as f:
            name = tomllib.load(f).get("default", {}).get("global", {}).get("parameters", {}).get("stack_name", "")
        if len(name) > bound:
            failures.append(f"samconfig.toml's stack_name {name} is {len(name)} characters, over {bound}")
    for logical_id, resource in translated["Resources"].items():
        for prop, raw in resource.get("Properties", {}).items():
            built = "AWS::StackName" in json.dumps(raw)
            limit = NAME_LIMITS.get((resource["Type"], prop))
            if limit is None:
                if built and prop.endswith("Name"):
                    failures.append(
                        f"{logical_id}.{prop} is built from the stack name and this check "
                        "knows no limit for it: add it to NAME_LIMITS"
                    )
                continue
            if logical_id not in rendered:
                continue
            value = rendered[logical_id]["Properties"].get(prop)
            if not isinstance(value, str):
                continue
            verdict = "ok" if len(value) <= limit else "TOO LONG"
            line = f"{logical_id}.{prop}: {len(value)}/{limit} {verdict}"
            if len(value) > limit:
                failures.append(f"{line}: {value}")
            elif built:
                print(line)
    for f in failures:
        print("FAIL", f)
    return not failures


def prefix_parameters(template):
    """The parameters that declare consumers by name prefix."""
    return [n for n in template.get("Parameters", {}) if n.endswith("Prefix")]


def check_sizes(template, root):
    bound = stack_name_bound(template)
    stack_name = "s" * bound
    parameters = template.get("Parameters", {})
    lists = list_parameters(template)
    if lists:
        raise CheckError(
            f"{', '.join(lists)} take a list of ARNs: declare consumers by name prefix (a list "
            "needs a redeploy per consumer and outgrows the quotas)"
        )
    prefixes = prefix_parameters(template)
    if not prefixes:
        raise CheckError("no prefix parameter found (a String parameter named *Prefix)")
    worst = {name: longest_value(name, spec) for name, spec in parameters.items()}
    every = dict(worst)
    for name in prefixes:
        every[name] = "*"
    for name in prefixes:
        print(f"{name}: at most {parameters[name]['MaxLength']} characters")
    failures = []
    for case, values in (("every parameter at its longest", worst), ('every prefix "*"', every)):
        _, rendered = render(template, values, stack_name)
        failures += measure(case, rendered)
    for f in failures:
        print("FAIL", f)
    return not failures


def measure(case, rendered):
    failures = []
    largest = {}

    def limit(what, size, quota):
        # Printed: the largest of each kind, the one nearest its quota.
        kind = what.split(" ", 1)[1]
        if kind not in largest or size > largest[kind][1]:
            largest[kind] = (what, size, quota)
        if size > quota:
            failures.append(f"{case}: {what} is {size}, over {quota}")

    for logical_id, r in rendered.items():
        props = r["Properties"]
        if r["Type"] == "AWS::Lambda::Function":
            variables = props.get("Environment", {}).get("Variables", {})
            limit(f"{logical_id} environment", len(compact(variables).encode()), LAMBDA_ENV_BYTES)
        elif r["Type"] == "AWS::IAM::ManagedPolicy":
            size = len(compact(props["PolicyDocument"]))
            limit(f"{logical_id} (managed policy)", size, IAM_MANAGED_POLICY_CHARS)
        elif r["Type"] == "AWS::IAM::Role":
            inline = sum(
                len(p["PolicyName"]) + len(compact(p["PolicyDocument"])) for p in props.get("Policies", [])
            )
            limit(f"{logical_id} inline policies", inline, IAM_ROLE_INLINE_CHARS)
            limit(f"{logical_id} trust policy", len(compact(props["AssumeRolePolicyDocument"])), IAM_TRUST_POLICY_CHARS)
            limit(f"{logical_id} managed policies", len(props.get("ManagedPolicyArns", [])), IAM_MANAGED_POLICIES_PER_ROLE)
        elif r["Type"] == "AWS::Events::Rule" and "EventPattern" in props:
            limit(f"{logical_id} event pattern", len(compact(props["EventPattern"])), EVENT_PATTERN_CHARS)
    print(f"{case}, the largest of each kind:")
    for what, size, quota in largest.values():
        print(f"  {what}: {size}/{quota}")
    return failures


def wildcard(pattern, value):
    """IAM's resource match: * any characters (':' too), ? one."""
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value) is not None


def event_matches(pattern, event):
    """EventBridge's match, for what rule patterns here use: nested objects, lists of exact
    values, {"prefix": ...} and {"anything-but": [...]}."""
    for key, want in pattern.items():
        got = event.get(key)
        if isinstance(want, dict):
            if not isinstance(got, dict) or not event_matches(want, got):
                return False
            continue

        def one(option):
            if isinstance(option, dict):
                if "prefix" in option:
                    return isinstance(got, str) and got.startswith(option["prefix"])
                if "anything-but" in option:
                    excluded = option["anything-but"]
                    excluded = excluded if isinstance(excluded, list) else [excluded]
                    return got is not None and got not in excluded
                raise CheckError(f"event pattern operator {option} is not emulated")
            return got == option

        if not any(one(o) for o in want):
            return False
    return True


def generated_id(arn, rendered, kind):
    """The logical id of the resource of `kind` whose generated physical name `arn` ends in
    (Stack.generated: "<stack>-<logical id>-<random>")."""
    for logical_id, r in rendered.items():
        if r["Type"] == kind and f"-{logical_id}-" in arn:
            return logical_id
    raise CheckError(f"no {kind} named in {arn}")


def role_allows(rendered, role_id, action, resource):
    """Whether the role allows `action` on `resource`: the Allow statements of its inline and
    managed policies (this stack writes no Deny), matched as IAM matches them."""
    role = rendered[role_id]["Properties"]
    documents = [p["PolicyDocument"] for p in role.get("Policies", [])]
    for arn in role.get("ManagedPolicyArns", []):
        if arn.startswith("arn:aws:iam::aws:"):
            continue
        documents.append(rendered[generated_id(arn, rendered, "AWS::IAM::ManagedPolicy")]["Properties"]["PolicyDocument"])
    listed = lambda v: [v] if isinstance(v, (str, dict)) else v
    return any(
        st.get("Effect") == "Allow"
        and any(wildcard(a, action) for a in listed(st.get("Action", [])))
        and any(wildcard(r, resource) for r in listed(st.get("Resource", [])))
        for document in documents
        for st in listed(document.get("Statement", []))
    )


def allowed(rendered, function_id, action, resource):
    """Whether the role of the function `function_id` allows `action` on `resource`."""
    role_arn = rendered[function_id]["Properties"]["Role"]
    return role_allows(rendered, generated_id(role_arn, rendered, "AWS::IAM::Role"), action, resource)


def setting_matches(value, arn):
    """A function's ARN-pattern setting (exact ARNs, or prefixes ending in *) covers `arn`."""
    for entry in (e.strip() for e in value.split(",")):
        if entry and (arn.startswith(entry[:-1]) if entry.endswith("*") else arn == entry):
            return True
    return False


def check_prefixes(template, root):
    parameters = template.get("Parameters", {})
    for name in ("ProtectedStateMachinePrefix", "WorkStateMachinePrefix", "WorkFunctionPrefix"):
        if name not in parameters:
            raise CheckError(f"no parameter {name}")
    stack_name = "stack"
    base = {n: str(s["Default"]) for n, s in parameters.items() if "Default" in s}
    functions = {"acquire": "AcquireFunction", "release": "ReleaseFunction",
                 "cleanup": "CleanupFunction", "sweeper": "SweeperFunction"}
    failures = []
    longest = {n: longest_value(n, parameters[n]) for n in parameters}
    shown = 0
    for label, value in (("empty", ""), ("short", "team-"), ("longest", None), ('"*"', "*")):
        values = dict(base)
        for name in ("ProtectedStateMachinePrefix", "WorkStateMachinePrefix", "WorkFunctionPrefix"):
            values[name] = longest[name] if value is None else value
        _, rendered = render(template, values, stack_name, partition="aws", region="us-east-1")
        machine = lambda n: f"arn:aws:states:us-east-1:{ACCOUNT}:stateMachine:{n}"
        execution = lambda n: f"arn:aws:states:us-east-1:{ACCOUNT}:execution:{n}:run-1"
        function = lambda n: f"arn:aws:lambda:us-east-1:{ACCOUNT}:function:{n}"
        rules = [r for r in rendered.values() if r["Type"] == "AWS::Events::Rule"
                 and "EventPattern" in r["Properties"]
                 and "aws.states" in r["Properties"]["EventPattern"].get("source", [])]
        if len(rules) != 1:
            raise CheckError(f"expected one status-change rule, found {len(rules)}")
        rule = rules[0]["Properties"]["EventPattern"]

        def cases(prefix_name, own):
            """(machine name, should it be covered) for this prefix value."""
            prefix = values[prefix_name]
            out = [(n, True) for n in own]
            if prefix == "*":
                out.append(("any-machine", True))
            elif prefix:
                out += [(prefix + "orders", True), (prefix, True), ("x" + prefix, False)]
            else:
                out.append(("team-orders", False))
            return out

        own = [f"{stack_name}-lock-protected", f"{stack_name}-your-workflow"]
        for name, covered in cases("ProtectedStateMachinePrefix", own):
            event = {"source": "aws.states", "detail-type": "Step Functions Execution Status Change",
                     "detail": {"status": "FAILED", "stateMachineArn": machine(name)}}
            seen = {"the cleanup rule": event_matches(rule, event)}
            for short, fid in functions.items():
                env = rendered[fid]["Properties"]["Environment"]["Variables"]
                seen[f"{short}'s PROTECTED_STATE_MACHINES"] = setting_matches(env["PROTECTED_STATE_MACHINES"], machine(name))
                seen[f"{short} may wake its waiters"] = allowed(rendered, fid, "states:SendTaskSuccess", machine(name))
                seen[f"{short} may describe its executions"] = allowed(rendered, fid, "states:DescribeExecution", execution(name))
            seen["cleanup may read its histories"] = allowed(rendered, "CleanupFunction", "states:GetExecutionHistory", execution(name))
            seen["sweeper may read its histories"] = allowed(rendered, "SweeperFunction", "states:GetExecutionHistory", execution(name))
            for what, got in seen.items():
                if got != covered:
                    failures.append(f"ProtectedStateMachinePrefix {label} ({values['ProtectedStateMachinePrefix']!r}): machine {name}: {what} is {got}, expected {covered}")
            shown += 1
        demo = [f"{stack_name}-demo-work"]
        env = rendered["AcquireFunction"]["Properties"]["Environment"]["Variables"]
        for name, covered in cases("WorkStateMachinePrefix", demo):
            seen = {
                "acquire's WORK_STATE_MACHINES": setting_matches(env["WORK_STATE_MACHINES"], machine(name)),
                "acquire may ask its type": allowed(rendered, "AcquireFunction", "states:DescribeStateMachine", machine(name)),
                "cleanup may stop its executions": allowed(rendered, "CleanupFunction", "states:StopExecution", execution(name)),
                "sweeper may describe its executions": allowed(rendered, "SweeperFunction", "states:DescribeExecution", execution(name)),
                "the lock-protected machine may start it": role_allows(rendered, "LockProtectedStateMachineRole", "states:StartExecution", machine(name)),
                "the lock-protected machine may stop its executions": role_allows(rendered, "LockProtectedStateMachineRole", "states:StopExecution", execution(name)),
            }
            for what, got in seen.items():
                if got != covered:
                    failures.append(f"WorkStateMachinePrefix {label} ({values['WorkStateMachinePrefix']!r}): machine {name}: {what} is {got}, expected {covered}")
            shown += 1
        for name, covered in cases("WorkFunctionPrefix", []):
            seen = {
                "acquire's WORK_FUNCTIONS": setting_matches(env["WORK_FUNCTIONS"], function(name)),
                "the work-function machine may invoke it": role_allows(rendered, "WorkFunctionStateMachineRole", "lambda:InvokeFunction", function(name)),
            }
            for what, got in seen.items():
                if got != covered:
                    failures.append(f"WorkFunctionPrefix {label} ({values['WorkFunctionPrefix']!r}): function {name}: {what} is {got}, expected {covered}")
            shown += 1
        print(f"prefixes {label}: the cleanup rule {compact(rule['detail']['stateMachineArn'])[:160]}")
    print(f"{shown} machines and functions checked against the rule, IAM and the settings")
    for f in failures:
        print("FAIL", f)
    return not failures


def check_pitr(template, root):
    values = {n: str(s["Default"]) for n, s in template.get("Parameters", {}).items() if "Default" in s}
    _, rendered = render(template, values, "s")
    settings = {
        logical_id: r["Properties"].get("PointInTimeRecoverySpecification")
        for logical_id, r in rendered.items()
        if r["Type"] == "AWS::DynamoDB::Table"
    }
    for logical_id, spec in settings.items():
        print(f"{logical_id}: {compact(spec) if spec else 'no PointInTimeRecoverySpecification (off)'}")
    distinct = {compact(s) if s else None for s in settings.values()}
    if len(distinct) > 1:
        print("FAIL the tables' point-in-time recovery differs: restoring one without the other "
              "breaks the count of waiters the lock item keeps")
        return False
    return True


def written_metrics(path=METRICS_SOURCE):
    """{(metric name, sorted dimension names)} the functions write, from their catalogue."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    found = set()
    literal = r'Metric\s*\{\s*name:\s*"(\w+)",\s*unit:\s*Unit::\w+,\s*dimensions:\s*&\[(.*?)\],?\s*\}'
    for name, sets in re.findall(literal, text, re.S):
        for dimension_set in re.findall(r"&\[(.*?)\]", sets):
            found.add((name, tuple(sorted(re.findall(r'"(\w+)"', dimension_set)))))
    if not found:
        raise CheckError(f"no Metric literal found in {path}: the catalogue's form changed")
    return found


def failure_functions(path=METRICS_SOURCE):
    """The values of the `Function` dimension of `Failures`: each function that writes it
    (`pub const <NAME>_FUNCTION: &str = "<value>";` in the catalogue's file)."""
    with open(path, encoding="utf-8") as f:
        found = re.findall(r'pub const \w+_FUNCTION: &str = "(\w+)";', f.read())
    if not found:
        raise CheckError(f"no pub const *_FUNCTION in {path}: the Failures functions' form changed")
    return set(found)


SEARCH = re.compile(r"""SEARCH\(\s*'\{([^}]*)\}\s*MetricName="([^"]+)"[^']*'""")


def plotted(body):
    """(widget title, namespace, metric name, sorted dimension names, dimension values) of
    every metric a dashboard body plots, SEARCH expressions included (their schema is the
    dimension set; no values)."""
    for widget in body.get("widgets", []):
        if widget.get("type") != "metric":
            continue
        props = widget.get("properties", {})
        title = props.get("title", "(untitled)")
        for entry in props.get("metrics", []):
            if not isinstance(entry, list) or not entry:
                raise CheckError(f"widget {title}: a metric {entry} is not an array")
            if isinstance(entry[0], dict):
                expression = entry[0].get("expression", "")
                for schema, name in SEARCH.findall(expression):
                    namespace, *dims = [part.strip().strip('"') for part in schema.split(",")]
                    yield title, namespace, name, tuple(sorted(dims)), None
                continue
            strings = [e for e in entry if isinstance(e, str)]
            if len(strings) < 2 or len(strings) % 2:
                raise CheckError(f"widget {title}: a metric {entry} is not [namespace, name, dimension, value, ...]")
            pairs = dict(zip(strings[2::2], strings[3::2]))
            yield title, strings[0], strings[1], tuple(sorted(pairs)), pairs


def check_dashboard(template, root):
    bound = stack_name_bound(template)
    parameters = template.get("Parameters", {})
    defaults = {n: str(s["Default"]) for n, s in parameters.items() if "Default" in s}
    longest = {name: longest_value(name, spec) for name, spec in parameters.items()}
    written = written_metrics()
    functions = failure_functions()
    failures = []
    for case, values in (("defaults", defaults), ("every parameter at its longest", longest)):
        _, rendered = render(template, values, "s" * bound)
        namespaces = {
            r["Properties"].get("Environment", {}).get("Variables", {}).get("METRIC_NAMESPACE")
            for r in rendered.values()
            if r["Type"] == "AWS::Lambda::Function"
        }
        if len(namespaces) != 1 or None in namespaces:
            failures.append(f"{case}: the functions' METRIC_NAMESPACE differ or are unset: {namespaces}")
            continue
        (namespace,) = namespaces
        dashboards = {k: r for k, r in rendered.items() if r["Type"] == "AWS::CloudWatch::Dashboard"}
        if not dashboards:
            failures.append(f"{case}: no AWS::CloudWatch::Dashboard")
        for logical_id, r in dashboards.items():
            text = r["Properties"]["DashboardBody"]
            try:
                body = json.loads(text)
            except (TypeError, json.JSONDecodeError) as e:
                failures.append(f"{case}: {logical_id}'s body is not JSON after substitution: {e}")
                continue
            if "${" in text:
                failures.append(f"{case}: {logical_id}'s body keeps an unsubstituted ${{...}}")
            widgets = body.get("widgets")
            if not isinstance(widgets, list):
                failures.append(f"{case}: {logical_id}'s body has no widgets array")
                continue
            counts = [len(w.get("properties", {}).get("metrics", [])) for w in widgets]
            print(
                f"{case}: {logical_id}: {len(text.encode())} bytes, {len(widgets)}/{DASHBOARD_WIDGETS} "
                f"widgets, {sum(counts)}/{DASHBOARD_METRICS} metrics, at most "
                f"{max(counts, default=0)}/{DASHBOARD_WIDGET_METRICS} in one widget"
            )
            if len(widgets) > DASHBOARD_WIDGETS or sum(counts) > DASHBOARD_METRICS:
                failures.append(f"{case}: {logical_id} has too many widgets or metrics")
            if max(counts, default=0) > DASHBOARD_WIDGET_METRICS:
                failures.append(f"{case}: a widget of {logical_id} plots more than {DASHBOARD_WIDGET_METRICS} metrics")
            if len(text.encode()) > TEMPLATE_BYTES:
                failures.append(f"{case}: {logical_id}'s body alone is over the template's {TEMPLATE_BYTES} bytes")
            seen = set()
            for title, ns, name, dims, values in plotted(body):
                if ns == namespace:
                    if (name, dims) not in written:
                        failures.append(
                            f"{case}: widget \"{title}\" plots {name} by {list(dims)}, which no function "
                            f"writes (crates/lambda-common/src/metrics.rs)"
                        )
                    seen.add((name, dims))
                elif not ns.startswith("AWS/"):
                    failures.append(f"{case}: widget \"{title}\" plots {name} in {ns}, not the functions' namespace {namespace}")
                elif values is not None and not all(values.values()):
                    failures.append(f"{case}: widget \"{title}\" plots {ns} {name} with an empty dimension value")
            for name, dims in sorted(written - seen):
                failures.append(f"{case}: {logical_id} does not plot {name} by {list(dims)}, which the functions write")
            # Every alarm of the stack on the alarm widget, so that a red one is seen there.
            shown = [a for w in widgets if w.get("type") == "alarm" for a in w.get("properties", {}).get("alarms", [])]
            alarms = [k for k, a in rendered.items() if a["Type"] == "AWS::CloudWatch::Alarm"]
            for alarm in alarms:
                if not any(f"-{alarm}-" in arn for arn in shown):
                    failures.append(f"{case}: {logical_id}'s alarm widgets do not show {alarm}")
            print(f"{case}: {logical_id}: {len(shown)} alarms on its alarm widgets, {len(alarms)} in the stack")
        # Each function that counts its failures has an alarm on them, and an alarm on one
        # names a function that writes it (an alarm on a Function value nobody writes never
        # fires, and a function without one fails unseen).
        watched = set()
        for logical_id, r in rendered.items():
            props = r["Properties"]
            if r["Type"] == "AWS::CloudWatch::Alarm" and props.get("Namespace") == namespace:
                dims = tuple(sorted(d["Name"] for d in props.get("Dimensions", [])))
                if (props.get("MetricName"), dims) not in written:
                    failures.append(f"{case}: {logical_id} watches {props.get('MetricName')} by {list(dims)}, which no function writes")
                function = {d["Name"]: d["Value"] for d in props.get("Dimensions", [])}.get("Function")
                if function is not None and function not in functions:
                    failures.append(f"{case}: {logical_id} watches Function {function!r}, which is none of the functions that write it {sorted(functions)}")
                if props.get("MetricName") == "Failures":
                    watched.add(function)
        for function in sorted(functions - watched):
            failures.append(f"{case}: no alarm watches Failures of the {function} function")
    print(f"{len(written)} metrics written (name and dimensions) in {os.path.relpath(METRICS_SOURCE, root)}; Failures by {sorted(functions)}")
    for f in failures:
        print("FAIL", f)
    return not failures


def policies(rendered):
    """(where, document) of every identity policy the stack creates."""
    for logical_id, r in rendered.items():
        props = r["Properties"]
        if r["Type"] == "AWS::IAM::ManagedPolicy":
            yield logical_id, props["PolicyDocument"]
        elif r["Type"] == "AWS::IAM::Role":
            for p in props.get("Policies", []):
                yield f"{logical_id}/{p['PolicyName']}", p["PolicyDocument"]


def actions(document):
    statements = document.get("Statement", [])
    if isinstance(statements, dict):
        statements = [statements]
    found = set()
    for statement in statements:
        action = statement.get("Action", [])
        found.update([action] if isinstance(action, str) else action)
    return found


def subject(finding, document):
    """The actions a finding is about: those its detail names, else the document's."""
    if isinstance(finding.detail, list) and all(isinstance(d, dict) and "action" in d for d in finding.detail):
        return {d["action"] for d in finding.detail}
    return actions(document)


def check_iam(template, root):
    from parliament import analyze_policy_string

    parameters = template.get("Parameters", {})
    values = {n: str(s["Default"]) for n, s in parameters.items() if "Default" in s}
    # Every prefix given, so that every conditional statement is linted.
    for name in prefix_parameters(template):
        values[name] = "team-"
    _, rendered = render(template, values, "stack", partition="aws", region="us-east-1")
    with open(EXCEPTIONS, encoding="utf-8") as f:
        exceptions = json.load(f)["exceptions"]
    used = set()
    accepted = {}
    new = []
    count = 0
    for where, document in policies(rendered):
        count += 1
        policy = analyze_policy_string(json.dumps(document))
        for finding in policy.findings:
            detail = compact(finding.detail) if not isinstance(finding.detail, str) else finding.detail
            hit = [
                i
                for i, e in enumerate(exceptions)
                if re.fullmatch(e["policy"], where)
                and e["issue"] == finding.issue
                and re.search(e["detail"], detail)
                and subject(finding, document) <= set(e.get("only_actions", subject(finding, document)))
            ]
            if hit:
                used.update(hit)
                accepted[hit[0]] = accepted.get(hit[0], 0) + 1
            else:
                new.append(f"{where}: {finding.issue} {detail}")
    stale = [e for i, e in enumerate(exceptions) if i not in used]
    print(f"{count} policies linted")
    for i, n in sorted(accepted.items()):
        e = exceptions[i]
        print(f"accepted {n} x {e['issue']} {e['detail'] or ''} ({e['source']})")
    for n in new:
        print("FAIL new finding:", n)
    for e in stale:
        print("FAIL exception no longer found (remove it):", compact(e))
    return not new and not stale


# ---------------------------------------------------------- what the docs say


# The documents that state facts about the template, and what they count by name.
DOCUMENTS = (
    "README.md",
    "docs/operations.md",
    "docs/using.md",
    "docs/aws-limits.md",
    "docs/design.md",
    "docs/security.md",
    "examples/README.md",
    "examples/consumer/README.md",
)
NUMBER_WORDS = "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen".split()
# "<number> <thing>" claims and what each counts. "the other two alarms" names a subset, not a
# count of the template's.
COUNT_CLAIMS = (
    (r"\b(\w+) machines (?:are named|have fixed names)", "machines with fixed names"),
    (r"\bthe (\w+) fixed machine names", "machines with fixed names"),
    (r"(?<!other )\b(\w+) (?:CloudWatch )?alarms\b", "alarms"),
    (r"\b(\w+) (?:DynamoDB )?tables?\b", "tables"),
    (r"\b(\w+) state machines\b", "state machines"),
    (r"\bparliament on the (\w+) policies", "policies"),
)
DYNAMODB_TABLE_COLUMNS = {"semaphore table": "SemaphoreTable", "queue table": "QueueTable", "holdings table": "HoldingsTable"}


def as_number(word):
    word = word.lower().replace(",", "")
    if word.isdigit():
        return int(word)
    return NUMBER_WORDS.index(word) if word in NUMBER_WORDS else None


def markdown_tables(text):
    """Every table of a Markdown text: (the heading above it, header cells, rows of cells)."""
    heading, tables, current = "", [], None
    for line in text.splitlines():
        if line.startswith("#"):
            heading = line.lstrip("#").strip()
        if line.startswith("|"):
            cells = [c.strip() for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
            if current is None:
                current = (heading, cells, [])
                tables.append(current)
            elif not all(re.fullmatch(r":?-+:?", c) for c in cells):
                current[2].append(cells)
        else:
            current = None
    return tables


def table_under(text, heading, where, failures):
    """The rows of the first table under a heading; none (and a failure) if it has none."""
    found = [t for t in markdown_tables(text) if t[0] == heading]
    if not found:
        failures.append(f"{where}: no table under the heading \"{heading}\"")
        return []
    return found[0][2]


def ticked(cell):
    return re.findall(r"`([^`]+)`", cell)


def fixed_machine_suffixes(template):
    """The machines named <stack name>-<suffix>: their suffixes."""
    found = []
    for r in template["Resources"].values():
        if r["Type"] in ("AWS::Serverless::StateMachine", "AWS::StepFunctions::StateMachine"):
            name = r.get("Properties", {}).get("Name") or r.get("Properties", {}).get("StateMachineName")
            text = name.get("Fn::Sub") if isinstance(name, dict) else None
            if isinstance(text, str) and text.startswith("${AWS::StackName}-"):
                found.append(text[len("${AWS::StackName}") :])
    return sorted(found)


def dynamodb_actions(rendered):
    """{function logical id: {table logical id: sorted actions}} as the functions' roles allow."""
    tables = [lid for lid, r in rendered.items() if r["Type"] == "AWS::DynamoDB::Table"]
    managed = {}
    for lid, r in rendered.items():
        if r["Type"] == "AWS::IAM::ManagedPolicy":
            managed[lid] = r["Properties"]["PolicyDocument"]
    roles = {lid: r for lid, r in rendered.items() if r["Type"] == "AWS::IAM::Role"}
    out = {}
    for lid, r in rendered.items():
        if r["Type"] != "AWS::Lambda::Function":
            continue
        # Physical names are "<stack>-<logical id>-<random>" (Stack.generated).
        role_id = next(k for k in roles if f"-{k}-" in r["Properties"]["Role"])
        documents = [p["PolicyDocument"] for p in roles[role_id]["Properties"].get("Policies", [])]
        for arn in roles[role_id]["Properties"].get("ManagedPolicyArns", []):
            documents += [doc for k, doc in managed.items() if f"-{k}-" in arn]
        allowed = {t: set() for t in tables}
        for document in documents:
            statements = document.get("Statement", [])
            for statement in [statements] if isinstance(statements, dict) else statements:
                if statement.get("Effect") != "Allow":
                    continue
                action = statement.get("Action", [])
                names = [a for a in ([action] if isinstance(action, str) else action) if a.startswith("dynamodb:")]
                resource = statement.get("Resource", [])
                for arn in [resource] if isinstance(resource, str) else resource:
                    for t in tables:
                        if re.search(rf":table/[^/]*-{t}-[A-Z]+(/index/.*)?$", arn):
                            allowed[t].update(a.split(":", 1)[1] for a in names)
        out[lid] = {t: sorted(a) for t, a in allowed.items()}
    return out


def check_docs(template, root):
    """The counts and names the docs quote are the template's."""
    parameters = template.get("Parameters", {})
    defaults = {n: str(s.get("Default", "")) for n, s in parameters.items()}
    resources = template["Resources"]
    alarms = sorted(k for k, r in resources.items() if r["Type"] == "AWS::CloudWatch::Alarm")
    fixed = fixed_machine_suffixes(template)
    exports = {
        k: o["Export"]["Name"].get("Fn::Sub") if isinstance(o["Export"]["Name"], dict) else o["Export"]["Name"]
        for k, o in template.get("Outputs", {}).items()
        if "Export" in o
    }
    ssm = sorted(
        r["Properties"]["Name"]["Fn::Sub"].rsplit("/", 1)[-1]
        for r in resources.values()
        if r["Type"] == "AWS::SSM::Parameter"
    )
    _, rendered = render(template, defaults, "stack", partition="aws", region="us-east-1")
    counts = {
        "machines with fixed names": len(fixed),
        "alarms": len(alarms),
        "tables": sum(r["Type"] == "AWS::DynamoDB::Table" for r in resources.values()),
        "state machines": sum(r["Type"] == "AWS::StepFunctions::StateMachine" for r in rendered.values()),
        "policies": len(list(policies(render(template, {**defaults, **{n: "team-" for n in prefix_parameters(template)}}, "stack", partition="aws", region="us-east-1")[1]))),
    }
    print(f"the template: {counts}; fixed names {fixed}; alarms {alarms}; exports {sorted(exports)}; SSM {ssm}")
    failures = []
    texts = {}
    for path in DOCUMENTS:
        with open(os.path.join(root, path), encoding="utf-8") as f:
            texts[path] = f.read()
    texts["template.yaml Description"] = str(template.get("Description", ""))

    # "<number> <thing>": the template's count.
    claims = 0
    for where, text in texts.items():
        flat = " ".join(text.split())
        for pattern, what in COUNT_CLAIMS:
            for m in re.finditer(pattern, flat, re.I):
                n = as_number(m.group(1))
                if n is None:
                    continue
                claims += 1
                if n != counts[what]:
                    failures.append(f"{where}: \"{m.group(0)}\" but the template has {counts[what]} {what}")
        # A list of the fixed names is the template's.
        for paragraph in re.split(r"\n\s*\n", text):
            if re.search(r"fixed machine names|machines (?:are named|have fixed names)", " ".join(paragraph.split())):
                listed = sorted({s for s in ticked(paragraph) if re.fullmatch(r"-[a-z-]+", s)})
                if listed and listed != fixed:
                    failures.append(f"{where}: lists the fixed machine names {listed}, the template's are {fixed}")
    print(f"{claims} counts checked in {', '.join(texts)}")

    operations = texts["docs/operations.md"]
    # The parameters and their defaults.
    rows = table_under(operations, "Parameters", "docs/operations.md", failures)
    documented = {}
    for row in rows:
        name = ticked(row[0])[0]
        default = row[1].strip()
        documented[name] = "" if default == "empty" else (ticked(default)[0] if ticked(default) else default).replace(",", "")
    for name in sorted(set(defaults) | set(documented)):
        if name not in documented:
            failures.append(f"docs/operations.md, Parameters: {name} is not listed")
        elif name not in defaults:
            failures.append(f"docs/operations.md, Parameters: {name} is not a parameter of the template")
        elif documented[name] != defaults[name]:
            failures.append(f"docs/operations.md, Parameters: {name} defaults to {documented[name]!r}, the template's default is {defaults[name]!r}")
    print(f"{len(documented)} parameters documented, {len(defaults)} in the template")
    # samconfig.toml deploys the template's defaults.
    import tomllib

    with open(os.path.join(root, "samconfig.toml"), "rb") as f:
        overrides = tomllib.load(f).get("default", {}).get("deploy", {}).get("parameters", {}).get("parameter_overrides", [])
    for entry in [overrides] if isinstance(overrides, str) else overrides:
        key, _, value = entry.partition("=")
        value = value.strip('"')
        if key not in defaults:
            failures.append(f"samconfig.toml: parameter_overrides sets {key}, which the template does not have")
        elif value != defaults[key]:
            failures.append(f"samconfig.toml: parameter_overrides sets {key}={value}, the template's default is {defaults[key]!r}")
    # The exports and SSM parameters.
    rows = table_under(operations, "What the stack exports", "docs/operations.md", failures)
    listed_exports, listed_ssm = {}, []
    for row in rows:
        output = ticked(row[0])[0]
        for name in ticked(row[1]):
            listed_exports[output] = name.replace("<stack>", "${AWS::StackName}")
        listed_ssm += [s.rsplit("/", 1)[-1] for s in ticked(row[2]) if s.startswith("/stepfunctions-semaphore/")]
    if listed_exports != exports:
        failures.append(f"docs/operations.md, What the stack exports: exports {listed_exports}, the template's {exports}")
    if sorted(listed_ssm) != ssm:
        failures.append(f"docs/operations.md, What the stack exports: SSM parameters {sorted(listed_ssm)}, the template's {ssm}")
    # The alarms: the table, a runbook entry each, the README's table.
    rows = table_under(operations, "Alarms and notices", "docs/operations.md", failures)
    listed = sorted({n for row in rows for n in ticked(row[0]) if n.endswith("Alarm")})
    if listed != alarms:
        failures.append(f"docs/operations.md, Alarms and notices: lists {listed}, the template's alarms are {alarms}")
    # Missing data is a decision per alarm (breaching for a heartbeat, notBreaching for a count
    # written only when something happens), not CloudWatch's default.
    for alarm in alarms:
        if resources[alarm]["Properties"].get("TreatMissingData") not in ("breaching", "notBreaching", "ignore"):
            failures.append(f"{alarm}: no TreatMissingData (say what missing data means for it)")
    runbook = operations.split("\n## Runbook", 1)[-1]
    headings = " ".join(line for line in runbook.splitlines() if line.startswith("### "))
    for alarm in alarms:
        if not re.search(rf"\b{alarm}\b", headings):
            failures.append(f"docs/operations.md: no runbook entry (### heading under Runbook) for {alarm}")
    readme = [t for t in markdown_tables(texts["README.md"]) if t[1][:1] == ["alarm or notice"]]
    listed = sorted({n for t in readme for row in t[2] for n in ticked(row[0]) if n.endswith("Alarm")})
    if listed != alarms:
        failures.append(f"README.md, the alarm table: lists {listed}, the template's alarms are {alarms}")
    # What each function may do to each table.
    allowed = dynamodb_actions(rendered)
    wired = [t for t in markdown_tables(operations) if t[1] and t[1][0] == "function" and "semaphore table" in t[1]]
    if not wired:
        failures.append("docs/operations.md: no table of the functions' DynamoDB actions (header: function | semaphore table | ...)")
    else:
        _, header, rows = wired[0]
        for row in rows:
            function = f"{ticked(row[0])[0].capitalize()}Function"
            if function not in allowed:
                failures.append(f"docs/operations.md, DynamoDB actions: {row[0]} is not one of {sorted(allowed)}")
                continue
            for column, cell in zip(header[1:], row[1:]):
                table = DYNAMODB_TABLE_COLUMNS[column]
                said = sorted(ticked(cell))
                if said != allowed[function][table]:
                    failures.append(f"docs/operations.md, DynamoDB actions: {row[0]} on the {column}: {said}, the template allows {allowed[function][table]}")
        missing = sorted(set(allowed) - {f"{ticked(r[0])[0].capitalize()}Function" for r in rows})
        if missing:
            failures.append(f"docs/operations.md, DynamoDB actions: no row for {missing}")
    for f in failures:
        print("FAIL", f)
    return not failures


# ----------------------------------------------------------- the trust boundary

# The parameters that reach every machine or function of the account with "*", the one that
# acknowledges it, the one that opts into execution data in the logs, the acquire function's
# switch for unconfigured locks.
ACCOUNT_WIDE_PREFIXES = ("ProtectedStateMachinePrefix", "WorkStateMachinePrefix", "WorkFunctionPrefix")
ACKNOWLEDGEMENT = "AllowAccountWidePrefixes"
EXECUTION_DATA = "LogExecutionData"
REQUIRE_CONFIGURED = ("RequireConfiguredLocks", "AcquireFunction", "REQUIRE_CONFIGURED_LOCKS")


def refused_by_rules(template, values):
    """The AssertDescriptions of the template's Rules that `values` break (CloudFormation
    refuses such a deploy before it changes anything)."""
    stack = Stack(template, typed(template, values), "stack")
    refused = []
    for name, rule in template.get("Rules", {}).items():
        if "RuleCondition" in rule and not stack.truth(rule["RuleCondition"]):
            continue
        for assertion in rule.get("Assertions", []):
            if not stack.truth(assertion["Assert"]):
                refused.append(f"{name}: {' '.join(str(assertion.get('AssertDescription', '')).split())}")
    return refused


def check_trust(template, root):
    """A "*" prefix is refused unless acknowledged; no machine logs execution data unless asked;
    the acquire function gets the RequireConfiguredLocks switch."""
    parameters = template.get("Parameters", {})
    defaults = {n: str(s["Default"]) for n, s in parameters.items() if "Default" in s}
    failures = []
    for name in (*ACCOUNT_WIDE_PREFIXES, ACKNOWLEDGEMENT, EXECUTION_DATA, REQUIRE_CONFIGURED[0]):
        if name not in parameters:
            failures.append(f"no parameter {name}")
    if failures:
        for f in failures:
            print("FAIL", f)
        return False
    cases = [("the defaults", {}, False), ("every prefix team-", {p: "team-" for p in ACCOUNT_WIDE_PREFIXES}, False)]
    for p in ACCOUNT_WIDE_PREFIXES:
        cases.append((f'{p}="*"', {p: "*"}, True))
        cases.append((f'{p}="*", {ACKNOWLEDGEMENT}=true', {p: "*", ACKNOWLEDGEMENT: "true"}, False))
    for what, change, refuse in cases:
        refused = refused_by_rules(template, {**defaults, **change})
        print(f"{what}: {'refused (' + refused[0] + ')' if refused else 'accepted'}")
        if bool(refused) != refuse:
            failures.append(f"{what}: the Rules {'accept' if not refused else 'refuse'} it, expected {'refused' if refuse else 'accepted'}")
    function, variable = REQUIRE_CONFIGURED[1], REQUIRE_CONFIGURED[2]
    for value in ("false", "true"):
        values = {**defaults, EXECUTION_DATA: value, REQUIRE_CONFIGURED[0]: value}
        _, rendered = render(template, values, "stack", partition="aws", region="us-east-1")
        machines = {k: r for k, r in rendered.items() if r["Type"] == "AWS::StepFunctions::StateMachine"}
        logged = sorted(
            k for k, r in machines.items() if r["Properties"].get("LoggingConfiguration", {}).get("IncludeExecutionData") in (True, "true")
        )
        expected = sorted(machines) if value == "true" else []
        print(f"{EXECUTION_DATA}={value}: {len(logged)} of {len(machines)} machines log execution data")
        if logged != expected:
            failures.append(f"{EXECUTION_DATA}={value}: machines logging execution data {logged}, expected {expected}")
        got = rendered.get(function, {}).get("Properties", {}).get("Environment", {}).get("Variables", {}).get(variable)
        if got != value:
            failures.append(f"{REQUIRE_CONFIGURED[0]}={value}: {function}'s {variable} is {got!r}")
    for f in failures:
        print("FAIL", f)
    return not failures


def check_retain(template, root):
    """Every table keeps its data when CloudFormation would delete it: on a replacing update
    (UpdateReplacePolicy Retain; DynamoDB has no Snapshot) and on the stack's deletion."""
    failures = []
    for logical_id, r in template["Resources"].items():
        if r["Type"] != "AWS::DynamoDB::Table":
            continue
        replace, delete = r.get("UpdateReplacePolicy", "Delete"), r.get("DeletionPolicy", "Delete")
        print(f"{logical_id}: UpdateReplacePolicy {replace}, DeletionPolicy {delete}")
        if replace != "Retain":
            failures.append(f"{logical_id}: UpdateReplacePolicy {replace}: a replacing update would delete its holders, waiters and lock configurations")
        if delete not in ("Retain", "RetainExceptOnCreate"):
            failures.append(f"{logical_id}: DeletionPolicy {delete}: deleting the stack (or renaming the resource) would delete its data")
    for f in failures:
        print("FAIL", f)
    return not failures
# The AWS Serverless Application Repository's "List of Supported AWS Resources"
# (https://docs.aws.amazon.com/serverlessrepo/latest/devguide/list-supported-resources.html):
# `sam publish` of a template with any other type is refused ("... is not a supported Serverless
# Apps Repository Type"). Written from the AWS documentation's own source of that page,
# awsdocs/aws-serverlessrepo-developer-guide doc_source/list-supported-resources.md at its last
# update, commit 5e8664b of 2021-02-08 (the repository was archived in 2023), read 2026-12-07.
# The live page has grown since (it now begins AWS::AccessAnalyzer::Analyzer,
# AWS::AmazonMQ::Broker, ...); a type refused here may be supported now: read the page, and add
# the type with the date it was read.
SAR_SUPPORTED_TYPES = frozenset(
    """
    AWS::AccessAnalyzer::Analyzer AWS::ApiGateway::ApiKey AWS::ApiGateway::Authorizer
    AWS::ApiGateway::BasePathMapping AWS::ApiGateway::ClientCertificate
    AWS::ApiGateway::Deployment AWS::ApiGateway::DocumentationPart
    AWS::ApiGateway::DocumentationVersion AWS::ApiGateway::DomainName
    AWS::ApiGateway::GatewayResponse AWS::ApiGateway::Method AWS::ApiGateway::Model
    AWS::ApiGateway::RequestValidator AWS::ApiGateway::Resource AWS::ApiGateway::RestApi
    AWS::ApiGateway::Stage AWS::ApiGateway::UsagePlan AWS::ApiGateway::UsagePlanKey
    AWS::ApiGateway::VpcLink AWS::ApiGatewayV2::Api AWS::ApiGatewayV2::ApiMapping
    AWS::ApiGatewayV2::Authorizer AWS::ApiGatewayV2::Deployment AWS::ApiGatewayV2::DomainName
    AWS::ApiGatewayV2::Integration AWS::ApiGatewayV2::IntegrationResponse
    AWS::ApiGatewayV2::Model AWS::ApiGatewayV2::Route AWS::ApiGatewayV2::RouteResponse
    AWS::ApiGatewayV2::Stage AWS::AppSync::ApiKey AWS::AppSync::DataSource
    AWS::AppSync::GraphQLApi AWS::AppSync::GraphQLSchema AWS::AppSync::Resolver
    AWS::ApplicationAutoScaling::ScalableTarget AWS::ApplicationAutoScaling::ScalingPolicy
    AWS::Athena::NamedQuery AWS::CertificateManager::Certificate
    AWS::CloudFormation::CustomResource AWS::CloudFormation::Interface
    AWS::CloudFormation::Macro AWS::CloudFormation::WaitConditionHandle
    AWS::CloudFront::CloudFrontOriginAccessIdentity AWS::CloudFront::Distribution
    AWS::CloudFront::StreamingDistribution AWS::CloudTrail::Trail AWS::CloudWatch::Alarm
    AWS::CloudWatch::AnomalyDetector AWS::CloudWatch::Dashboard AWS::CloudWatch::InsightRule
    AWS::CodeBuild::Project AWS::CodeCommit::Repository AWS::CodePipeline::CustomActionType
    AWS::CodePipeline::Pipeline AWS::CodePipeline::Webhook AWS::Cognito::IdentityPool
    AWS::Cognito::IdentityPoolRoleAttachment AWS::Cognito::UserPool AWS::Cognito::UserPoolClient
    AWS::Cognito::UserPoolDomain AWS::Cognito::UserPoolGroup
    AWS::Cognito::UserPoolResourceServer AWS::Cognito::UserPoolUser
    AWS::Cognito::UserPoolUserToGroupAttachment AWS::Config::AggregationAuthorization
    AWS::Config::ConfigRule AWS::Config::ConfigurationAggregator
    AWS::Config::ConfigurationRecorder AWS::Config::DeliveryChannel
    AWS::Config::RemediationConfiguration AWS::DataPipeline::Pipeline AWS::DynamoDB::Table
    AWS::EC2::SecurityGroup AWS::EC2::SecurityGroupEgress AWS::EC2::SecurityGroupIngress
    AWS::ECR::Repository AWS::Elasticsearch::Domain AWS::EventSchemas::Discoverer
    AWS::EventSchemas::Registry AWS::EventSchemas::Schema AWS::Events::EventBusPolicy
    AWS::Events::Rule AWS::Glue::Classifier AWS::Glue::Connection AWS::Glue::Crawler
    AWS::Glue::Database AWS::Glue::DevEndpoint AWS::Glue::Job AWS::Glue::Partition
    AWS::Glue::Table AWS::Glue::Trigger AWS::IAM::Group AWS::IAM::InstanceProfile
    AWS::IAM::ManagedPolicy AWS::IAM::Policy AWS::IAM::Role AWS::IoT::Certificate
    AWS::IoT::Policy AWS::IoT::PolicyPrincipalAttachment AWS::IoT::Thing
    AWS::IoT::ThingPrincipalAttachment AWS::IoT::TopicRule AWS::KMS::Alias AWS::KMS::Key
    AWS::Kinesis::Stream AWS::Kinesis::StreamConsumer AWS::Kinesis::Streams
    AWS::KinesisAnalytics::Application AWS::KinesisAnalytics::ApplicationOutput
    AWS::KinesisFirehose::DeliveryStream AWS::Lambda::Alias AWS::Lambda::EventInvokeConfig
    AWS::Lambda::EventSourceMapping AWS::Lambda::Function AWS::Lambda::LayerVersion
    AWS::Lambda::LayerVersionPermission AWS::Lambda::Permission AWS::Lambda::Version
    AWS::Logs::Destination AWS::Logs::LogGroup AWS::Logs::LogStream AWS::Logs::MetricFilter
    AWS::Logs::SubscriptionFilter AWS::Route53::HealthCheck AWS::Route53::HostedZone
    AWS::Route53::RecordSet AWS::Route53::RecordSetGroup AWS::S3::Bucket AWS::S3::BucketPolicy
    AWS::SNS::Subscription AWS::SNS::Topic AWS::SNS::TopicPolicy AWS::SQS::Queue
    AWS::SQS::QueuePolicy AWS::SSM::Association AWS::SSM::Document
    AWS::SSM::MaintenanceWindowTask AWS::SSM::Parameter AWS::SSM::PatchBaseline
    AWS::SSM::ResourceDataSync AWS::Serverless::Api AWS::Serverless::Application
    AWS::Serverless::Function AWS::Serverless::HttpApi AWS::Serverless::LayerVersion
    AWS::Serverless::SimpleTable AWS::Serverless::StateMachine AWS::StepFunctions::Activity
    AWS::StepFunctions::StateMachine
    """.split()
)


def check_sar(template, root):
    """Every resource type of the template and of its translation (what CloudFormation
    creates) is one the Serverless Application Repository supports."""
    values = {n: str(s["Default"]) for n, s in template.get("Parameters", {}).items() if "Default" in s}
    translated = translate(template, values)
    ok = True
    for what, resources in (("template", template["Resources"]), ("translated template", translated["Resources"])):
        types = {}
        for logical_id, resource in resources.items():
            types.setdefault(resource["Type"], []).append(logical_id)
        refused = sorted(t for t in types if t not in SAR_SUPPORTED_TYPES)
        for kind in refused:
            print(f"FAIL {what}: {kind} ({', '.join(types[kind])}) is not on the Serverless Application Repository's list of supported resources")
        print(f"{what}: {len(resources)} resources of {len(types)} types, {len(types) - len(refused)} on the list")
        ok = ok and not refused
    return ok


def run(check, template, root):
    try:
        return CHECKS[check](template, root)
    except CheckError as e:
        print("FAIL", e)
        return False
    except InvalidDocumentException as e:
        print("FAIL the SAM translator refuses the template:", "; ".join(str(c) for c in e.causes))
        return False


def breakages(template):
    """(check, what, a copy of the template broken so that only that check must fail)."""

    def broken(change):
        t = copy.deepcopy(template)
        change(t)
        return t

    resources = template["Resources"]

    def long_machine_name(t):
        # The suffix the example machine had before issue 18: 87 characters at 65.
        t["Resources"]["YourWorkflowExampleStateMachine"]["Properties"]["Name"] = {
            "Fn::Sub": "${AWS::StackName}-your-workflow-example"
        }

    def queue_table_without_pitr(t):
        t["Resources"]["QueueTable"]["Properties"].pop("PointInTimeRecoverySpecification")

    def list_parameter(t):
        t["Parameters"]["ProtectedStateMachineArns"] = {
            "Type": "String",
            "Default": "",
            "MaxLength": 1000,
            "AllowedPattern": "^$|^arn:aws[a-z-]*:states:[a-z0-9-]+:[0-9]{12}:stateMachine:[A-Za-z0-9_-]{1,80}(,arn:aws[a-z-]*:states:[a-z0-9-]+:[0-9]{12}:stateMachine:[A-Za-z0-9_-]{1,80})*$",
        }

    def rule_without_prefix(t):
        detail = t["Resources"]["CleanupStateMachine"]["Properties"]["Events"]["LockProtectedExecutionEnded"]["Properties"]["Pattern"]["detail"]
        detail["stateMachineArn"] = [{"Ref": "LockProtectedStateMachine"}, {"Ref": "YourWorkflowExampleStateMachine"}]

    def dynamodb_read_on_a_machine(t):
        t["Resources"]["HandOffPolicy"]["Properties"]["PolicyDocument"]["Statement"].append(
            {"Effect": "Allow", "Action": "dynamodb:GetItem", "Resource": {"Ref": "LockProtectedStateMachine"}}
        )

    def seventh_fixed_name(t):
        machine = copy.deepcopy(t["Resources"]["DemoWorkStateMachine"])
        machine["Properties"]["Name"] = {"Fn::Sub": "${AWS::StackName}-more-work"}
        t["Resources"]["MoreWorkStateMachine"] = machine

    def max_wait_default(t):
        t["Parameters"]["MaxWaitSeconds"]["Default"] = 900

    def unlisted_alarm(t):
        t["Resources"]["ReclaimedSlotsAgainAlarm"] = copy.deepcopy(t["Resources"]["ReclaimedSlotsAlarm"])

    def failures_alarm_on(name, value):
        def change(t):
            t["Resources"]["AcquireFailuresAlarm"]["Properties"]["Dimensions"] = [{"Name": name, "Value": value}]

        return change

    def no_release_failures_alarm(t):
        t["Resources"].pop("ReleaseFailuresAlarm")
        sub = t["Resources"]["SemaphoreDashboard"]["Properties"]["DashboardBody"]
        sub["Fn::Sub"] = sub["Fn::Sub"].replace('"${ReleaseFailuresAlarm.Arn}",', "", 1)

    def missing_data_undecided(t):
        t["Resources"]["SweeperNotSucceedingAlarm"]["Properties"].pop("TreatMissingData")

    def queue_table_deleted_on_replace(t):
        t["Resources"]["QueueTable"]["UpdateReplacePolicy"] = "Delete"

    def release_queries_locks(t):
        statements = t["Resources"]["ReleaseFunction"]["Properties"]["Policies"][-1]["Statement"]
        statements[0]["Action"].append("dynamodb:Query")

    def star_unacknowledged(t):
        t.pop("Rules")

    def execution_data_always(t):
        t["Resources"]["SweeperStateMachine"]["Properties"]["Logging"]["IncludeExecutionData"] = True
    def unsupported_by_sar(t):
        t["Resources"]["UnsupportedInstance"] = {"Type": "AWS::EC2::Instance", "Properties": {"ImageId": "ami-12345678"}}

    def body_edit(old, new):
        def change(t):
            sub = t["Resources"]["SemaphoreDashboard"]["Properties"]["DashboardBody"]
            text = sub["Fn::Sub"]
            if old not in text:
                raise CheckError(f"selftest: the dashboard body has no {old!r} to break")
            sub["Fn::Sub"] = text.replace(old, new, 1)

        return change

    for check, what, change, needs in (
        ("dashboard", "the alarm widget without SweeperNotSucceedingAlarm", body_edit('"${SweeperNotSucceedingAlarm.Arn}",', ""), "SemaphoreDashboard"),
        ("dashboard", "a DashboardBody with an unclosed bracket", body_edit('"widgets": [', '"widgets": [['), "SemaphoreDashboard"),
        ("dashboard", "a widget plotting WaitTimes, which no function writes", body_edit('\\"WaitTime\\"', '\\"WaitTimes\\"'), "SemaphoreDashboard"),
        ("dashboard", "AcquireFailuresAlarm by FunctionName, a dimension Failures does not have", failures_alarm_on("FunctionName", "acquire"), "AcquireFailuresAlarm"),
        ("dashboard", "AcquireFailuresAlarm on Function acquires, which no function writes", failures_alarm_on("Function", "acquires"), "AcquireFailuresAlarm"),
        ("dashboard", "no alarm on the release function's Failures", no_release_failures_alarm, "ReleaseFailuresAlarm"),
        ("names", "-your-workflow-example as the example machine's suffix", long_machine_name, "YourWorkflowExampleStateMachine"),
        ("pitr", "QueueTable without point-in-time recovery", queue_table_without_pitr, "QueueTable"),
        ("retain", "QueueTable deleted on a replacing update", queue_table_deleted_on_replace, "QueueTable"),
        ("sizes", "a ProtectedStateMachineArns list parameter", list_parameter, None),
        ("prefixes", "a cleanup rule that ignores ProtectedStateMachinePrefix", rule_without_prefix, "CleanupStateMachine"),
        ("iam", "dynamodb:GetItem on a state machine ARN in HandOffPolicy", dynamodb_read_on_a_machine, "HandOffPolicy"),
        ("trust", "no Rules: a \"*\" prefix deploys unacknowledged", star_unacknowledged, None),
        ("trust", "the sweeper machine logging execution data whatever LogExecutionData says", execution_data_always, "SweeperStateMachine"),
        ("docs", "a seventh machine named <stack name>-<suffix>", seventh_fixed_name, "DemoWorkStateMachine"),
        ("docs", "MaxWaitSeconds defaulting to 900", max_wait_default, None),
        ("docs", "an alarm no doc lists", unlisted_alarm, "ReclaimedSlotsAlarm"),
        ("docs", "SweeperNotSucceedingAlarm without TreatMissingData", missing_data_undecided, "SweeperNotSucceedingAlarm"),
        ("docs", "dynamodb:Query on the semaphore table for the release function", release_queries_locks, "ReleaseFunction"),
        ("sar", "an AWS::EC2::Instance among the resources", unsupported_by_sar, None),
    ):
        if needs and needs not in resources:
            raise CheckError(f"selftest: the template has no {needs} to break")
        yield check, what, broken(change)


def check_selftest(template, root):
    """Each check fails on a template broken for it, and passes on the template itself."""
    import contextlib
    import io

    ok = True
    for check, what, broken in breakages(template):
        quiet = io.StringIO()
        with contextlib.redirect_stdout(quiet):
            passes_as_is = run(check, template, root)
            fails_broken = not run(check, broken, root)
        reason = next((line for line in quiet.getvalue().splitlines() if line.startswith("FAIL")), "")
        print(f"{check}: {'fails' if fails_broken else 'PASSES'} with {what}: {reason}")
        if not (passes_as_is and fails_broken):
            print(f"FAIL the {check} check cannot fail on {what} (or fails on the template itself)")
            ok = False
    return ok


CHECKS = {
    "names": check_names,
    "sizes": check_sizes,
    "prefixes": check_prefixes,
    "iam": check_iam,
    "pitr": check_pitr,
    "dashboard": check_dashboard,
    "docs": check_docs,
    "trust": check_trust,
    "retain": check_retain,
    "sar": check_sar,
    "selftest": check_selftest,
}


def main(argv):
    if len(argv) not in (2, 3) or argv[1] not in CHECKS:
        print(__doc__, file=sys.stderr)
        return 2
    path = argv[2] if len(argv) == 3 else "template.yaml"
    try:
        template = load(path)
    except (OSError, yaml.YAMLError) as e:
        print("FAIL cannot read", path, e)
        return 1
    return 0 if run(argv[1], template, os.path.dirname(os.path.abspath(path))) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
