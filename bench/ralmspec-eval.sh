#!/usr/bin/env bash
# RaLMSpec against sequential iterative RAG (ralm-seq), the paper's Table 1: speed-up of
# RaLMSpec, +prefetching, +OS3, +asynchronous verification and all three, with every output
# checked token for token against ralm-seq (SmolLM2-135M, greedy, in process). The exact
# retriever is faiss exact search over a corpus bundle behind an emulated link: the paper's
# edge-cloud round trip (uniform 100-200 ms per call) and a slow retriever (1 s per call).
# Writes run/ralmspec-eval/report.json (per setting and configuration: speedup,
# identical_to_sequential, queries, ...) and prints the tables.
#   bench/ralmspec-eval.sh [extra args]       default: 5 questions each of NQ-open, TriviaQA, SQuAD
#   bench/ralmspec-eval.sh --limit 20 --latency slow=fixed:1
# Questions: NQ-open and TriviaQA from ../shared/data, SQuAD through bench/squad-questions.py
# (every 25th question). Corpus: run/squad-bundle (SQuAD, HotpotQA-500 and wiki18 passages),
# built here with `cloud-index build` when missing (about 10 minutes). Extra arguments go to
# hasten-ralmspec-eval (see --help). Model: HASTEN_LM_DIR (default models/lm); encoder:
# HASTEN_MODEL_DIR (default models/all-MiniLM-L6-v2).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${HASTEN_DATA_DIR:-../shared/data}
source bench/models.sh
for f in nq-open-dev.jsonl triviaqa-1000.jsonl squad-dev-v1.1-visible.json \
         hotpotqa-distractor-500.jsonl wiki18-passages-1000.jsonl; do
    if [ ! -f "$data/$f" ]; then
        echo "$data/$f not found: point HASTEN_DATA_DIR at the visible data" >&2
        exit 1
    fi
done
cargo build -q --workspace --bin cloud-index --bin hasten-ralmspec-eval
target=${CARGO_TARGET_DIR:-target}
mkdir -p run
if [ ! -f run/squad-bundle/manifest.json ]; then
    "$target/debug/cloud-index" build --squad "$data/squad-dev-v1.1-visible.json" \
        --hotpot "$data/hotpotqa-distractor-500.jsonl" \
        --wiki18 "$data/wiki18-passages-1000.jsonl" --out run/squad-bundle
fi
if [ ! -s run/squad-questions.jsonl ]; then
    python3 bench/squad-questions.py "$data/squad-dev-v1.1-visible.json" 25 > run/squad-questions.jsonl
fi
"$target/debug/hasten-ralmspec-eval" --bundle run/squad-bundle --model "$model" \
    --input "$data/nq-open-dev.jsonl" --input "$data/triviaqa-1000.jsonl" \
    --input run/squad-questions.jsonl --out run/ralmspec-eval "$@"
