#!/usr/bin/env python3
"""Writes the values table at the end of helm/hasten/README.md from values.yaml.

Every key documented with a `# --` comment (the comment runs until the key's line) becomes
a row: its dotted path, its default and the comment. Defaults are written as JSON; a list
or table longer than a short line reads `(see values.yaml)`. `--check` compares instead of
writing (scripts/check-helm.sh runs it).
"""

import json
import re
import sys
from pathlib import Path

import yaml

CHART = Path(__file__).resolve().parent.parent / "helm" / "hasten"
TABLE_HEADER = "| key | default | description |\n|---|---|---|\n"
LONGEST_INLINE_DEFAULT = 60
KEY_LINE = re.compile(r"^( *)([A-Za-z0-9_.-]+):(?:\s|$)")


def documented_keys(text):
    """[(dotted path, description)] in file order."""
    rows, path, comment, in_comment = [], [], [], False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("# --"):
            comment, in_comment = [stripped[4:].strip()], True
            continue
        if in_comment and stripped.startswith("#"):
            comment.append(stripped[1:].strip())
            continue
        in_comment = False
        match = KEY_LINE.match(line)
        if not match or stripped.startswith("-"):
            if stripped and not stripped.startswith("#"):
                comment = []
            continue
        depth = len(match.group(1)) // 2
        path = path[:depth] + [match.group(2)]
        if comment:
            rows.append((".".join(path), " ".join(c for c in comment if c)))
            comment = []
    return rows


def default_of(values, dotted):
    node = values
    for part in dotted.split("."):
        node = node[part]
    rendered = json.dumps(node, ensure_ascii=False)
    if isinstance(node, (dict, list)) and len(rendered) > LONGEST_INLINE_DEFAULT:
        return "(see values.yaml)"
    return rendered


def table(values_text):
    values = yaml.safe_load(values_text)
    lines = []
    for key, description in documented_keys(values_text):
        escaped = description.replace("|", "\\|")
        lines.append(f"| `{key}` | `{default_of(values, key)}` | {escaped} |")
    return TABLE_HEADER + "\n".join(lines) + "\n"


def main():
    check = "--check" in sys.argv[1:]
    readme_path = CHART / "README.md"
    readme = readme_path.read_text()
    start = readme.index(TABLE_HEADER)
    current = readme[start:]
    wanted = table((CHART / "values.yaml").read_text())
    if check:
        if current != wanted:
            print("the values table in helm/hasten/README.md is not what values.yaml documents; "
                  "run scripts/gen-values-table.py", file=sys.stderr)
            sys.exit(1)
        print(f"{wanted.count(chr(10)) - 2} values documented")
        return
    readme_path.write_text(readme[:start] + wanted)
    print(f"wrote the values table of {readme_path}")


if __name__ == "__main__":
    main()
