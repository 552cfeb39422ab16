#!/usr/bin/env bash
# The engine path against the in-process runtime, same model, same questions: a cloud index
# over SQuAD-dev's articles, one edge generating in process (`lm_model`) and one generating on
# llama.cpp's own server (`lm_engine_url`, the xllamacpp wheel `make clients` installs), both
# serving SmolLM2-135M-Instruct Q4_1 on this machine's cores (2 threads each; the questions go
# one at a time, so they never compete). bench/answer_eval.py asks every question of both
# edges in turn and scores the answers. Writes run/engine-eval/report.json.
#
# usage: bench/engine-eval.sh [--limit N] [--k K]    (default 100 questions, k = 5)
# Needs release binaries (cargo build --release -p edge-node -p cloud-index), `make models
# clients` and the SQuAD data (DATA_DIR, default ../shared/data).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
. bench/models.sh
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin=$target/release
data=${DATA_DIR:-../shared/data}
tools=${TOOLS_DIR:-models/tools}
llama_python=${HASTEN_LLAMA_SERVER_PYTHON:-$tools/llama-server-venv/bin/python}
run=run/engine-eval
mkdir -p "$run"
bundle=$run/bundle
[ -d "$bundle" ] || "$bin/cloud-index" build --squad "$data/squad-dev-v1.1-visible.json" --out "$bundle"

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
wait_ready() { for _ in $(seq 3000); do [ -s "$1" ] && return; sleep 0.1; done; echo "$1 never came" >&2; exit 1; }
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

rm -f "$run"/*.ready "$run"/cloud.pem
"$bin/cloud-index" serve --bundle "$bundle" --quic-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 \
  --metrics-addr 127.0.0.1:0 --dev-cert-out "$run/cloud.pem" --ready-file "$run/cloud.ready" \
  > "$run/cloud.log" 2>&1 &
pids+=($!)
"$llama_python" tests/clients/llama_server.py "$model" --alias smollm2 --parallel 1 --ctx 4096 \
  --threads 2 --ready-file "$run/llama.ready" > "$run/llama.log" 2>&1 &
pids+=($!)
wait_ready "$run/cloud.ready"
wait_ready "$run/llama.ready"
start_edge() {
  local name=$1; shift
  "$bin/edge-node" serve --bundle "$bundle" --cloud-addr "$(field "$run/cloud.ready" quic_addr)" \
    --cloud-ca "$run/cloud.pem" --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 \
    --ready-file "$run/$name.ready" "$@" > "$run/$name.log" 2>&1 &
  pids+=($!)
  wait_ready "$run/$name.ready"
}
start_edge in-process --lm-model "$model"
start_edge engine --lm-engine-url "http://$(field "$run/llama.ready" http_addr)/v1" --lm-engine-model smollm2
echo "edges ready; asking" >&2
python3 bench/answer_eval.py --edge "in-process=$(field "$run/in-process.ready" http_addr)" \
  --edge "engine=$(field "$run/engine.ready" http_addr)" --questions "$bundle/questions.jsonl" \
  --out "$run/report.json" "$@"
