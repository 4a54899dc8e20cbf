#!/usr/bin/env python3
"""Check DefinitionSubstitutions of every AWS::Serverless::StateMachine.

For each state machine in a SAM template that loads its definition from a
local file (DefinitionUri), every ${Name} used in that file must be a key of
the machine's DefinitionSubstitutions, and every key must be used. A ${...}
left unsubstituted reaches Step Functions as literal text (an invalid ARN, a
wrong lock name); an unused key is a sign of a renamed placeholder.

Standard library only: the template is read with a small reader for the block
YAML that CloudFormation templates use (short-form tags such as !Ref are kept
as plain text, which is all this check needs).

Usage: check_substitutions.py [template.yaml]
Prints one PASS/FAIL line per state machine; exits 1 on any failure.
"""

import json
import os
import re
import sys

PLACEHOLDER = re.compile(r"\$\{([^}]*)\}")


class YamlSubsetError(Exception):
    pass


def _strip_comment(line):
    """Drops a trailing '# comment' that is outside quotes."""
    quote = None
    for i, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in ("'", '"'):
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
            return line[:i].rstrip()
    return line.rstrip()


def _logical_lines(text):
    """Yields (indent, content, lineno), skipping blanks, comments and block scalars."""
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        raw = lines[i]
        if "\t" in raw[: len(raw) - len(raw.lstrip())]:
            raise YamlSubsetError(f"line {i + 1}: tab in indentation")
        content = _strip_comment(raw)
        if not content.strip() or content.strip() in ("---", "..."):
            i += 1
            continue
        indent = len(content) - len(content.lstrip(" "))
        stripped = content.strip()
        yield indent, stripped, i + 1
        i += 1
        # A block scalar (key: >- / key: | / - >) swallows the more indented lines after it.
        if re.search(r"(^|:\s+|^-\s+)(![\w:]+\s+)?[>|][+-]?\d*$", stripped):
            while i < len(lines):
                nxt = lines[i]
                if nxt.strip() and (len(nxt) - len(nxt.lstrip(" "))) <= indent:
                    break
                i += 1


def _unquote(value):
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in ("'", '"'):
        return value[1:-1]
    return value


def _split_key(stripped):
    """Splits 'key: value' (key maybe quoted); returns None when not a mapping entry."""
    m = re.match(r"""^("[^"]*"|'[^']*')\s*:(?:\s+(.*))?$""", stripped)
    if m:
        return _unquote(m.group(1)), (m.group(2) or "").strip()
    if stripped[0] in "!&*{[|>'\"-?":
        return None
    # A plain key ends at the first ':' followed by a space or the end of the line.
    m = re.match(r"^(.+?):(?:\s+(.*))?$", stripped)
    if not m or re.search(r":\s", m.group(1)):
        return None
    return m.group(1).rstrip(), (m.group(2) or "").strip()


def parse_yaml_subset(text):
    """Parses block mappings and sequences; scalars and flow collections stay raw strings."""
    items = list(_logical_lines(text))
    pos = 0

    def parse_node(indent):
        nonlocal pos
        if pos >= len(items):
            return None
        ind, stripped, _ = items[pos]
        if ind < indent:
            return None
        if stripped.startswith("- ") or stripped == "-":
            return parse_seq(ind)
        return parse_map(ind)

    def parse_map(indent):
        nonlocal pos
        result = {}
        while pos < len(items):
            ind, stripped, lineno = items[pos]
            if ind < indent:
                break
            if ind > indent:
                raise YamlSubsetError(f"line {lineno}: unexpected indentation")
            kv = _split_key(stripped)
            if kv is None:
                raise YamlSubsetError(f"line {lineno}: expected 'key: value', got {stripped!r}")
            key, value = kv
            pos += 1
            if value and not re.fullmatch(r"[>|][+-]?\d*", value) and not re.fullmatch(r"![A-Za-z:]+", value):
                result[key] = _unquote(value)
            else:
                child = parse_node(indent + 1)
                if child is None and pos < len(items) and items[pos][0] == indent and items[pos][1].startswith("-"):
                    child = parse_seq(indent)  # a sequence may sit at its key's indentation
                result[key] = child if child is not None else _unquote(value)
        return result

    def parse_seq(indent):
        nonlocal pos
        result = []
        while pos < len(items):
            ind, stripped, lineno = items[pos]
            if ind < indent or not (stripped.startswith("- ") or stripped == "-"):
                break
            if ind > indent:
                raise YamlSubsetError(f"line {lineno}: unexpected indentation")
            rest = stripped[1:].strip()
            if not rest or re.fullmatch(r"![A-Za-z:]+", rest):
                # '-' or '- !Tag' alone: the item is the block below it (a tag is kept as
                # nothing more than that, as for a mapping's value).
                pos += 1
                child = parse_node(indent + 1)
                result.append(child if child is not None else rest)
            elif rest.startswith("- ") or rest == "-":
                # '- - item' opens a sequence whose items sit two columns further in.
                items[pos] = (indent + 2, rest, lineno)
                result.append(parse_seq(indent + 2))
            elif _split_key(rest) is not None and not rest.startswith(("!", "{", "[")):
                # '- key: value' opens a mapping whose keys sit two columns further in.
                items[pos] = (indent + 2, rest, lineno)
                result.append(parse_map(indent + 2))
            else:
                pos += 1
                result.append(_unquote(rest))
        return result

    doc = parse_node(0)
    if pos != len(items):
        raise YamlSubsetError(f"line {items[pos][2]}: could not parse")
    return doc


def check_template(template_path):
    base = os.path.dirname(os.path.abspath(template_path))
    with open(template_path, encoding="utf-8") as f:
        doc = parse_yaml_subset(f.read())
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
        if not isinstance(uri, str) or not uri or uri.startswith(("s3://", "!")):
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
    except (OSError, YamlSubsetError) as e:
        print(f"FAIL substitutions: cannot read {template}: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
