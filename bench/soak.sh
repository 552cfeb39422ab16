#!/usr/bin/env bash
# Soak: steady TopViews-shaped load on the full local topology (2 shards x 2 replicas behind
# a router, a 3-node control plane, 2 edges with 2 tenants, mutual TLS everywhere) while a
# cloud replica and the control-plane leader are killed and restarted. Prints and writes
# run/soak/report.json: error rate by kind and latency percentiles per phase, committed
# entries missing from any node at the end, and cross-tenant acceptances; exits non-zero
# when an entry was lost or a tenant was answered through another's cache.
#
#   bench/soak.sh [DURATION_S=600] [RATE_QPS=20]
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-600}
rate=${2:-20}
data=${DATA_DIR:-../shared/data}
run=run/soak
export HASTEN_MODEL_DIR=${HASTEN_MODEL_DIR:-$PWD/models/all-MiniLM-L6-v2}

cargo build --workspace --bins
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin=$target/debug
mkdir -p "$run"

# The demo's corpus (SQuAD + HotpotQA + wiki18 passages), cut into 2 shards; vectors are
# reused when the bundle exists.
bundle=run/demo/bundle-real
"$bin/cloud-index" build --squad "$data/squad-dev-v1.1-visible.json" \
  --hotpot "$data/hotpotqa-distractor-100.jsonl" --wiki18 "$data/wiki18-passages-1000.jsonl" \
  --out "$bundle" --shards 2 > /dev/null

# Enough TopViews-shaped questions for the whole run.
queries=$(python3 -c "print(int($duration * $rate * 1.2) + 100)")
"$bin/hasten-loadtest" workload --bundle "$bundle" --queries "$queries" \
  --save-workload "$run/workload.jsonl" > "$run/workload-stats.json"

"$bin/hasten-soak" --bundle "$bundle" --workload "$run/workload.jsonl" \
  --duration-s "$duration" --rate "$rate" --work "$run"
