#!/usr/bin/env bash
# FusionRAG KV reuse against full prefill on HotpotQA-style questions, each answered from its
# own paragraphs as chunks (SmolLM2-135M, greedy, in process): time to first token and quality
# against full prefill for full-prefill, full-reuse, cacheblend and fusionrag, over Full Reuse
# KV (fr-kv) and similarity-guided KV (sim-kv, each chunk after its 10 nearest chunks of the
# file by MiniLM cosine). Chunk KV is computed before any question is timed. Writes
# run/fusionrag-eval/report.json (per system: ttft_s, f1, em, agreement_with_full_prefill,
# queries, first_token_kl, kv_deviation_per_layer, stage times) and prints the table.
#   bench/fusionrag-eval.sh [FILE] [extra args]   default FILE ../shared/data/hotpotqa-distractor-100.jsonl
#   bench/fusionrag-eval.sh ../shared/data/hotpotqa-distractor-100.jsonl --limit 8 --min-context 2048
# Extra arguments go to hasten-fusionrag-eval (see --help). Model: HASTEN_LM_DIR (default
# models/lm); encoder: HASTEN_MODEL_DIR (default models/all-MiniLM-L6-v2); threads:
# RAYON_NUM_THREADS (default every core).
set -euo pipefail
input=${1:-../shared/data/hotpotqa-distractor-100.jsonl}
[ $# -gt 0 ] && shift
input=$(realpath "$input")
cd "$(dirname "$0")/.."
source bench/models.sh
export RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-$(nproc)}
# --workspace keeps the workspace build's feature set (with -p, cargo rebuilds candle and the
# tokenizers for hasten-bench's features alone, 10+ minutes in a shared target directory).
cargo build -q --workspace --bin hasten-fusionrag-eval
target=${CARGO_TARGET_DIR:-target}
"$target/debug/hasten-fusionrag-eval" "$input" --work run/fusionrag-eval "$@"
