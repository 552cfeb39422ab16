#!/usr/bin/env python3
"""Writes helm/hasten/values.schema.json from values.yaml, so that a wrong value fails at
`helm install` (Helm validates values against the chart's schema) and not in a pod.

Every key of values.yaml is a property of its type (booleans, numbers, strings, lists,
tables); a misspelt key is refused (`additionalProperties: false`) except in the tables that
are Kubernetes' own or free-form (resources, security contexts, selectors, annotations,
labels, affinity). The binaries' `config` tables get the binaries' own configuration schemas,
generated from their Rust types (`make config-schemas` writes docs/config-schemas/ with each
binary's `--print-config-schema`; a test keeps them current): their enumerations, bounds,
nullable keys and unknown keys are checked by `helm install`, naming the key. A few chart
keys get enumerations or bounds. `--check` compares instead of writing.

    python3 scripts/gen-values-schema.py [--check]
"""

import argparse
import json
import pathlib
import sys

import yaml

CHART = pathlib.Path(__file__).resolve().parent.parent / "helm" / "hasten"

# Tables whose keys are not the chart's to know.
FREE_FORM = {
    "resources",
    "podSecurityContext",
    "containerSecurityContext",
    "nodeSelector",
    "affinity",
    "annotations",
    "labels",
    "podAnnotations",
    "podLabels",
    "serviceAccountAnnotations",
    "commonLabels",
    "podSelector",
    "updateStrategy",
    "startupProbe",
}
CONFIG_SCHEMAS = CHART.parent.parent / "docs" / "config-schemas"
# The values key of each binary's TOML keys, and its schema's file in CONFIG_SCHEMAS.
CONFIG_TABLES = {
    "controlPlane.config": "control-plane.json",
    "cloud.shard.config": "shard.json",
    "cloud.router.config": "router.json",
    "edge.config": "edge.json",
}
# Keywords of a binary's schema that Helm's validator does not need: the document's own
# header, and integer formats (`uint64`) that are no JSON Schema format.
DROPPED_KEYWORDS = {"$schema", "title", "format"}
ENUMS = {
    "edge.kind": ["Deployment", "DaemonSet"],
    "image.pullPolicy": ["Always", "IfNotPresent", "Never"],
    "logFormat": ["json", "text"],
    # Bucket bounds of hasten_edge_answer_first_token_seconds (GENERATION_BUCKETS) a goodput
    # objective can be read at.
    "monitoring.answerGoodput.ttftSeconds": [0.5, 1, 2, 3, 5, 7.5, 10, 15, 20, 30],
    "tls.mutual.certManager.issuerRef.kind": ["Issuer", "ClusterIssuer"],
}
COUNTS = {"replicas", "minReplicas", "maxReplicas", "shards", "replicasPerShard"}


def config_schema(file):
    """A binary's configuration schema, as the values schema embeds it."""

    def strip(node):
        if isinstance(node, dict):
            choices = node.get("oneOf", [])
            if choices and all("const" in choice for choice in choices):
                # An enumeration of documented variants: as `enum`, a refusal lists every
                # allowed value (with `oneOf`, Helm names only the first).
                node = {k: v for k, v in node.items() if k != "oneOf"}
                node["enum"] = [choice["const"] for choice in choices]
            return {k: strip(v) for k, v in node.items() if k not in DROPPED_KEYWORDS}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return strip(json.loads((CONFIG_SCHEMAS / file).read_text()))


def schema_of(value, path, key):
    if path in CONFIG_TABLES:
        return config_schema(CONFIG_TABLES[path])
    if key in FREE_FORM:
        return {"type": "object"}
    if isinstance(value, bool):
        return {"type": "boolean"}
    if isinstance(value, (int, float)):
        if key in COUNTS:
            return {"type": "integer", "minimum": 0}
        if path in ENUMS:
            return {"type": "number", "enum": ENUMS[path]}
        return {"type": "number"}
    if isinstance(value, str):
        node = {"type": "string"}
        if path in ENUMS:
            node["enum"] = ENUMS[path]
        return node
    if value is None:
        return {}
    if isinstance(value, list):
        node = {"type": "array"}
        scalars = [v for v in value if not isinstance(v, (dict, list))]
        if value and len(scalars) == len(value):
            node["items"] = schema_of(value[0], path + "[]", key)
        return node
    if isinstance(value, dict):
        node = {
            "type": "object",
            "properties": {k: schema_of(v, f"{path}.{k}" if path else k, k) for k, v in value.items()},
        }
        if value:
            node["additionalProperties"] = False
        return node
    raise TypeError(f"{path}: {type(value).__name__}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = {"$schema": "http://json-schema.org/draft-07/schema#", "title": "hasten values"}
    schema.update(schema_of(values, "", ""))
    text = json.dumps(schema, indent=2) + "\n"
    out = CHART / "values.schema.json"
    if args.check:
        if not out.exists() or out.read_text() != text:
            print(f"{out} is stale: run python3 scripts/gen-values-schema.py", file=sys.stderr)
            sys.exit(1)
        print(f"{out.name} matches values.yaml")
        return
    out.write_text(text)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
