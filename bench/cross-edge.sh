#!/usr/bin/env bash
# The cross-edge effect of the replicated hot cache: the same TopViews-shaped workload
# through one HaS edge that sees all traffic, through 4 isolated HaS edges (client i talks
# to edge i mod 4), and through 4 HaS edges that share their cache through a 3-node Raft
# control plane. Prints DAR, x-edge acceptances and latency, and the replicated edges' DAR
# as a share of the single edge's (goal: at least 95%). Figures: docs/benchmarks/retrieval.md.
#
# Environment: QUERIES (3000), RATE_QPS (30), TAU (0.2), DATA_DIR (../shared/data),
# OUT (run/cross-edge/<time>). Reuses the has-eval bundle when present.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
data=${DATA_DIR:-../shared/data}
queries=${QUERIES:-3000}
rate=${RATE_QPS:-30}
tau=${TAU:-0.2}
out=${OUT:-run/cross-edge/$(date +%Y%m%d-%H%M%S)}
bundle=run/has-eval/bundle

scripts/install-deps.sh
cargo build --release --bins
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
mkdir -p "$out"

if [ ! -f "$bundle/manifest.json" ]; then
  corpus=(--squad "$data/squad-dev-v1.1-visible.json")
  [ -f "$data/hotpotqa-distractor-500.jsonl" ] && corpus+=(--hotpot "$data/hotpotqa-distractor-500.jsonl")
  [ -f "$data/wiki18-passages-1000.jsonl" ] && corpus+=(--wiki18 "$data/wiki18-passages-1000.jsonl")
  "$target/release/cloud-index" build "${corpus[@]}" --out "$bundle"
fi

common=(--bundle "$bundle" --queries "$queries" --rate "$rate" --taus "$tau"
  --client-delay uniform:0.005,0.025 --cloud-delay uniform:0.05,0.1)
"$target/release/hasten-loadtest" eval "${common[@]}" --edges 1 --systems has \
  --out "$out/one-edge" 2>&1 | tee "$out/one-edge.log"
"$target/release/hasten-loadtest" eval "${common[@]}" --edges 4 --systems has,has-replicated \
  --out "$out/four-edges" 2>&1 | tee "$out/four-edges.log"

python3 - "$out" <<'SUMMARY'
import json, sys
out = sys.argv[1]
one = json.load(open(f"{out}/one-edge/report.json"))["systems"][0]
four = {s["name"]: s for s in json.load(open(f"{out}/four-edges/report.json"))["systems"]}
rows = [("1 edge, all traffic", one), ("4 isolated edges", four["has"]),
        ("4 replicated edges", four["has-replicated"])]
print("| setup | DAR | x-edge | CAR | DHR | AvgL (s) | p50 (s) | p99 (s) |")
print("|---|---|---|---|---|---|---|---|")
for name, s in rows:
    car = "-" if s["car"] is None else f"{s['car']:.4f}"
    print(f"| {name} | {s['dar']:.4f} | {s['cross_edge_accepted']} | {car} | {s['doc_hit_rate']:.4f} "
          f"| {s['avg_latency_s']:.4f} | {s['p50_s']:.4f} | {s['p99_s']:.4f} |")
share = four["has-replicated"]["dar"] / one["dar"] if one["dar"] else float("nan")
isolated = four["has"]["dar"] / one["dar"] if one["dar"] else float("nan")
print(f"\nreplicated DAR / single-edge DAR = {share:.3f} (goal >= 0.95); isolated: {isolated:.3f}")
SUMMARY
echo "reports: $out"
