#!/usr/bin/env bash
# The engine path against the in-process runtime, same model, same questions: a cloud index
# over SQuAD-dev's articles, one edge generating in process (`answer.model`) and one generating on
# llama.cpp's own server (`engine.url`, the xllamacpp wheel `make clients` installs), both
# serving SmolLM2-135M-Instruct Q4_1 on this machine's cores (2 threads each; the questions go
# one at a time, so they never compete). bench/answer_eval.py asks every question of both
# edges in turn and scores the answers. Writes run/engine-eval/report.json.
#
# usage: bench/engine-eval.sh [--limit N] [--k K]    (default 100 questions, k = 5)
# Needs release binaries (cargo build --release -p hasten-edge-node -p hasten-cloud-index), `make models
# clients` and the SQuAD data (DATA_DIR, default ../shared/data).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tools=${TOOLS_DIR:-models/tools}
llama_python=${HASTEN_LLAMA_SERVER_PYTHON:-$tools/llama-server-venv/bin/python}
run=run/engine-eval
. bench/loopback.sh
rm -f "$run"/llama.ready
"$llama_python" tests/clients/llama_server.py "$model" --alias smollm2 --parallel 1 --ctx 4096 \
  --threads 2 --ready-file "$run/llama.ready" > "$run/llama.log" 2>&1 &
pids+=($!)
start_cloud
wait_ready "$run/llama.ready"
start_edge in-process --lm-model "$model"
start_edge engine --lm-engine-url "http://$(field "$run/llama.ready" http_addr)/v1" \
  --lm-engine-model smollm2
echo "edges ready; asking" >&2
python3 bench/answer_eval.py --edge "in-process=$(field "$run/in-process.ready" http_addr)" \
  --edge "engine=$(field "$run/engine.ready" http_addr)" --questions "$bundle/questions.jsonl" \
  --out "$run/report.json" "$@"
