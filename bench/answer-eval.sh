#!/usr/bin/env bash
# The whole answer path under TopViews-shaped load: the standard RAG stack (cloud retrieval,
# full prefill on KV workers, round-robin), each half of Hasten alone (has+full-prefill,
# cloud+fusionrag) and Hasten (replicated HaS edges, FusionRAG at 15% on similarity-guided
# KV, KV-aware routing), the same questions at the same arrival times, streamed as chat
# completions behind the paper's emulated network. Prints the report: TTFT, ITL and answer
# latency, goodput at the TTFT objective, the goodput knee over the rates, answer quality
# against gold paired with standard's, and where each system's time went.
#
#   bench/answer-eval.sh                    EntityQuestions: the ENTITIES subjects most seen in
#                                           the 2012 page views, their articles (MAX_PASSAGES
#                                           passages each) and questions, page-view popularity
#   bench/answer-eval.sh --questions FILE   another EntityQuestions-format file, same subsetting
#   bench/answer-eval.sh --squad FILE       SQuAD paragraphs and questions (ARTICLES articles)
#
# Environment: QUERIES (160), RATES (0.25,0.5,1: open loop, q/s), TTFT_SLO (5s), MODE (realtime,
# or replay: no emulated network, closed loop, quality at full speed), SYSTEMS (all four),
# MODEL (the answering GGUF; default SmolLM2-135M-Instruct from HASTEN_LM_DIR), ENTITIES
# (60), MAX_PASSAGES (3), ARTICLES (4), MAX_TOKENS (16), K (5), EDGES (2), WORKERS (2),
# FUSION_RATIO (0.15: the share of chunk tokens FusionRAG recomputes), EXACT_LEADING_CHUNK
# (true or false: the workers' exact_leading_chunk; default the worker's), WHOLE_CHUNKS (the
# workers' recompute_whole_chunks: chunks after the first recomputed whole), EDGE_ARGS (extra
# flags for every edge, space-separated, after the system's own: `--set=kv.variant=full-reuse`),
# WORKER_ARGS (the same for every KV worker: `--set=selection_attention=all-layers`),
# DATA_DIR (../shared/data), OUT (run/answer-eval/<time>), RAYON_NUM_THREADS (1: one thread
# per process, so that two KV workers do not oversubscribe two cores; the store's preprocessing
# runs alone first and takes every core), PROFILE (release, or
# dev to reuse `make test`'s build: the same greedy answers, but its times are not figures).
# The corpus bundle and the KV store are built once under run/answer-eval/ and reused (the
# store is per model; KV_STORE names another, e.g. one written with HASTEN_KV_DTYPE=f32).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
data=${DATA_DIR:-../shared/data}
questions=$data/entityquestions-train-dev.jsonl.gz
squad=
while [ $# -gt 0 ]; do
  case $1 in
    --questions) questions=$2; shift 2 ;;
    --squad) squad=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
source bench/models.sh
answer_model=${MODEL:-$model}
[ -f "$answer_model" ] || { echo "no model at $answer_model" >&2; exit 2; }
out=${OUT:-run/answer-eval/$(date +%Y%m%d-%H%M%S)}
work=run/answer-eval
mkdir -p "$work" "$out"

if [ -n "$squad" ]; then
  [ -f "$squad" ] || { echo "no SQuAD file at $squad" >&2; exit 2; }
  articles=${ARTICLES:-4}
  name=squad-$articles
  subset=$work/$name.json
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["data"]=d["data"][:int(sys.argv[2])]; json.dump(d,open(sys.argv[3],"w"))' \
    "$squad" "$articles" "$subset"
  corpus=(--squad "$subset")
  popularity=()
else
  views=$data/pageviews-2012-daily-top.csv.gz
  all_articles=$data/wiki-entity-articles.jsonl.gz
  for f in "$questions" "$all_articles" "$views"; do
    [ -f "$f" ] || { echo "missing $f (see $data/README.md)" >&2; exit 2; }
  done
  entities=${ENTITIES:-60}
  name=entity-$entities
  # Preprocessing every chunk's KV bounds the corpus on a small machine: the subjects
  # most viewed, their articles and questions.
  python3 bench/answer-subset.py --questions "$questions" --articles "$all_articles" \
    --views "$views" --entities "$entities" --out "$work/$name"
  corpus=(--wiki-articles "$work/$name/articles.jsonl" --max-passages-per-article "${MAX_PASSAGES:-3}"
    --entity-questions "$work/$name/questions.jsonl" --entity-questions-with-article)
  popularity=(--topviews "$views")
fi
bundle=$work/bundle-$name
if [ -f "$bundle/manifest.json" ]; then
  corpus=(--bundle "$bundle")
fi

# --workspace keeps the workspace build's feature set (a -p build recompiles shared crates);
# with dev, --tests keeps `make test`'s (its dev-dependencies switch features on).
profile=${PROFILE:-release}
cargo build --profile "$profile" --workspace --bins $([ "$profile" = dev ] && echo --tests)
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin=$target/$([ "$profile" = dev ] && echo debug || echo "$profile")
export PATH=$bin:$PATH
export RAYON_NUM_THREADS=${RAYON_NUM_THREADS:-1}
extra_args=()
for arg in ${EDGE_ARGS:-}; do extra_args+=("--edge-arg=$arg"); done
for arg in ${WORKER_ARGS:-}; do extra_args+=("--worker-arg=$arg"); done

"$bin/hasten-loadtest" answers "${corpus[@]}" --bundle-out "$bundle" \
  "${popularity[@]}" --queries "${QUERIES:-160}" --rates "${RATES:-0.25,0.5,1}" \
  --mode "${MODE:-realtime}" --ttft-slo "${TTFT_SLO:-5s}" \
  --systems "${SYSTEMS:-standard,has+full-prefill,cloud+fusionrag,hasten}" \
  --lm-model "$answer_model" --kv-store "${KV_STORE:-$work/kv-store-$name-$(basename "$answer_model" .gguf)}" \
  --max-tokens "${MAX_TOKENS:-16}" --k "${K:-5}" --edges "${EDGES:-2}" --workers "${WORKERS:-2}" \
  --fusion-ratio "${FUSION_RATIO:-0.15}" \
  ${EXACT_LEADING_CHUNK:+--exact-leading-chunk "$EXACT_LEADING_CHUNK"} \
  ${WHOLE_CHUNKS:+--recompute-whole-chunks "$WHOLE_CHUNKS"} \
  "${extra_args[@]}" \
  --client-delay uniform:0.005,0.025 --cloud-delay uniform:0.05,0.1 \
  --save-workload "$out/workload.jsonl" --out "$out" 2>&1 | tee "$out/answers.log"
echo "report: $out"
