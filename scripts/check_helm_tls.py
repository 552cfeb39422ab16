"""check-helm's mutual-TLS checks: the generated Secret, handshakes in memory for every
dialled name, the control-plane binary with the rendered configuration (the certificate
required, a rotation's extra CAs honoured), cert-manager's Certificate."""

import base64
import json
import os
import pathlib
import socket
import ssl
import subprocess
import tempfile
import time

from check_helm_common import WORKLOAD_KINDS, exit_on, fail, load_docs, rendered_tomls


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
            names.update(host(a) for a in config.get("control_plane", {}).get("nodes", []))
            names.add(config["cloud"]["server_name"])
    return sorted(names)


def memory_handshake(files, name, client_certificate=True, mutual=True):
    """A TLS handshake between two in-memory ends with the files: None, or why it failed.
    With `mutual` off the server asks no client certificate (the edges' QUIC to the router
    without mutual TLS)."""
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(files["tls.crt"], files["tls.key"])
    server_ctx.load_verify_locations(files["ca.crt"])
    server_ctx.verify_mode = ssl.CERT_REQUIRED if mutual else ssl.CERT_NONE
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


def mtls_files(rendered, outdir):
    pathlib.Path(outdir).mkdir(parents=True, exist_ok=True)
    files = generated_mtls(load_docs(rendered), outdir)
    print(f"wrote {', '.join(sorted(files))} into {outdir}")


def _claims(doc):
    volumes = doc["spec"]["template"]["spec"].get("volumes", [])
    return {v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v}


def _projected_secrets(doc):
    names = set()
    for volume in doc["spec"]["template"]["spec"].get("volumes", []):
        if "secret" in volume:
            names.add(volume["secret"]["secretName"])
        for source in volume.get("projected", {}).get("sources", []):
            if "secret" in source:
                names.add(source["secret"]["name"])
    return names


def corpus_update(blue_path, green_path, green_mtls_path, old_claim, new_claim, cloud_addr):
    """The chart README's "Update the corpus without downtime" as rendered: BLUE is the
    installed release upgraded to move its edges onto NEW_CLAIM and green's router
    (CLOUD_ADDR), its shards left on OLD_CLAIM; GREEN a cloud-only release over NEW_CLAIM
    serving blue's cloud certificate; GREEN_MTLS the same under mutual TLS with blue's router
    name on its certificate. Blue's edges must verify green's routers by the name they dial."""
    blue, green, green_mtls = load_docs(blue_path), load_docs(green_path), load_docs(green_mtls_path)
    errors = []

    def component(docs, name):
        return [d for d in docs if d["kind"] in WORKLOAD_KINDS
                and d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == name]

    edges = component(blue, "edge")
    if len(edges) != 1:
        fail(f"blue renders {len(edges)} edge workloads")
    edge = edges[0]
    if _claims(edge) != {new_claim}:
        errors.append(f"blue's edges mount {_claims(edge)}, not {new_claim}")
    for shard in component(blue, "shard"):
        if _claims(shard) != {old_claim}:
            errors.append(f"blue's {shard['metadata']['name']} mounts {_claims(shard)}, not {old_claim}")
    rolling = edge["spec"].get("strategy", {}).get("rollingUpdate", {})
    if rolling.get("maxUnavailable") != 0:
        errors.append(f"blue's edges roll with {rolling}: an old edge would stop before its successor is ready")
    edge_toml = next(c for (_, key), (_, c) in rendered_tomls(blue).items() if key == "edge.toml")
    if edge_toml["cloud"].get("addr") != cloud_addr:
        errors.append(f"blue's edge.toml cloud.addr is {edge_toml['cloud'].get('addr')!r}, not {cloud_addr}")
    server_name = edge_toml["cloud"]["server_name"]

    for docs, label in ((green, "green"), (green_mtls, "green (mutual TLS)")):
        extra = [d["metadata"]["name"] for d in docs if d["kind"] in (*WORKLOAD_KINDS, "Pod")
                 and d["metadata"].get("labels", {}).get("app.kubernetes.io/component") in ("edge", "control-plane", "test")]
        if extra:
            errors.append(f"{label} renders {extra}: it should hold the cloud tier only")
        for workload in component(docs, "router") + component(docs, "shard"):
            if workload["kind"] == "StatefulSet" and _claims(workload) != {new_claim}:
                errors.append(f"{label}'s {workload['metadata']['name']} mounts {_claims(workload)}")
        policy = next((d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"].endswith("-router")), None)
        sources = [peer for rule in (policy or {}).get("spec", {}).get("ingress", [])
                   if any(p.get("port") == 7100 for p in rule.get("ports", [])) for peer in rule.get("from", [])]
        edge_labels = edge["spec"]["template"]["metadata"]["labels"]
        if not any(all(edge_labels.get(k) == v for k, v in peer.get("podSelector", {}).get("matchLabels", {}).items())
                   and peer.get("podSelector", {}).get("matchLabels") for peer in sources):
            errors.append(f"{label}'s router policy admits no QUIC from blue's edges: {sources}")

    # Green (tls.cloud) serves the Secret blue generated, whose certificate names blue's router.
    blue_secret = next((d for d in blue if d["kind"] == "Secret" and d["metadata"]["labels"].get("app.kubernetes.io/component") == "cloud-tls"), None)
    if blue_secret is None:
        fail("blue renders no generated cloud TLS Secret")
    for router in component(green, "router"):
        if blue_secret["metadata"]["name"] not in _projected_secrets(router):
            errors.append(f"green's router does not serve {blue_secret['metadata']['name']}: {_projected_secrets(router)}")
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp)
        files = {}
        for key in ("ca.crt", "tls.crt", "tls.key"):
            (out / key).write_bytes(base64.b64decode(blue_secret["data"][key]))
            files[key] = str(out / key)
        why = memory_handshake(files, server_name, client_certificate=False, mutual=False)
        if why:
            errors.append(f"blue's edges would not verify green's router as {server_name}: {why}")
        mtls_dir = out / "mtls"
        mtls_dir.mkdir()
        mtls = generated_mtls(green_mtls, mtls_dir)
        why = memory_handshake(mtls, server_name)
        if why:
            errors.append(f"green's mutual-TLS certificate does not carry {server_name}: {why}")
        if memory_handshake(mtls, "hasten-elsewhere-router.hasten.svc") is None:
            errors.append("the handshake accepted a name outside green's certificate")
    exit_on(errors)
    print(f"blue's edges on {new_claim} dial {cloud_addr} as {server_name}, which green serves; blue's shards stay on {old_claim}")
