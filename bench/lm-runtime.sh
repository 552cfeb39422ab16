#!/usr/bin/env bash
# hasten-lm against llama.cpp on the same GGUF file, same machine, same thread count, in one
# script: prefill tokens/s at 128/512/2,048 tokens and decode tokens/s at batch 1 and 5, after
# 16-token prompts and after 1,024-token prompts (a RAG answer decodes after a long prompt).
# llama.cpp is llama-cpp-python from PyPI (compiled here at first use, ~5 minutes), driven by
# bench/lm-peer.py. Figures: docs/benchmarks/lm-runtime.md.
#   bench/lm-runtime.sh [THREADS]      default 2; models: every one `make models(-large)` installed
# Environment: MODELS (GGUF names without .gguf, space-separated; default all three), REPEAT
# (timed runs per measure, default 3), LONG_BATCHES (batch sizes after 1,024-token prompts,
# default 1,5: each run prefills B x 1,024 tokens untimed, minutes on the 1.5B model).
# Besides `fast` (what the edge serves with), `q8_0` decodes as `fast` did before Hasten's
# own kernels (candle's, on Q8_0 copies of Q4_1/Q5_0), `fast-candle-attention` as `fast` did
# before lm's attention kernels (decoding's and prompts'), and `fast`'s greedy tokens on five prompts are
# compared with `as_stored`'s (candle's kernels and attention on the file's blocks).
# Run it on an idle machine: candle's CPU thread pool spins at barriers, so a busy neighbour
# costs it far more than its share.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
repeat=${REPEAT:-3}
long_batches=${LONG_BATCHES:-1,5}
models=${MODELS:-SmolLM2-135M-Instruct.Q4_1 qwen2.5-coder-0.5b-instruct-q4_k_m qwen2.5-coder-1.5b-instruct-q4_k_m}
lm_dir=${HASTEN_LM_DIR:-models/lm}
cache=${HASTEN_CI_CACHE:-$HOME/.cache/hasten-ci}
venv=$cache/tools/llama-cpp-venv
out=run/lm-runtime
mkdir -p "$out"

make models LM_DIR="$lm_dir" >/dev/null
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import llama_cpp' 2>/dev/null; then
    python3 -m venv "$venv"
    CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) "$venv/bin/pip" install --quiet llama-cpp-python==0.3.36
fi
cargo build --release -p hasten-bench --bin hasten-lm-bench
bin="${CARGO_TARGET_DIR:-target}/release/hasten-lm-bench"

for name in $models; do
    model=$lm_dir/$name.gguf
    [ -f "$model" ] || continue
    "$venv/bin/python" bench/lm-peer.py --model "$model" --threads "$threads" --prefill 128,512,2048 \
        --decode-tokens 64 --batches 1,5 --repeat "$repeat" --out "$out/$name.llama-cpp.json"
    # `fast` is what the edge serves with; `as_stored` (candle's kernels on the file's own
    # block types, scalar for Q4_1 and Q5_0) only at the short prompt, for reference; `q8_0`
    # for its decoding only (before Hasten's kernels, `fast` decoded exactly so).
    RAYON_NUM_THREADS=$threads "$bin" --model "$model" --threads "$threads" --weights fast \
        --repeat "$repeat" --score-rows 0 --greedy-against as_stored --out "$out/$name.hasten-fast.json"
    RAYON_NUM_THREADS=$threads "$bin" --model "$model" --threads "$threads" --weights as_stored \
        --prefill 128 --repeat 1 --score-rows 0 --out "$out/$name.hasten-as_stored.json"
    RAYON_NUM_THREADS=$threads "$bin" --model "$model" --threads "$threads" --weights q8_0 \
        --prefill 128 --repeat "$repeat" --score-rows 0 --out "$out/$name.hasten-q8_0.json"
    # `fast` with attention through candle's operations (before lm's attention kernels:
    # decoding's one pass over the cache, prompts' blocks of queries).
    RAYON_NUM_THREADS=$threads "$bin" --model "$model" --threads "$threads" --weights fast \
        --candle-attention --repeat "$repeat" --score-rows 0 \
        --out "$out/$name.hasten-fast-candle-attention.json"
    # Decoding after a long prompt (its prefill is not timed; the 128-token prefill is only
    # there because both tools measure one).
    "$venv/bin/python" bench/lm-peer.py --model "$model" --threads "$threads" --prefill 128 \
        --decode-tokens 64 --batches "$long_batches" --decode-context 1024 --repeat "$repeat" \
        --out "$out/$name.long.llama-cpp.json"
    for variant in fast q8_0 fast-candle-attention; do
        flags=(--weights "${variant%%-*}")
        [ "$variant" = fast-candle-attention ] && flags+=(--candle-attention)
        RAYON_NUM_THREADS=$threads "$bin" --model "$model" --threads "$threads" "${flags[@]}" \
            --prefill 128 --batches "$long_batches" --decode-context 1024 --repeat "$repeat" \
            --score-rows 0 --out "$out/$name.long.hasten-$variant.json"
    done
done

python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = []
for peer_file in sorted(out.glob("*.llama-cpp.json")):
    name = peer_file.name[: -len(".llama-cpp.json")]
    peer = json.loads(peer_file.read_text())
    for weights in ("as_stored", "q8_0", "fast-candle-attention", "fast"):
        ours_file = out / f"{name}.hasten-{weights}.json"
        if not ours_file.exists():
            continue
        ours = json.loads(ours_file.read_text())
        peer_prefill = {p["tokens"]: p for p in peer["prefill"]}
        long_run = name.endswith(".long")
        # q8_0 stands for `fast` before Hasten's kernels in decoding only, and
        # fast-candle-attention for `fast` before lm's attention kernels.
        for a in ([] if long_run or weights == "q8_0" else ours["prefill"]):
            b = peer_prefill[a["tokens"]]
            rows.append((name, weights, f"prefill {a['tokens']}", a["tokens_per_s"], b["tokens_per_s"]))
        for a, b in zip(ours["decode"], peer["decode"]):
            assert a["context"] == b["context"], (a, b)
            rows.append((name.removesuffix(".long"), weights, f"decode b{a['batch']} ctx {a['context']}", a["aggregate_tokens_per_s"], b["aggregate_tokens_per_s"]))
report = [dict(model=m, weights=w, measure=x, hasten_tokens_per_s=round(h, 1), llama_cpp_tokens_per_s=round(l, 1), ratio=round(h / l, 2)) for m, w, x, h, l in rows]
(out / "report.json").write_text(json.dumps(report, indent=1))
print(f"{'model':<40} {'weights':<22} {'measure':<18} {'hasten':>8} {'llama.cpp':>10} {'ratio':>6}")
for r in report:
    print(f"{r['model']:<40} {r['weights']:<22} {r['measure']:<18} {r['hasten_tokens_per_s']:>8} {r['llama_cpp_tokens_per_s']:>10} {r['ratio']:>6}")
print("\ngreedy tokens, fast against as_stored (64 steps, 5 prompts):")
for fast_file in sorted(out.glob("*.hasten-fast.json")):
    greedy = json.loads(fast_file.read_text()).get("greedy") or {}
    for p in greedy.get("prompts", []):
        verdict = "identical" if p["identical"] else (
            f"first differs at step {p['first_difference']} (reference logit gap {p['reference_logit_gap']:.3f})")
        print(f"  {fast_file.name.removesuffix('.hasten-fast.json'):<40} prompt {p['prompt']}: {verdict}")
PY
