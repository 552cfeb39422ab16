#!/usr/bin/env bash
# Runs Hasten end to end on loopback: builds (or reuses) a corpus bundle, then lets
# hasten-loadtest start one cloud-index and one edge-node per system behind the emulated
# network, send the same popularity-skewed questions through a cloud-only edge and a HaS
# edge, and print the comparison. Every process is stopped when it ends.
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
"$bin/cloud-index" build "${corpus[@]}" --out "$bundle"

echo
echo "$queries TopViews-shaped questions at $rate q/s, client-edge and edge-cloud delays on the wire"
"$bin/hasten-loadtest" eval --bundle "$bundle" --queries "$queries" --rate "$rate" \
  --systems cloud-only,has --taus 0.2 --out "$run/report"
