#!/usr/bin/env bash
# Speculative RAG against standard RAG on HotpotQA-style questions, each answered from its
# own 10 context paragraphs (2 gold, 8 distractors): exact match, F1 and answer containment,
# and the wall-clock latency of every answer (mean, p50, p99, ratio to standard RAG) for
# standard-rag (the verifier reads all 10), speculative-rag (m = 5 drafts over k = 2
# clusters, verified), speculative-random-draft (no verification) and
# speculative-no-clustering (random subsets). Document encoding is preprocessing and is not
# counted in any latency. Writes run/specrag-eval/report.json and prints the table.
#   bench/specrag-eval.sh FILE [extra args]    e.g. ../shared/data/hotpotqa-distractor-100.jsonl --limit 20
# Questions without passages (TriviaQA: `question`, `answers`) retrieve theirs from a corpus
# bundle built by `cloud-index build`:
#   bench/specrag-eval.sh ../shared/data/triviaqa-1000.jsonl --retrieve-from run/trivia-bundle --limit 20
# Extra arguments go to hasten-specrag-eval (see --help). Models: HASTEN_LM_DIR (default
# models/lm): drafter SmolLM2-135M-Instruct, verifier Qwen2.5-Coder-1.5B-Instruct when
# `make models-large` installed it, else Qwen2.5-Coder-0.5B-Instruct. Encoder: HASTEN_MODEL_DIR
# (default models/all-MiniLM-L6-v2). Threads: RAYON_NUM_THREADS (default: every core).
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $0 FILE [extra hasten-specrag-eval args]" >&2
    exit 2
fi
input=$(realpath "$1")
shift
cd "$(dirname "$0")/.."

lm_dir=${HASTEN_LM_DIR:-models/lm}
export HASTEN_MODEL_DIR=${HASTEN_MODEL_DIR:-models/all-MiniLM-L6-v2}
export RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-$(nproc)}
drafter=$lm_dir/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$drafter" ]; then
    echo "$drafter not found: run \`make models\` or point HASTEN_LM_DIR at the installed models" >&2
    exit 1
fi
# The paper's regime is a verifier much larger than the drafter: the 1.5B model where
# `make models-large` installed it, else the 0.5B model `make models` fetches.
verifier=$lm_dir/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf
if [ ! -f "$verifier" ]; then
    echo "$(basename "$verifier") not installed (\`make models-large\`): verifying with the 0.5B model"
    verifier=$lm_dir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
fi
if [ ! -f "$verifier" ]; then
    echo "$verifier not found: run \`make models\`" >&2
    exit 1
fi
echo "drafter $(basename "$drafter"), verifier $(basename "$verifier")"

scripts/install-deps.sh
cargo build --release -p hasten-bench --bin hasten-specrag-eval
target_dir="${CARGO_TARGET_DIR:-target}"
"$target_dir/release/hasten-specrag-eval" --input "$input" --drafter "$drafter" \
    --verifier "$verifier" --out run/specrag-eval "$@"
