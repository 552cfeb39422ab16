#!/usr/bin/env bash
# The HaS evaluation on real data: builds the corpus (every SQuAD paragraph of the given
# file, HotpotQA context paragraphs and wiki18 passages, deduplicated), then runs
# TopViews-sampled SQuAD questions through every system (cloud-only, edge IVF, exact and
# semantic caches, HaS over tau and without its fuzzy channel) behind the paper's network
# model, and prints the folder holding report.json, report.md and the plots.
#
#   bench/has-eval.sh [SQUAD_JSON]        default ../shared/data/squad-dev-v1.1-visible.json
#
# Environment: QUERIES (5000), RATE_QPS (30, open loop; one edge encodes ~77 short
# queries/s, so keep well below), DATA_DIR (../shared/data), OUT (run/has-eval/<time>).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
data=${DATA_DIR:-../shared/data}
squad=${1:-$data/squad-dev-v1.1-visible.json}
queries=${QUERIES:-5000}
rate=${RATE_QPS:-30}
out=${OUT:-run/has-eval/$(date +%Y%m%d-%H%M%S)}

[ -f "$squad" ] || { echo "no SQuAD file at $squad (give one as the first argument)" >&2; exit 2; }
corpus=(--squad "$squad")
if [ -f "$data/hotpotqa-distractor-500.jsonl" ]; then
  corpus+=(--hotpot "$data/hotpotqa-distractor-500.jsonl")
fi
if [ -f "$data/wiki18-passages-1000.jsonl" ]; then
  corpus+=(--wiki18 "$data/wiki18-passages-1000.jsonl")
fi

cargo build --release --bins
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
mkdir -p "$out"

# The paper's network: client-edge round trip U(0.01, 0.05) s, edge-cloud U(0.1, 0.2) s,
# paid on the wire by the relays as one-way delays of half that per packet.
"$target/release/hasten-loadtest" eval "${corpus[@]}" --bundle-out run/has-eval/bundle \
  --queries "$queries" --rate "$rate" \
  --client-delay uniform:0.005,0.025 --cloud-delay uniform:0.05,0.1 \
  --systems cloud-only,edge-ivf,exact-cache,semantic-cache,has,has-no-fuzzy \
  --taus 0.1,0.2,0.3,0.4,0.5,0.6 --thetas 0.8,0.85,0.9,0.95 \
  --out "$out" 2>&1 | tee "$out/eval.log"
echo "report: $out"
