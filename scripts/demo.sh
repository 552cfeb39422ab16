#!/usr/bin/env bash
# Runs Hasten end to end on loopback: builds (or reuses) a corpus bundle, starts one
# cloud-index and two edges (HaS and a cloud-only baseline), sends the same
# popularity-skewed questions to both and prints the comparison. Stops everything on exit.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
bin=${CARGO_TARGET_DIR:-$root/target}/debug
data=${DATA_DIR:-../shared/data}
run=run/demo
queries=${DEMO_QUERIES:-300}
mkdir -p "$run"

squad=$data/squad-dev-v1.1-visible.json
if [ -f "$squad" ]; then
  corpus=(--squad "$squad")
  [ -f "$data/hotpotqa-distractor-100.jsonl" ] && corpus+=(--hotpot "$data/hotpotqa-distractor-100.jsonl")
  [ -f "$data/wiki18-passages-1000.jsonl" ] && corpus+=(--wiki18 "$data/wiki18-passages-1000.jsonl")
  sources=(--source squad)
  bundle=$run/bundle-real
  echo "corpus: SQuAD + HotpotQA + wiki18 passages from $data (first build encodes ~3,500 passages, a few minutes)"
else
  corpus=()
  sources=(--source synthetic)
  bundle=$run/bundle-synthetic
  echo "corpus: $data not found, using the synthetic knowledge base"
fi
"$bin/cloud-index" build "${corpus[@]}" --out "$bundle"

pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
}
trap cleanup EXIT

wait_ready() { # file pid name
  for _ in $(seq 1 600); do
    [ -f "$1" ] && return 0
    kill -0 "$2" 2>/dev/null || { echo "$3 exited during start-up; see $run/$3.log" >&2; exit 1; }
    sleep 0.2
  done
  echo "$3 did not become ready; see $run/$3.log" >&2
  exit 1
}
field() { python3 -c "import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])" "$1" "$2"; }

rm -f "$run"/*.ready.json
"$bin/cloud-index" serve --bundle "$bundle" --quic-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 \
  --dev-cert-out "$run/cloud-cert.pem" --ready-file "$run/cloud.ready.json" >"$run/cloud.log" 2>&1 &
pids+=($!)
wait_ready "$run/cloud.ready.json" "${pids[-1]}" cloud
cloud=$(field "$run/cloud.ready.json" quic_addr)

for policy in has cloud-only; do
  "$bin/edge-node" serve --bundle "$bundle" --policy "$policy" --cloud-addr "$cloud" \
    --cloud-ca "$run/cloud-cert.pem" --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 \
    --ready-file "$run/edge-$policy.ready.json" >"$run/edge-$policy.log" 2>&1 &
  pids+=($!)
  wait_ready "$run/edge-$policy.ready.json" "${pids[-1]}" "edge-$policy"
done

echo
"$bin/hasten-loadtest" compare --bundle "$bundle" "${sources[@]}" --queries "$queries" \
  --system "cloud-only=http://$(field "$run/edge-cloud-only.ready.json" http_addr)" \
  --system "has=http://$(field "$run/edge-has.ready.json" http_addr)" \
  --json "$run/summary.json"
echo
echo "logs and summary.json in $run/"
