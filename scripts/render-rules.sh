#!/usr/bin/env bash
# Renders the chart's Prometheus rules for the monitoring integration test
# (tests/tests/monitoring.rs) into OUT_DIR/rules.yaml: release `hasten` in namespace
# `hasten`, every rule group on, one control-plane node (the test runs one), and a
# shard-down alert that fires after 5 s instead of a minute, so that the test sees it fire,
# and recording rules over 4 s windows (four of the test's scrapes).
# Prints the file's path.
#
#     scripts/render-rules.sh OUT_DIR
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 1 ] || { echo "usage: $0 OUT_DIR" >&2; exit 2; }
out=$1

cache=${HASTEN_CI_CACHE:-$HOME/.cache/hasten-ci}
tools=$cache/tools
log() { echo "render-rules: $*" >&2; }
source scripts/helm-tools.sh

mkdir -p "$out"
"$helm" template hasten helm/hasten --namespace hasten \
  --set monitoring.prometheusRule.enabled=true --set monitoring.forceCRDs=true \
  --set kvOperator.enabled=true --set controlPlane.replicas=1 \
  --set monitoring.prometheusRule.thresholds.shardDownFor=5s \
  --set monitoring.recordingRules.window=4s >"$out/rendered.yaml"
"$py" "$helper" split "$out/rendered.yaml" "$out/rendered" >/dev/null
"$py" scripts/check-alerts.py rules-file "$out/rendered/crds.yaml" "$out/rules.yaml" \
  "$out/rules-unannotated.yaml" >/dev/null
echo "$out/rules.yaml"
