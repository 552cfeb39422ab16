#!/usr/bin/env bash
# SpecHop against the sequential multi-hop agent (SmolLM2-135M, greedy, in process) on
# HotpotQA-style questions: relative latency at k = 1, 2, 3, 5 speculative threads with the
# strict verifier (identical documents: lossless) and the token-set Jaccard verifier of
# sub-answers, speculation success rate, exact match of the final answers, identical
# trajectories, and the cost ratios alpha (speculator / target) and beta (agent per hop /
# target). The corpus is the file's context paragraphs (all-MiniLM-L6-v2); the target is
# faiss exact search over it behind a 1 s latency; the speculator the edge's fuzzy channel.
# Writes run/spechop-eval/report.json and prints the table.
#   bench/spechop-eval.sh [FILE] [extra args]   default FILE ../shared/data/hotpotqa-distractor-100.jsonl
#   bench/spechop-eval.sh ../shared/data/hotpotqa-distractor-500.jsonl --limit 50 --speculator fraction:0.5
# Extra arguments go to hasten-spechop-eval (see --help). Model: HASTEN_LM_DIR (default
# models/lm); encoder: HASTEN_MODEL_DIR (default models/all-MiniLM-L6-v2).
set -euo pipefail
input=${1:-../shared/data/hotpotqa-distractor-100.jsonl}
[ $# -gt 0 ] && shift
input=$(realpath "$input")
cd "$(dirname "$0")/.."
source bench/models.sh
cargo build -q --workspace --bin hasten-spechop-eval
target=${CARGO_TARGET_DIR:-target}
"$target/debug/hasten-spechop-eval" --input "$input" --model "$model" --out run/spechop-eval "$@"
