#!/usr/bin/env python3
"""A rehearsal of `helm install` without a cluster (scripts/check-helm.sh, check `install`).

Reads a rendered release (`helm template`), and runs every workload's pods as local
processes, the way a kubelet would: each pod gets a loopback address of its own
(127.0.0.N, so that every pod binds the ports its manifest names), its volumes become
directories (ConfigMaps, Secrets and projected volumes written from the rendered objects,
emptyDirs and claim templates empty, a named claim one directory that every pod mounting it
shares), its init containers run to completion before its containers start, and its containers run the manifest's command, args and environment with the built
binaries in place of the image. Service and pod DNS names in `host:port` form are mapped to
the pod addresses (a Service to its first pod), and every path under a volume mount to the
pod's directory. Pre-install hook Jobs run to completion first, as Helm runs them before the
release's other objects. Once every readiness probe answers 200, the `helm test` pod's
command runs against the release: its exit status is the rehearsal's.

    rehearse_install.py MANIFEST --work DIR (--bin DIR --model-dir DIR | --image IMAGE)
        [--container-cli "podman ..."] [--namespace hasten] [--cluster-domain cluster.local]
        [--drop-init NAME] [--drop-hook-jobs]

With `--image`, every container runs in that image instead (`podman run --network host`,
the work directory mounted at its own path, so the rewritten paths hold): the binaries and
the encoder are the image's (bench/image-rehearsal.sh). `--drop-init NAME` removes every
init container called NAME first, and `--drop-hook-jobs` every hook Job (the checks that the
rehearsal fails without the corpus bootstrap).

What is not rehearsed: the kubelet's gRPC/TCP probes (the chart's are HTTP),
NetworkPolicies, resource limits, the security context (in image mode the image's own user
runs every process), and Services balancing over more than one pod.
"""

import argparse
import base64
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import yaml

# Where the image keeps what the rehearsal takes from the host instead.
IMAGE_MODEL_DIR = "/opt/hasten/models/all-MiniLM-L6-v2"
READY_TIMEOUT_S = 300
INIT_TIMEOUT_S = 300
TEST_TIMEOUT_S = 180


class Pod:
    def __init__(self, name, kind, owner, spec, labels, ip, fqdns):
        self.name, self.kind, self.owner = name, kind, owner
        self.spec, self.labels, self.ip, self.fqdns = spec, labels, ip, fqdns
        self.processes = []
        self.containers = []
        self.failure = None


def pods_of(docs, namespace, domain):
    """Every pod the release's workloads would run, with its address and DNS names."""
    pods, n = [], 10
    for doc in docs:
        kind, meta = doc["kind"], doc["metadata"]
        if kind in ("Deployment", "StatefulSet"):
            template = doc["spec"]["template"]
            count = doc["spec"].get("replicas", 1)
        elif kind == "DaemonSet":
            template, count = doc["spec"]["template"], 1
        else:
            continue
        for i in range(count):
            name = f"{meta['name']}-{i}"
            fqdns = []
            if kind == "StatefulSet":
                service = doc["spec"]["serviceName"]
                fqdns = [f"{name}.{service}.{namespace}.svc.{domain}", f"{name}.{service}.{namespace}.svc",
                         f"{name}.{service}.{namespace}", f"{name}.{service}"]
            labels = template["metadata"].get("labels", {})
            pods.append(Pod(name, kind, meta["name"], template["spec"], labels, f"127.0.0.{n}", fqdns))
            n += 1
    return pods


def host_map(docs, pods, namespace, domain):
    """DNS name -> loopback address: pods of StatefulSets, and Services (their first pod)."""
    hosts = {}
    for pod in pods:
        for fqdn in pod.fqdns:
            hosts[fqdn] = pod.ip
    for doc in docs:
        if doc["kind"] != "Service":
            continue
        selector = doc["spec"].get("selector") or {}
        chosen = next((p for p in pods if selector and all(p.labels.get(k) == v for k, v in selector.items())), None)
        if chosen is None:
            continue
        name = doc["metadata"]["name"]
        for host in (f"{name}.{namespace}.svc.{domain}", f"{name}.{namespace}.svc", f"{name}.{namespace}", name):
            hosts[host] = chosen.ip
    return hosts


class Rewriter:
    """Rewrites a pod's text (configuration files, args, shell scripts): `host:port` names to
    addresses, binds on every interface to the pod's address, mounted paths to directories."""

    def __init__(self, pod, hosts, paths):
        self.pod = pod
        names = sorted(hosts, key=len, reverse=True)
        self.hosts = hosts
        self.host_re = re.compile(r"(?<![\w.-])(" + "|".join(map(re.escape, names)) + r")(?=:\d)") if names else None
        self.paths = paths
        # One pass, longest mount first, so that a replaced path is never replaced again.
        mounts = sorted(paths, key=len, reverse=True)
        self.path_re = re.compile("(" + "|".join(map(re.escape, mounts)) + r")(?=[/\"'\s]|$)", re.M)

    def __call__(self, text):
        if self.host_re:
            text = self.host_re.sub(lambda m: self.hosts[m.group(1)], text)
        text = re.sub(r"0\.0\.0\.0:(\d+)", rf"{self.pod.ip}:\1", text)
        text = re.sub(r"\[::\]:(\d+)", rf"{self.pod.ip}:\1", text)
        return self.path_re.sub(lambda m: self.paths[m.group(1)], text)


def objects_by_name(docs, kind):
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def volume_files(volume, config_maps, secrets):
    """{relative path: bytes} a ConfigMap, Secret or projected volume holds."""

    def from_config_map(name, items):
        data = config_maps[name].get("data") or {}
        keys = {i["key"]: i["path"] for i in items} if items else {k: k for k in data}
        return {path: data[key].encode() for key, path in keys.items()}

    def from_secret(name, items):
        secret = secrets[name]
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        data.update({k: v.encode() for k, v in (secret.get("stringData") or {}).items()})
        keys = {i["key"]: i["path"] for i in items} if items else {k: k for k in data}
        return {path: data[key] for key, path in keys.items()}

    files = {}
    if "configMap" in volume:
        files.update(from_config_map(volume["configMap"]["name"], volume["configMap"].get("items")))
    if "secret" in volume:
        files.update(from_secret(volume["secret"]["secretName"], volume["secret"].get("items")))
    for source in volume.get("projected", {}).get("sources", []):
        if "configMap" in source:
            files.update(from_config_map(source["configMap"]["name"], source["configMap"].get("items")))
        if "secret" in source:
            files.update(from_secret(source["secret"]["name"], source["secret"].get("items")))
    return files


def container_paths(pod_dir, container, volume_dirs, model_dir):
    """Mount path in the container -> local directory (the image's encoder -> `model_dir`
    when the binaries run outside the image)."""
    paths = {IMAGE_MODEL_DIR: model_dir} if model_dir else {}
    for mount in container.get("volumeMounts", []):
        local = volume_dirs[mount["name"]]
        if mount.get("subPath"):
            local = os.path.join(local, mount["subPath"])
        paths[mount["mountPath"]] = local
    return paths


def environment(container, pod, args, secrets, config_maps, rewrite):
    env = {"HOME": os.path.join(args.work, pod.name), "HOSTNAME": pod.name}
    if not args.image:
        env.update({"PATH": f"{args.bin}:/usr/bin:/bin", "HASTEN_MODEL_DIR": args.model_dir})
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = rewrite(str(var["value"]))
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            field = source["fieldRef"]["fieldPath"]
            env[var["name"]] = {"metadata.name": pod.name, "metadata.namespace": args.namespace,
                                "status.podIP": pod.ip, "spec.nodeName": "rehearsal"}[field]
        elif "secretKeyRef" in source:
            ref = source["secretKeyRef"]
            env[var["name"]] = base64.b64decode(secrets[ref["name"]]["data"][ref["key"]]).decode()
        elif "configMapKeyRef" in source:
            ref = source["configMapKeyRef"]
            env[var["name"]] = config_maps[ref["name"]]["data"][ref["key"]]
    return env


def container_name(pod, log_name):
    return re.sub(r"[^a-zA-Z0-9_.-]", "-", f"rehearsal-{pod.name}-{log_name}")


def start(pod, container, args, secrets, config_maps, rewrite, log_name):
    argv = [rewrite(a) for a in container.get("command", []) + container.get("args", [])]
    env = environment(container, pod, args, secrets, config_maps, rewrite)
    pod_dir = os.path.join(args.work, pod.name)
    log = open(os.path.join(pod_dir, f"{log_name}.log"), "wb")
    if args.image:
        name = container_name(pod, log_name)
        pod.containers.append(name)
        engine = shlex.split(args.container_cli)
        subprocess.run(engine + ["rm", "-f", name], capture_output=True)
        argv = (engine + ["run", "--rm", "--name", name, "--network", "host", "--hostname", pod.name,
                          "-v", f"{args.work}:{args.work}", "-w", pod_dir]
                + [f"--env={key}={value}" for key, value in env.items()] + [args.image] + argv)
        env = dict(os.environ)
    return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                            cwd=pod_dir, start_new_session=True)


def prepare(pod, args, hosts, config_maps, secrets):
    """Writes the pod's volumes; returns {container name: rewriter}."""
    pod_dir = os.path.join(args.work, pod.name)
    volume_dirs = {}
    for volume in pod.spec.get("volumes", []):
        local = os.path.join(pod_dir, "volumes", volume["name"])
        if "persistentVolumeClaim" in volume:
            local = os.path.join(args.work, "claims", volume["persistentVolumeClaim"]["claimName"])
        os.makedirs(local, exist_ok=True)
        volume_dirs[volume["name"]] = local
    owner_claims = pod.spec.get("_claims", [])
    for claim in owner_claims:
        local = os.path.join(pod_dir, "claims", claim)
        os.makedirs(local, exist_ok=True)
        volume_dirs[claim] = local
    containers = pod.spec.get("initContainers", []) + pod.spec["containers"]
    rewriters = {c["name"]: Rewriter(pod, hosts, container_paths(pod_dir, c, volume_dirs, args.model_dir))
                 for c in containers}
    main = rewriters[pod.spec["containers"][0]["name"]]
    for volume in pod.spec.get("volumes", []):
        for path, data in volume_files(volume, config_maps, secrets).items():
            target = os.path.join(volume_dirs[volume["name"]], path)
            os.makedirs(os.path.dirname(target), exist_ok=True)
            try:
                data = main(data.decode()).encode()
            except UnicodeDecodeError:
                pass
            with open(target, "wb") as f:
                f.write(data)
    if args.image:
        # The image's own (unprivileged) user runs every process: let it write the volumes.
        for root, dirs, files in os.walk(pod_dir):
            for name in dirs:
                os.chmod(os.path.join(root, name), 0o777)
            for name in files:
                os.chmod(os.path.join(root, name), 0o666)
        os.chmod(pod_dir, 0o777)
    return rewriters


def run_pod(pod, args, rewriters, secrets, config_maps):
    """Init containers one after another, then the containers (in a thread per pod)."""
    try:
        for init in pod.spec.get("initContainers", []):
            process = start(pod, init, args, secrets, config_maps, rewriters[init["name"]], f"init-{init['name']}")
            pod.processes.append(process)
            code = process.wait(timeout=INIT_TIMEOUT_S)
            if code != 0:
                pod.failure = f"init container {init['name']} exited {code}"
                return
        for container in pod.spec["containers"]:
            pod.processes.append(start(pod, container, args, secrets, config_maps, rewriters[container["name"]],
                                       container["name"]))
    except Exception as e:  # noqa: BLE001 - reported as the pod's failure
        pod.failure = f"{type(e).__name__}: {e}"


def probe_url(pod):
    container = pod.spec["containers"][0]
    probe = container.get("readinessProbe", {}).get("httpGet")
    if not probe:
        return None
    port = probe["port"]
    if isinstance(port, str):
        port = next(p["containerPort"] for p in container["ports"] if p["name"] == port)
    return f"http://{pod.ip}:{port}{probe.get('path', '/')}"


def ready(url):
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except Exception:  # noqa: BLE001 - not ready yet
        return False


def log_tail(pod, args, lines=15):
    out = []
    pod_dir = os.path.join(args.work, pod.name)
    for name in sorted(os.listdir(pod_dir)):
        if name.endswith(".log"):
            with open(os.path.join(pod_dir, name), errors="replace") as f:
                tail = f.read().splitlines()[-lines:]
            out.append(f"--- {pod.name}/{name}\n" + "\n".join(tail))
    return "\n".join(out)


def stop(pods, args):
    names = [name for pod in pods for name in pod.containers]
    if names:
        subprocess.run(shlex.split(args.container_cli) + ["rm", "--force", "--ignore", "--time", "0"] + names, capture_output=True)
    for pod in pods:
        for process in pod.processes:
            if process.poll() is None:
                try:
                    os.killpg(process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            process.wait()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("manifest")
    parser.add_argument("--bin")
    parser.add_argument("--model-dir")
    parser.add_argument("--image")
    parser.add_argument("--container-cli", default="podman")
    parser.add_argument("--work", required=True)
    parser.add_argument("--namespace", default="hasten")
    parser.add_argument("--cluster-domain", default="cluster.local")
    parser.add_argument("--drop-init", action="append", default=[])
    parser.add_argument("--drop-hook-jobs", action="store_true")
    args = parser.parse_args()
    if bool(args.image) == bool(args.bin and args.model_dir):
        parser.error("give either --image, or --bin and --model-dir")
    args.work = os.path.abspath(args.work)
    if not args.image:
        args.bin, args.model_dir = os.path.abspath(args.bin), os.path.abspath(args.model_dir)

    with open(args.manifest) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet", "DaemonSet")]
    for doc in workloads:
        spec = doc["spec"]["template"]["spec"]
        spec["initContainers"] = [c for c in spec.get("initContainers", []) if c["name"] not in args.drop_init]
        spec["_claims"] = [t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", [])]
    tests = [d for d in docs if d["kind"] == "Pod" and d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
    hook_jobs = [] if args.drop_hook_jobs else [
        d for d in docs
        if d["kind"] == "Job" and "pre-install" in d["metadata"].get("annotations", {}).get("helm.sh/hook", "")
    ]
    if not tests:
        sys.exit("the release renders no `helm test` pod")
    config_maps, secrets = objects_by_name(docs, "ConfigMap"), objects_by_name(docs, "Secret")
    pods = pods_of(docs, args.namespace, args.cluster_domain)
    hosts = host_map(docs, pods, args.namespace, args.cluster_domain)
    os.makedirs(args.work, exist_ok=True)

    started = time.monotonic()
    test_pods = []
    try:
        for job in hook_jobs:
            pod = Pod(job["metadata"]["name"], "Job", None, job["spec"]["template"]["spec"], {}, "127.0.0.8", [])
            test_pods.append(pod)
            rewriters = prepare(pod, args, hosts, config_maps, secrets)
            for container in pod.spec.get("initContainers", []) + pod.spec["containers"]:
                process = start(pod, container, args, secrets, config_maps, rewriters[container["name"]],
                                f"job-{container['name']}")
                pod.processes.append(process)
                code = process.wait(timeout=INIT_TIMEOUT_S)
                if code != 0:
                    print(f"hook job {pod.name} failed: {container['name']} exited {code}\n{log_tail(pod, args)}")
                    return 1
            print(f"hook job {pod.name} done after {time.monotonic() - started:.0f} s")
        threads = []
        for pod in pods:
            rewriters = prepare(pod, args, hosts, config_maps, secrets)
            thread = threading.Thread(target=run_pod, args=(pod, args, rewriters, secrets, config_maps))
            thread.start()
            threads.append(thread)
        waiting = {pod.name: probe_url(pod) for pod in pods}
        deadline = time.monotonic() + READY_TIMEOUT_S
        while waiting:
            for pod in pods:
                exited = [p for p in pod.processes if p.poll() not in (None, 0)]
                if pod.failure or (pod.name in waiting and exited):
                    reason = pod.failure or f"a container exited {exited[0].returncode}"
                    print(f"pod {pod.name} did not come up: {reason}\n{log_tail(pod, args)}")
                    return 1
                url = waiting.get(pod.name)
                if pod.name in waiting and (url is None or ready(url)):
                    del waiting[pod.name]
                    print(f"ready: {pod.name} ({pod.ip}) after {time.monotonic() - started:.0f} s")
            if time.monotonic() > deadline:
                print(f"not ready after {READY_TIMEOUT_S} s: {sorted(waiting)}")
                for pod in pods:
                    if pod.name in waiting:
                        print(log_tail(pod, args))
                return 1
            time.sleep(0.5)

        for test in tests:
            pod = Pod(test["metadata"]["name"], "Pod", None, test["spec"], {}, "127.0.0.9", [])
            test_pods.append(pod)
            rewriters = prepare(pod, args, hosts, config_maps, secrets)
            container = test["spec"]["containers"][0]
            process = start(pod, container, args, secrets, config_maps, rewriters[container["name"]], "test")
            pod.processes.append(process)
            code = process.wait(timeout=TEST_TIMEOUT_S)
            print(log_tail(pod, args, lines=8))
            if code != 0:
                print(f"helm test pod {pod.name} exited {code}")
                return 1
        print(f"the release came up ({len(pods)} pods) and its helm test passed, "
              f"{time.monotonic() - started:.0f} s")
        return 0
    finally:
        stop(pods + test_pods, args)


if __name__ == "__main__":
    sys.exit(main())
