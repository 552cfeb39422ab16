#!/usr/bin/env bash
# Runs Hasten end to end on loopback: builds (or reuses) a corpus bundle cut into 2 shards,
# then lets hasten-loadtest start the cloud tier (2 shard servers behind a router) and, per
# system, 2 edges behind the emulated network: cloud-only edges, isolated HaS edges, and HaS
# edges sharing their hot cache through a 3-node Raft control plane. The same
# popularity-skewed questions go through each; the comparison shows, among others, drafts
# accepted on one edge thanks to a fallback on the other. Last, one edge answers a few
# questions through /v1/answer (standard and speculative RAG) with the 0.5B model, showing
# where the time went, and a short load run compares the whole answer path. Every process
# is stopped at the end.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin=$target/debug
data=${DATA_DIR:-../shared/data}
run=run/demo
queries=${DEMO_QUERIES:-400}
rate=${DEMO_RATE_QPS:-20}
mkdir -p "$run"

squad=$data/squad-dev-v1.1-visible.json
if [ -f "$squad" ]; then
  corpus=(--squad "$squad")
  [ -f "$data/hotpotqa-distractor-100.jsonl" ] && corpus+=(--hotpot "$data/hotpotqa-distractor-100.jsonl")
  [ -f "$data/wiki18-passages-1000.jsonl" ] && corpus+=(--wiki18 "$data/wiki18-passages-1000.jsonl")
  bundle=$run/bundle-real
  echo "corpus: SQuAD + HotpotQA + wiki18 passages from $data (the first build encodes them, a few minutes)"
else
  corpus=()
  bundle=$run/bundle-synthetic
  echo "corpus: $data not found, using the synthetic knowledge base"
fi
"$bin/cloud-index" build "${corpus[@]}" --out "$bundle" --shards 2

echo
echo "$queries TopViews-shaped questions at $rate q/s over 2 edges per system, client-edge and edge-cloud delays on the wire"
"$bin/hasten-loadtest" eval --bundle "$bundle" --shards 2 --edges 2 --queries "$queries" \
  --rate "$rate" --systems cloud-only,has,has-replicated --taus 0.4 --out "$run/report"

python3 - "$run/report/report.json" <<'SUMMARY'
import json, sys
systems = {s["name"]: s for s in json.load(open(sys.argv[1]))["systems"]}
isolated, shared = systems["has"], systems["has-replicated"]
print(f"2 isolated HaS edges: DAR {isolated['dar']:.3f}, {isolated['cross_edge_accepted']} drafts accepted through the other edge's fallbacks")
print(f"2 replicated HaS edges: DAR {shared['dar']:.3f}, {shared['cross_edge_accepted']} drafts accepted through the other edge's fallbacks (learned through the control plane)")
SUMMARY

lm_dir=${HASTEN_LM_DIR:-models/lm}
lm_drafter=$lm_dir/SmolLM2-135M-Instruct.Q4_1.gguf
# `make models` installs Qwen2.5-Coder-0.5B to answer: the best answers under ~10 s on 2 cores
# (docs/benchmarks/answers.md, "Answering models side by side"); the 135M model drafts.
lm_model=$lm_dir/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
if [ ! -f "$lm_model" ]; then
  echo "$lm_model is missing (\`make models\` installs it): answering with the 135M model, which rarely answers right"
  lm_model=$lm_drafter
fi
echo
echo "answers through /v1/answer: a cloud index and one edge answering with $(basename "$lm_model"), drafts by $(basename "$lm_drafter")"
rm -f "$run"/answer-*.ready "$run"/answer-cloud.pem
"$bin/cloud-index" serve --bundle "$bundle" --quic-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 \
  --metrics-addr 127.0.0.1:0 --dev-cert-out "$run/answer-cloud.pem" --ready-file "$run/answer-cloud.ready" \
  > "$run/answer-cloud.log" 2>&1 &
cloud_pid=$!
trap 'kill $cloud_pid ${edge_pid:-} 2>/dev/null || true' EXIT
for _ in $(seq 600); do [ -s "$run/answer-cloud.ready" ] && break; sleep 0.1; done
quic=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["quic_addr"])' "$run/answer-cloud.ready")
"$bin/edge-node" serve --bundle "$bundle" --cloud-addr "$quic" --cloud-ca "$run/answer-cloud.pem" \
  --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 --lm-model "$lm_model" --lm-drafter "$lm_drafter" \
  --ready-file "$run/answer-edge.ready" > "$run/answer-edge.log" 2>&1 &
edge_pid=$!
for _ in $(seq 1200); do [ -s "$run/answer-edge.ready" ] && break; sleep 0.1; done
edge=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["http_addr"])' "$run/answer-edge.ready")
python3 - "$edge" "$bundle/questions.jsonl" <<'ANSWERS'
import json, sys, urllib.request
sys.path.insert(0, "bench")
from answer_eval import score
edge, questions = sys.argv[1], sys.argv[2]
asked = [json.loads(line) for line in open(questions)][:5]
scores = {"standard": [], "speculative": []}
# The first five questions in standard RAG, the first two also in Speculative RAG (each
# answer there takes several times as long on 2 cores).
for i, q in enumerate(asked):
    for mode in ("standard", "speculative")[: 2 if i < 2 else 1]:
        body = json.dumps({"question": q["question"], "k": 5, "mode": mode, "max_tokens": 32}).encode()
        request = urllib.request.Request(f"http://{edge}/v1/answer", body, {"Content-Type": "application/json"})
        reply = json.load(urllib.request.urlopen(request, timeout=300))
        t = reply["timings"]
        scored = score(reply["answer"], q["answers"])
        scores[mode].append(scored)
        print(f"[{mode:>11}] {q['question']}\n              -> {reply['answer'].strip()!r} (gold: {q['answers'][0]!r}; "
              f"EM {scored['em']:.0f}, F1 {scored['f1']:.2f})")
        print(f"              retrieve {t['retrieve_ms']:.0f} ms ({reply['retrieval']}), prefill {t['prefill_ms']:.0f} ms, "
              f"first token {t['first_token_ms']:.0f} ms, decode {t['decode_ms']:.0f} ms, verify {t['verify_ms']:.0f} ms, "
              f"total {t['total_ms']:.0f} ms, {reply['generated_tokens']} tokens")
for mode, rows in scores.items():
    print(f"{mode}: EM {sum(r['em'] for r in rows) / len(rows):.2f}, F1 {sum(r['f1'] for r in rows) / len(rows):.2f} "
          f"over {len(rows)} questions (too few to rank anything; see docs/benchmarks/answers.md for 100-question runs)")
ANSWERS

# The whole answer path under load (docs/benchmarks/answers-under-load.md): the standard RAG
# stack (cloud retrieval, full prefill on KV workers) against Hasten (replicated HaS edges,
# FusionRAG KV reuse, KV-aware routing), the same streamed questions at the same times.
kill $cloud_pid $edge_pid 2>/dev/null || true
answer_queries=${DEMO_ANSWER_QUERIES:-24}
answer_rate=${DEMO_ANSWER_RATE_QPS:-0.5}
if [ -f "$squad" ]; then
  python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); d["data"]=d["data"][:1]; json.dump(d,open(sys.argv[2],"w"))' \
    "$squad" "$run/answer-squad.json"
  answer_corpus=(--squad "$run/answer-squad.json" --bundle-out "$run/bundle-answers")
else
  answer_corpus=(--bundle "$bundle")
fi
echo
# SmolLM2 whichever model answered above: on 2 cores the 0.5B model's prefill saturates the
# workers at this rate, and the rows would take ten minutes.
echo "the whole answer path: $answer_queries streamed questions at $answer_rate q/s, standard RAG against Hasten, $(basename "$lm_drafter") on 2 KV workers"
echo "(the first run preprocesses the corpus's chunk KV once, a minute or two)"
"$bin/hasten-loadtest" answers "${answer_corpus[@]}" --lm-model "$lm_drafter" \
  --kv-store "$run/kv-store-$(basename "$lm_drafter" .gguf)" --queries "$answer_queries" \
  --rates "$answer_rate" --systems standard,hasten --max-tokens 16 --ttft-slo 5s \
  --out "$run/answers" > "$run/answers.log" 2>&1 || { tail -20 "$run/answers.log"; exit 1; }
python3 - "$run/answers/report.json" <<'ROWS'
import json, sys
report = json.load(open(sys.argv[1]))
print(f"{'system':<10} {'answered':>9} {'TTFT p50':>9} {'TTFT p99':>9} {'goodput/s':>10} {'accepted':>9} {'KV in RAM':>10} {'F1':>6} {'dF1 vs standard':>16}")
for run in report["runs"]:
    a = run["all"]
    kv = a["kv"]["memory_hit_rate"]
    paired = run.get("paired_vs_baseline") or {}
    print(f"{run['name']:<10} {a['answered']:>5} / {a['questions']:<2} {a['ttft_s']['p50']:>8.2f}s {a['ttft_s']['p99']:>8.2f}s {a['goodput']:>10.3f} "
          f"{a['accepted'] / max(a['answered'], 1):>9.2f} {kv if kv is None else round(kv, 2)!s:>10} {a['quality']['f1']:>6.3f} "
          f"{paired.get('f1', 0):>+9.3f} ({paired.get('pairs', 0)})")
print(f"goodput: answers/s whose first token came within {report['runs'][0]['all']['ttft_slo_s']:.0f} s; "
      "a debug build on this machine, a few dozen questions: see docs/benchmarks/answers-under-load.md for measured runs")
ROWS
echo "report: $run/answers/report.md"
