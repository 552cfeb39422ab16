#!/usr/bin/env python3
"""Writes docs/config-reference.md from the binaries' configuration schemas in
docs/config-schemas/ (each binary's `--print-config-schema`, written by
`make config-schemas` from the Rust config types; a test keeps them current), so that the
reference of every key, its type, default, allowed values and meaning is the code's. It
also fills the default column of each table in docs/configuration.md that follows a
`<!-- defaults: SCHEMA -->` marker, so the guide shows the types' defaults too and writes
none by hand. `--check` compares instead of writing.

    python3 scripts/gen-config-reference.py [--check]
"""

import argparse
import json
import re
import struct
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCHEMAS = ROOT / "docs" / "config-schemas"
OUT = ROOT / "docs" / "config-reference.md"
GUIDE = ROOT / "docs" / "configuration.md"
DEFAULTS_MARKER = re.compile(r"<!-- defaults: ([\w.-]+) -->")
# Schema file, the command it configures, its environment prefix.
BINARIES = [
    ("edge.json", "edge-node serve", "HASTEN_EDGE_"),
    ("shard.json", "cloud-index serve", "HASTEN_CLOUD_"),
    ("router.json", "cloud-index route", "HASTEN_ROUTER_"),
    ("control-plane.json", "control-plane", "HASTEN_CP_"),
    ("kv-worker.json", "kv-worker serve", "HASTEN_KV_"),
    ("lm-worker.json", "lm-worker serve", "HASTEN_WORKER_"),
    ("kv-operator.json", "kv-operator run", "HASTEN_KV_OPERATOR_"),
    ("admin.json", "hasten-admin", "HASTEN_ADMIN_"),
]


def cell(text):
    return " ".join(str(text).split()).replace("|", "\\|")


def type_of(node):
    if "enum" in node:
        return " \\| ".join(f"`{v}`" for v in node["enum"])
    if "oneOf" in node and all("const" in c for c in node["oneOf"]):
        return " \\| ".join(f"`{c['const']}`" for c in node["oneOf"])
    types = node.get("type", "")
    if isinstance(types, list):
        nullable = "null" in types
        types = [t for t in types if t != "null"]
        shown = "/".join(types) or "any"
        return f"{shown} (optional)" if nullable else shown
    if types == "array":
        return f"list of {type_of(node.get('items', {}))}"
    if not types and "anyOf" in node:
        parts = [type_of(c) for c in node["anyOf"] if c.get("type") != "null"]
        nullable = any(c.get("type") == "null" for c in node["anyOf"])
        shown = " or ".join(parts) or "any"
        return f"{shown} (optional)" if nullable else shown
    return types or "any"


def bounds_of(node):
    parts = []
    if "minimum" in node and not (node.get("type") == "integer" and node["minimum"] == 0):
        parts.append(f">= {node['minimum']}")
    if "exclusiveMinimum" in node:
        parts.append(f"> {node['exclusiveMinimum']}")
    if "maximum" in node:
        parts.append(f"<= {node['maximum']}")
    return ", ".join(parts)


def number(value, node):
    """A default as the type holds it: an f32's shortest decimal (0.9, not 0.8999999761581421)."""
    if isinstance(value, float) and node.get("format") == "float":
        single = struct.unpack("<f", struct.pack("<f", value))[0]
        for digits in range(1, 10):
            text = f"{value:.{digits}g}"
            if struct.unpack("<f", struct.pack("<f", float(text)))[0] == single:
                return text
    return json.dumps(value)


def shown_default(node):
    default = node.get("default")
    if default is None:
        return "unset"
    if isinstance(default, (int, float)) and not isinstance(default, bool):
        return f"`{number(default, node)}`"
    return f"`{json.dumps(default)}`"


def node_at(schema, path):
    """The schema of a dotted key, its default taken from its table's where it has none."""
    node = schema
    for part in path.split("."):
        table_default = node.get("default")
        node = node.get("properties", {}).get(part)
        if node is None:
            return None
        if "default" not in node and isinstance(table_default, dict) and part in table_default:
            node = {**node, "default": table_default[part]}
    return node


def guide_default(node):
    """A default as the guide's tables show it: numbers and booleans bare, text quoted."""
    default = node.get("default")
    if default is None:
        return "unset"
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, (int, float)):
        return number(default, node)
    if isinstance(default, str):
        return f"`{default}`"
    return f"`{json.dumps(default)}`"


def fill_guide(text):
    """docs/configuration.md with the default cell of every row of a marked table taken
    from the schema: the keys are the row's first cell's code spans (flags, `--x`, are
    skipped), their defaults joined as the keys are (`a` / `b`, or `a`, `b`)."""
    out = []
    schema = None
    schema_name = ""
    for line in text.split("\n"):
        marker = DEFAULTS_MARKER.search(line)
        if marker:
            schema_name = marker.group(1)
            schema = json.loads((SCHEMAS / schema_name).read_text())
        elif schema is not None and not line.startswith("|") and line.strip():
            schema = None
        if schema is not None and line.startswith("| `"):
            cells = line.split(" | ")
            keys = [k for k in re.findall(r"`([^`]+)`", cells[0]) if not k.startswith("--")]
            separator = " / " if " / " in cells[0] else ", "
            nodes = [node_at(schema, key) for key in keys]
            missing = [key for key, node in zip(keys, nodes) if node is None]
            if missing:
                sys.exit(f"{GUIDE.name}: {', '.join(missing)} is not a key of {schema_name}")
            cells[1] = separator.join(guide_default(node) for node in nodes)
            line = " | ".join(cells)
        out.append(line)
    return "\n".join(out)


def rows(schema, prefix=""):
    for key in schema.get("properties", {}):
        path = f"{prefix}{key}"
        node = node_at(schema, key)
        if node.get("type") == "object" and "properties" in node:
            yield from rows(node, f"{path}.")
            continue
        yield f"| `{path}` | {type_of(node)} | {shown_default(node)} | {bounds_of(node)} | {cell(node.get('description', ''))} |"


def render():
    out = [
        "# Configuration reference",
        "",
        "<!-- Generated by scripts/gen-config-reference.py from docs/config-schemas/ (the",
        "binaries' --print-config-schema); edit the Rust config types, then run",
        "`make config-schemas`. -->",
        "",
        "Every key of every binary's TOML file, as its Rust config type defines it. Each key can",
        "also be set by an environment variable (the binary's prefix, then the key in capitals;",
        "a double underscore descends into a table: `HASTEN_CLOUD_SERVER__MAX_IN_FLIGHT`) and",
        "some by a flag (`--help`); flags override the environment, which overrides the file.",
        "How the keys fit together: [configuration.md](configuration.md).",
        "",
    ]
    for file, command, prefix in BINARIES:
        schema = json.loads((SCHEMAS / file).read_text())
        out += [
            f"## `{command}`",
            "",
            f"`--config FILE`, environment `{prefix}*`.",
            "",
            "| key | type | default | bounds | meaning |",
            "|---|---|---|---|---|",
            *rows(schema),
            "",
        ]
    return "\n".join(out)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    outputs = [(OUT, render()), (GUIDE, fill_guide(GUIDE.read_text()))]
    if args.check:
        stale = [path for path, text in outputs if path.read_text() != text]
        for path in stale:
            print(f"{path} is stale: run make config-schemas", file=sys.stderr)
        if stale:
            sys.exit(1)
        print(f"{OUT.name} and {GUIDE.name}'s defaults match the configuration schemas")
        return
    for path, text in outputs:
        path.write_text(text)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
