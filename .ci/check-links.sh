#!/usr/bin/env bash
# Checks every relative link of the tracked Markdown files (git ls-files '*.md'):
# each [text](target) and ![alt](target), and each reference definition "[label]: target",
# outside fenced code blocks and inline code. A target with a scheme (https:, mailto:, ...) is
# left alone. The rest must name a file or folder that exists, relative to the Markdown file
# (a leading / means the repository's root), after the #anchor and ?query are cut off. An
# anchor into a Markdown file (or a pure #anchor, into the file itself) must be one of that
# file's headings as GitHub slugs them: the heading's text, lowercased, punctuation other than
# '-' and '_' removed, each space a '-', and a repeated slug suffixed -1, -2, ...
#
#   bash .ci/check-links.sh        prints "file:line: target" for each broken link and exits 1,
#                                  else prints how many links it checked and exits 0
set -euo pipefail
cd "$(dirname "$0")/.."

git ls-files -z '*.md' | python3 -c '
import os, re, sys, urllib.parse

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})")
# [text](target "title") or ![alt](target); the text may hold one level of brackets.
LINK = re.compile(r"!?\[(?:[^\[\]\\]|\\.|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^\s()]+(?:\([^\s()]*\)[^\s()]*)*)(?:\s+(?:\"[^\"]*\"|\x27[^\x27]*\x27|\([^)]*\)))?\s*\)")
REFDEF = re.compile(r"^ {0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
ATX = re.compile(r"^ {0,3}(#{1,6})(?:\s+(.*?))?(?:\s+#+)?\s*$")
SETEXT = re.compile(r"^ {0,3}(=+|-+)\s*$")
HTML_ID = re.compile(r"<a\s[^>]*?(?:name|id)\s*=\s*[\"\x27]([^\"\x27]+)[\"\x27]", re.I)

def code_spans_blanked(line):
    """The line with each inline code span replaced by spaces (positions kept)."""
    out, i = [], 0
    for m in re.finditer(r"(`+)(.+?)(?<!`)\1(?!`)", line):
        out.append(line[i:m.start()])
        out.append(" " * (m.end() - m.start()))
        i = m.end()
    out.append(line[i:])
    return "".join(out)

def prose_lines(path):
    """(line number, text) of every line outside fenced code blocks."""
    fence = None
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            line = line.rstrip("\n")
            m = FENCE.match(line)
            if fence is None:
                if m:
                    fence = m.group(1)
                    continue
                yield number, line
            elif m and m.group(1)[0] == fence[0] and len(m.group(1)) >= len(fence) \
                    and line.strip() == m.group(1):
                fence = None

def heading_text(raw):
    """A heading as GitHub renders its text: links to their text, code and emphasis bare."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", raw)
    text = re.sub(r"<[^>]+>", "", text)
    return text.replace("`", "").replace("*", "")

def slug(text):
    text = heading_text(text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")

anchors_of = {}
def anchors(path):
    if path not in anchors_of:
        seen, found, previous = {}, set(), None
        for _, line in prose_lines(path):
            title = None
            m = ATX.match(line)
            if m and (m.group(2) or "").strip():
                title = m.group(2)
            elif SETEXT.match(line) and previous and previous.strip() and not ATX.match(previous):
                title = previous.strip()
            for html_id in HTML_ID.findall(line):
                found.add(html_id)
            previous = line
            if title is None:
                continue
            base = slug(title)
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        anchors_of[path] = found
    return anchors_of[path]

files = [p for p in sys.stdin.read().split("\0") if p]
checked, broken = 0, []
for md in files:
    if not os.path.isfile(md):
        continue
    for number, line in prose_lines(md):
        text = code_spans_blanked(line)
        targets = [m.group(1) for m in LINK.finditer(text)]
        m = REFDEF.match(text)
        if m:
            targets.append(m.group(1))
        for target in targets:
            target = target.strip("<>").strip()
            if not target or SCHEME.match(target):
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            path = urllib.parse.unquote(path.split("?", 1)[0])
            anchor = urllib.parse.unquote(anchor)
            if path:
                base = "." if path.startswith("/") else os.path.dirname(md)
                resolved = os.path.normpath(os.path.join(base, path.lstrip("/")))
                if not os.path.exists(resolved):
                    broken.append(f"{md}:{number}: {target}")
                    continue
            else:
                resolved = md
            if anchor and resolved.endswith(".md") and os.path.isfile(resolved) \
                    and anchor.lower() not in {a.lower() for a in anchors(resolved)}:
                broken.append(f"{md}:{number}: {target}")

for line in broken:
    print(line)
if broken:
    print(f"check-links: {len(broken)} broken of {checked} relative links in {len(files)} Markdown files")
    sys.exit(1)
print(f"check-links: {checked} relative links in {len(files)} Markdown files, all resolve")
'
