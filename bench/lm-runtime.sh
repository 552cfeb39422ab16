#!/usr/bin/env bash
# hasten-lm against llama.cpp on the same GGUF file, same machine, same thread count, in one
# script: prefill tokens/s at 128/512/2,048 tokens and decode tokens/s at batch 1 and 5, after
# 16-token prompts and after 1,024-token prompts (a RAG answer decodes after a long prompt).
# llama.cpp is llama-cpp-python from PyPI (compiled here at first use, ~5 minutes), driven by
# bench/lm-peer.py. Figures: docs/benchmarks/lm-runtime.md.
#   bench/lm-runtime.sh [THREADS]      default 2; models: every one `make models(-large)` installed
# Run it on an idle machine: candle's CPU thread pool spins at barriers, so a busy neighbour
# costs it far more than its share.
set -euo pipefail
cd "$(dirname "$0")/.."
threads=${1:-2}
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

for model in "$lm_dir"/SmolLM2-135M-Instruct.Q4_1.gguf "$lm_dir"/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf; do
    [ -f "$model" ] || continue
    name=$(basename "$model" .gguf)
    "$venv/bin/python" bench/lm-peer.py --model "$model" --threads "$threads" --prefill 128,512,2048 \
        --decode-tokens 64 --batches 1,5 --repeat 3 --out "$out/$name.llama-cpp.json"
    # `fast` is what the edge serves with; `as_stored` (candle's kernels on the file's own
    # block types, scalar for Q4_1) only at the short prompt, for reference.
    RAYON_NUM_THREADS=$threads "$bin" --model "$model" --threads "$threads" --weights fast \
        --repeat 3 --out "$out/$name.hasten-fast.json"
    RAYON_NUM_THREADS=$threads "$bin" --model "$model" --threads "$threads" --weights as_stored \
        --prefill 128 --repeat 1 --out "$out/$name.hasten-as_stored.json"
    # Decoding after a long prompt (its prefill is not timed; the 128-token prefill is only
    # there because both tools measure one).
    "$venv/bin/python" bench/lm-peer.py --model "$model" --threads "$threads" --prefill 128 \
        --decode-tokens 64 --batches 1,5 --decode-context 1024 --repeat 3 \
        --out "$out/$name.long.llama-cpp.json"
    RAYON_NUM_THREADS=$threads "$bin" --model "$model" --threads "$threads" --weights fast \
        --prefill 128 --decode-context 1024 --repeat 3 --out "$out/$name.long.hasten-fast.json"
done

python3 - "$out" <<'PY'
import json, pathlib, sys
out = pathlib.Path(sys.argv[1])
rows = []
for peer_file in sorted(out.glob("*.llama-cpp.json")):
    name = peer_file.name[: -len(".llama-cpp.json")]
    peer = json.loads(peer_file.read_text())
    for weights in ("as_stored", "fast"):
        ours_file = out / f"{name}.hasten-{weights}.json"
        if not ours_file.exists():
            continue
        ours = json.loads(ours_file.read_text())
        peer_prefill = {p["tokens"]: p for p in peer["prefill"]}
        long_run = name.endswith(".long")
        for a in ([] if long_run else ours["prefill"]):
            b = peer_prefill[a["tokens"]]
            rows.append((name, weights, f"prefill {a['tokens']}", a["tokens_per_s"], b["tokens_per_s"]))
        for a, b in zip(ours["decode"], peer["decode"]):
            assert a["context"] == b["context"], (a, b)
            rows.append((name.removesuffix(".long"), weights, f"decode b{a['batch']} ctx {a['context']}", a["aggregate_tokens_per_s"], b["aggregate_tokens_per_s"]))
report = [dict(model=m, weights=w, measure=x, hasten_tokens_per_s=round(h, 1), llama_cpp_tokens_per_s=round(l, 1), ratio=round(h / l, 2)) for m, w, x, h, l in rows]
(out / "report.json").write_text(json.dumps(report, indent=1))
print(f"{'model':<40} {'weights':<10} {'measure':<18} {'hasten':>8} {'llama.cpp':>10} {'ratio':>6}")
for r in report:
    print(f"{r['model']:<40} {r['weights']:<10} {r['measure']:<18} {r['hasten_tokens_per_s']:>8} {r['llama_cpp_tokens_per_s']:>10} {r['ratio']:>6}")
PY
