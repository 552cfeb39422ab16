#!/usr/bin/env bash
# Decoding tokens/s of one or more hasten-lm-bench binaries and of llama.cpp on one GGUF
# file, in interleaved rounds (each round runs every binary, then the peer), so that a
# machine whose speed drifts treats them alike. Use it to compare a kernel change against
# the binary before it and against llama.cpp; bench/lm-runtime.sh is the full one-sample
# comparison. Figures: docs/benchmarks/lm-runtime.md.
#   bench/lm-decode-rounds.sh MODEL ROUNDS BIN...
# Environment: THREADS (default 2), BATCHES (default 1,5), STEPS (decoded tokens, default
# 64), CONTEXT (prompt tokens before the decoded ones, default 16). The peer is
# bench/lm-runtime.sh's llama-cpp-python venv (run that script once, or set PEER_PYTHON).
# Reports per round and the mean per batch size in run/lm-decode-rounds/report.json.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: lm-decode-rounds.sh MODEL ROUNDS BIN...}
rounds=${2:?usage: lm-decode-rounds.sh MODEL ROUNDS BIN...}
shift 2
[ $# -gt 0 ] || { echo "lm-decode-rounds: name at least one hasten-lm-bench binary" >&2; exit 2; }
threads=${THREADS:-2}
batches=${BATCHES:-1,5}
steps=${STEPS:-64}
context=${CONTEXT:-16}
peer=${PEER_PYTHON:-${HASTEN_CI_CACHE:-$HOME/.cache/hasten-ci}/tools/llama-cpp-venv/bin/python}
[ -x "$peer" ] || { echo "lm-decode-rounds: no llama-cpp-python at $peer (run bench/lm-runtime.sh once)" >&2; exit 2; }
out=run/lm-decode-rounds
rm -rf "$out" && mkdir -p "$out"

for round in $(seq 1 "$rounds"); do
    i=0
    for bin in "$@"; do
        RAYON_NUM_THREADS=$threads "$bin" --model "$model" --threads "$threads" --weights fast \
            --prefill 16 --decode-context "$context" --batches "$batches" --decode-tokens "$steps" \
            --repeat 3 --score-rows 0 \
            --out "$out/r$round.bin$i.json" >/dev/null 2>&1
        i=$((i + 1))
    done
    "$peer" bench/lm-peer.py --model "$model" --threads "$threads" --prefill 16 \
        --decode-context "$context" --decode-tokens "$steps" --batches "$batches" --repeat 3 \
        --out "$out/r$round.peer.json" >/dev/null 2>&1
    echo "round $round of $rounds done" >&2
done

python3 - "$out" "$rounds" "$@" <<'PY'
import json, pathlib, statistics, sys
out, rounds, bins = pathlib.Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
names = [f"bin{i}" for i in range(len(bins))] + ["peer"]
labels = dict(zip(names, bins + ["llama.cpp"]))
rates = {}  # (name, batch) -> tokens/s per round
for r in range(1, rounds + 1):
    for name in names:
        for d in json.loads((out / f"r{r}.{name}.json").read_text())["decode"]:
            rates.setdefault((name, d["batch"]), []).append(d["aggregate_tokens_per_s"])
report = [dict(system=labels[n], batch=b, rounds=v, mean=round(statistics.mean(v), 2))
          for (n, b), v in sorted(rates.items(), key=lambda kv: (kv[0][1], names.index(kv[0][0])))]
(out / "report.json").write_text(json.dumps(report, indent=1) + "\n")
for row in report:
    peer = statistics.mean(rates[("peer", row["batch"])])
    print(f"b{row['batch']:<3} {row['system']:<40} mean {row['mean']:>7.2f} tokens/s "
          f"({row['mean'] / peer:.2f}x llama.cpp)  rounds {[round(x, 1) for x in row['rounds']]}")
PY
