#!/usr/bin/env bash
# The HaS evaluation on real data. Default: EntityQuestions (train+dev, questions whose
# subject's article the corpus holds, each asked in its own words or one of 5 paraphrases
# of its relation) over the entity corpus (full Wikipedia articles split into passages of at
# most 100 words under their title, at most MAX_PASSAGES per article: ~100k passages),
# entity popularity from the real 2012 page views continued by the Zipf model. Every system
# (cloud-only, edge IVF, exact and semantic caches, HaS over tau and without its fuzzy
# channel) gets the same queries behind the paper's network model; prints the folder holding
# report.json, report.md and the plots.
#
#   bench/has-eval.sh                    EntityQuestions over the entity corpus
#   bench/has-eval.sh --questions FILE   any EntityQuestions-format file (JSON lines, gz or not)
#   bench/has-eval.sh --split tuning     one side of the subject split of bench/eq-split.py
#                                        (tuning: where defaults are chosen; reporting: where
#                                        they are reported, never tuned on)
#   bench/has-eval.sh --squad FILE       the earlier SQuAD evaluation (SQuAD paragraphs,
#                                        HotpotQA and wiki18 passages; SQuAD questions)
#   bench/has-eval.sh ... -- ARGS        ARGS go to hasten-loadtest eval as they are, e.g.
#                                        -- --has-variant 'rank=--set retrieval.vote_weighting=rank'
#
# Environment: QUERIES (20000; SQuAD: 5000), RATE_QPS (30, open loop), MODE (realtime, or
# replay: no emulated network, quality at full speed), MAX_PASSAGES (20), SYSTEMS, TAUS,
# THETAS (the sweeps), DATA_DIR (../shared/data), BUNDLE (where the corpus bundle is built
# once and reused; one per question file, the passages' vectors taken from another entity
# bundle when there is one), OUT (run/has-eval/<time>).
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
    --split)
      case $2 in tuning|reporting) ;; *) echo "--split is tuning or reporting" >&2; exit 2 ;; esac
      python3 bench/eq-split.py --questions "$questions" --out run/eq-split >/dev/null
      questions=run/eq-split/$2.jsonl.gz; shift 2 ;;
    --) shift; break ;;
    -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
    *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
rate=${RATE_QPS:-30}
mode=${MODE:-realtime}
out=${OUT:-run/has-eval/$(date +%Y%m%d-%H%M%S)}
systems=${SYSTEMS:-cloud-only,edge-ivf,exact-cache,semantic-cache,has,has-no-fuzzy,has-no-fuzzy-validation,has-no-fuzzy-draft}
taus=${TAUS:-0.1,0.2,0.3,0.4,0.5,0.6}
thetas=${THETAS:-0.8,0.85,0.9,0.95}

if [ -n "$squad" ]; then
  [ -f "$squad" ] || { echo "no SQuAD file at $squad" >&2; exit 2; }
  queries=${QUERIES:-5000}
  bundle=${BUNDLE:-run/has-eval/bundle}
  corpus=(--squad "$squad")
  if [ -f "$data/hotpotqa-distractor-500.jsonl" ]; then
    corpus+=(--hotpot "$data/hotpotqa-distractor-500.jsonl")
  fi
  if [ -f "$data/wiki18-passages-1000.jsonl" ]; then
    corpus+=(--wiki18 "$data/wiki18-passages-1000.jsonl")
  fi
  popularity=()
else
  articles=$data/wiki-entity-articles.jsonl.gz
  views=$data/pageviews-2012-daily-top.csv.gz
  for f in "$questions" "$articles" "$views"; do
    [ -f "$f" ] || { echo "missing $f (see $data/README.md)" >&2; exit 2; }
  done
  queries=${QUERIES:-20000}
  name=$(basename "$questions")
  name=${name%.gz}
  name=${name%.jsonl}
  bundle=${BUNDLE:-run/has-eval/entity-bundle-$name}
  corpus=(--wiki-articles "$articles" --max-passages-per-article "${MAX_PASSAGES:-20}"
    --entity-questions "$questions" --entity-questions-with-article)
  popularity=(--topviews "$views")
fi

cargo build --release --bins
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
mkdir -p "$out"

if [ -z "$squad" ] && [ ! -f "$bundle/manifest.json" ]; then
  # The passages are the same whatever the questions: the bundle of other questions lends
  # its vectors (cloud-index build reuses those of a bundle at its output path), so only a
  # first bundle encodes the ~100k passages (about 40 minutes here).
  rm -rf "$bundle.partial"
  for other in run/has-eval/entity-bundle-*/; do
    if [ -f "$other/manifest.json" ]; then
      cp -r "${other%/}" "$bundle.partial"
      break
    fi
  done
  "$target/release/cloud-index" build "${corpus[@]}" --out "$bundle.partial"
  mv "$bundle.partial" "$bundle"
fi
# A bundle built earlier is reused as is.
if [ -f "$bundle/manifest.json" ]; then
  corpus=(--bundle "$bundle")
fi

# The paper's network: client-edge round trip U(0.01, 0.05) s, edge-cloud U(0.1, 0.2) s,
# paid on the wire by the relays as one-way delays of half that per packet.
"$target/release/hasten-loadtest" eval "${corpus[@]}" --bundle-out "$bundle" \
  "${popularity[@]}" --queries "$queries" --rate "$rate" --mode "$mode" \
  --client-delay uniform:0.005,0.025 --cloud-delay uniform:0.05,0.1 \
  --systems "$systems" --taus "$taus" --thetas "$thetas" \
  --save-workload "$out/workload.jsonl" \
  --out "$out" "$@" 2>&1 | tee "$out/eval.log"
echo "report: $out"
