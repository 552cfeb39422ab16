#!/usr/bin/env bash
# Runs Hasten end to end on loopback: builds (or reuses) a corpus bundle cut into 2 shards,
# then lets hasten-loadtest start the cloud tier (2 shard servers behind a router) and, per
# system, 2 edges behind the emulated network: cloud-only edges, isolated HaS edges, and HaS
# edges sharing their hot cache through a 3-node Raft control plane. The same
# popularity-skewed questions go through each; the comparison shows, among others, drafts
# accepted on one edge thanks to a fallback on the other. Every process is stopped at the end.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin=$target/debug
data=${DATA_DIR:-../shared/data}
run=run/demo
queries=${DEMO_QUERIES:-400}
rate=${DEMO_RATE_QPS:-20}
mkdir -p "$run"

squad=$data/squad-dev-v1.1-visible.json
if [ -f "$squad" ]; then
  corpus=(--squad "$squad")
  [ -f "$data/hotpotqa-distractor-100.jsonl" ] && corpus+=(--hotpot "$data/hotpotqa-distractor-100.jsonl")
  [ -f "$data/wiki18-passages-1000.jsonl" ] && corpus+=(--wiki18 "$data/wiki18-passages-1000.jsonl")
  bundle=$run/bundle-real
  echo "corpus: SQuAD + HotpotQA + wiki18 passages from $data (the first build encodes them, a few minutes)"
else
  corpus=()
  bundle=$run/bundle-synthetic
  echo "corpus: $data not found, using the synthetic knowledge base"
fi
"$bin/cloud-index" build "${corpus[@]}" --out "$bundle" --shards 2

echo
echo "$queries TopViews-shaped questions at $rate q/s over 2 edges per system, client-edge and edge-cloud delays on the wire"
"$bin/hasten-loadtest" eval --bundle "$bundle" --shards 2 --edges 2 --queries "$queries" \
  --rate "$rate" --systems cloud-only,has,has-replicated --taus 0.2 --out "$run/report"

python3 - "$run/report/report.json" <<'SUMMARY'
import json, sys
systems = {s["name"]: s for s in json.load(open(sys.argv[1]))["systems"]}
isolated, shared = systems["has"], systems["has-replicated"]
print(f"2 isolated HaS edges: DAR {isolated['dar']:.3f}, {isolated['cross_edge_accepted']} drafts accepted through the other edge's fallbacks")
print(f"2 replicated HaS edges: DAR {shared['dar']:.3f}, {shared['cross_edge_accepted']} drafts accepted through the other edge's fallbacks (learned through the control plane)")
SUMMARY
