"""What the chart checks share (scripts/check-helm.py and its modules): failing with a
message, reading rendered manifests and the TOML files in their ConfigMaps."""

import sys


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def exit_on(errors):
    """Prints every error found and exits non-zero when there is one."""
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        sys.exit(1)


def load_docs(path):
    import yaml

    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def rendered_tomls(docs):
    """{(ConfigMap name, key): (text, parsed)} of every rendered `*.toml`."""
    import tomllib

    files = {}
    for doc in docs:
        if doc["kind"] == "ConfigMap":
            for key, text in (doc.get("data") or {}).items():
                if key.endswith(".toml"):
                    files[(doc["metadata"]["name"], key)] = (text, tomllib.loads(text))
    return files


def toml_strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for item in value:
            yield from toml_strings(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from toml_strings(item)


WORKLOAD_KINDS = ("Deployment", "StatefulSet", "DaemonSet")
