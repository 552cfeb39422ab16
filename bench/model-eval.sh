#!/usr/bin/env bash
# The answering models side by side on the same questions: one edge per GGUF model, each
# generating in process (standard RAG, `fast` weights, 2 threads), over one cloud index of
# SQuAD-dev's articles; bench/answer_eval.py asks every question of every edge in turn and
# scores the answers (EM, F1, contains) and their latency. Writes run/model-eval/report.json.
#
# usage: bench/model-eval.sh [--limit N] [--k K] [--max-tokens T]     (default 100, 5, 32)
# Models: SmolLM2-135M (`make models`) and, when `make models-large` installed them,
# Qwen2.5-Coder-0.5B and -1.5B. Needs release binaries (cargo build --release -p hasten-edge-node
# -p hasten-cloud-index) and the SQuAD data (DATA_DIR, default ../shared/data).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
run=run/model-eval
. bench/loopback.sh
start_cloud
edges=()
for pair in smollm2-135m:SmolLM2-135M-Instruct.Q4_1.gguf \
  qwen2.5-coder-0.5b:qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
  qwen2.5-coder-1.5b:qwen2.5-coder-1.5b-instruct-q4_k_m.gguf; do
  name=${pair%%:*} file=$HASTEN_LM_DIR/${pair#*:}
  [ -f "$file" ] || { echo "$file not installed (make models-large): skipping $name" >&2; continue; }
  start_edge "$name" --lm-model "$file"
  edges+=(--edge "$name=$(field "$run/$name.ready" http_addr)")
done
echo "edges ready; asking" >&2
python3 bench/answer_eval.py "${edges[@]}" --questions "$bundle/questions.jsonl" \
  --out "$run/report.json" "$@"
