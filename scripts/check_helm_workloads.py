"""check-helm's checks of the rendered workloads: what their configurations name is
mounted, they roll when what they read changes, the KV workers' policy and the edges' wiring
to a pool agree with what the operator renders."""

import re

from check_helm_common import WORKLOAD_KINDS, exit_on, fail, load_docs, rendered_tomls, toml_strings


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
            if key == "edge.toml" and (tenants == "on") != ("tenants_file" in config.get("server", {})):
                errors.append(f"{where}: {key} {'lacks' if tenants == 'on' else 'sets'} server.tenants_file")
    if mutual == "on" and any(name.endswith("-cloud-tls") for name in secrets):
        errors.append("tls.cloud's Secret is rendered although mutual TLS supersedes it")
    exit_on(errors)
    if checked == 0:
        fail("no workload found")
    print(f"{checked} workloads: every /etc/hasten file their configs name is mounted; mutual TLS {mutual}, tenants {tenants}")


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


SERVING_CONTAINERS = {"edge", "router", "shard"}


def pre_stop(rendered_files):
    """Every serving container (edge, router, shard) keeps serving for a preStop sleep after
    its pod is marked terminating, and the pod's grace period outlasts that sleep."""
    errors = []
    checked = 0
    for path in rendered_files:
        for doc in load_docs(path):
            spec = doc.get("spec", {}).get("template", {}).get("spec", {})
            for container in spec.get("containers", []):
                if container["name"] not in SERVING_CONTAINERS:
                    continue
                checked += 1
                where = f"{path}: {doc['kind']} {doc['metadata']['name']} container {container['name']}"
                command = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
                if len(command) != 2 or command[0] != "sleep" or not command[1].isdigit() or int(command[1]) < 1:
                    errors.append(f"{where}: no preStop sleep ({command})")
                    continue
                grace = int(spec.get("terminationGracePeriodSeconds", 30))
                if int(command[1]) >= grace:
                    errors.append(f"{where}: preStop sleeps {command[1]} s of a {grace} s grace period")
    if checked == 0:
        errors.append("no serving containers rendered")
    exit_on(errors)
    print(f"{checked} serving containers sleep before SIGTERM, within their grace period")


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
    kv = edge.get("kv", {})
    fragment = fragment.get("kv", {})
    if "workers" not in kv:
        fail("the edges' configuration has no kv.workers")
    pools = {d["metadata"]["name"]: d for d in docs if d["kind"] == "KvWorkerPool"}
    name = next((n for n in pools if kv["workers"][0].startswith(f"{n}-0.")), None)
    if name is None:
        fail(f"the edges dial {kv['workers'][0]}, of no rendered pool ({sorted(pools)})")
    pool = pools[name]
    expected = [
        address.replace("wiki", name).replace(".rag.", f".{namespace}.")
        for address in fragment["workers"]
    ]
    # An autoscaled pool has no replicas of its own: the edges start with its minimum.
    scaler = next(
        (
            d
            for d in docs
            if d["kind"] == "HorizontalPodAutoscaler"
            and d["spec"]["scaleTargetRef"] == {"apiVersion": "hasten.dev/v1alpha1", "kind": "KvWorkerPool", "name": name}
        ),
        None,
    )
    replicas = scaler["spec"]["minReplicas"] if scaler else pool["spec"]["replicas"]
    expected = [expected[0].replace(f"{name}-0.", f"{name}-{i}.") for i in range(replicas)]
    errors = []
    if kv["workers"] != expected:
        errors.append(f"kv.workers {kv['workers']}, the operator's naming gives {expected}")
    fusion = pool["spec"].get("fusion", {})
    if kv.get("mode") != fusion.get("mode", "fusionrag"):
        errors.append(f"kv.mode {kv.get('mode')!r}, the pool's {fusion.get('mode')!r}")
    if abs(kv.get("recompute_ratio", -1) - fusion.get("recomputeRatio", 0.15)) > 1e-9:
        errors.append(f"kv.recompute_ratio {kv.get('recompute_ratio')}, the pool's {fusion.get('recomputeRatio')}")
    if edge.get("control_plane", {}).get("nodes") and kv.get("pool") != f"{namespace}/{name}":
        errors.append(f"kv.pool {kv.get('pool')!r}, expected {namespace}/{name} to follow the published assignment")
    exit_on(errors)
    print(f"the edges dial the {replicas} workers of pool {name} as the operator names them, {kv['mode']} at {kv['recompute_ratio']}, following {kv.get('pool')}")
