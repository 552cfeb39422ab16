#!/usr/bin/env bash
# Probes the answer surface as a new user would (bench/answer_probes.py): a "stuff" prompt,
# streams abandoned after their first line, a burst of streams, back-to-back requests on a
# queue of one. Starts a cloud index and two edges (the default queue, and answer.queue = 1)
# answering with SmolLM2-135M, on loopback, and stops them at the end.
#
# usage: bench/answer-probes.sh [EDGE_BINARY]   (default: the workspace's debug edge-node;
#        pass an older build to compare). Needs `make models clients` and the SQuAD data.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
edge_bin=${1:-$target/debug/edge-node}
data=${DATA_DIR:-../shared/data}
lm=${HASTEN_LM_DIR:-models/lm}/SmolLM2-135M-Instruct.Q4_1.gguf
python=${HASTEN_RAG_CLIENTS_PYTHON:-models/tools/rag-clients-venv/bin/python}
run=run/answer-probes
mkdir -p "$run"
bundle=$run/bundle
[ -d "$bundle" ] || "$target/debug/cloud-index" build --squad "$data/squad-dev-v1.1-visible.json" --out "$bundle"

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
wait_ready() { for _ in $(seq 1800); do [ -s "$1" ] && return; sleep 0.1; done; echo "$1 never came" >&2; exit 1; }
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

rm -f "$run"/*.ready "$run"/cloud.pem
"$target/debug/cloud-index" serve --bundle "$bundle" --quic-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 \
  --metrics-addr 127.0.0.1:0 --dev-cert-out "$run/cloud.pem" --ready-file "$run/cloud.ready" \
  > "$run/cloud.log" 2>&1 &
pids+=($!)
wait_ready "$run/cloud.ready"
printf '[answer]\nqueue = 1\n' > "$run/queue-1.toml"
start_edge() {
  local name=$1; shift
  "$edge_bin" serve --bundle "$bundle" --cloud-addr "$(field "$run/cloud.ready" quic_addr)" \
    --cloud-ca "$run/cloud.pem" --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 --lm-model "$lm" \
    --ready-file "$run/$name.ready" "$@" > "$run/$name.log" 2>&1 &
  pids+=($!)
  wait_ready "$run/$name.ready"
}
start_edge edge
start_edge edge-queue-1 --config "$run/queue-1.toml"
"$python" bench/answer_probes.py "$(field "$run/edge.ready" http_addr)" \
  "$(field "$run/edge-queue-1.ready" http_addr)" "$bundle/questions.jsonl"
