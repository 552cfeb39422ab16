#!/usr/bin/env bash
# Builds the CUDA binaries on this machine (no GPU needed: scripts/cuda-toolchain.sh brings a
# CUDA toolchain from PyPI) and packs what bench/gpu/device-run.sh reads: bins.tar.xz
# (binaries and the BLAS libraries faiss links), minilm/ (the encoder, float16 weights),
# lm/part-* (the GGUF model), data/ (the HotpotQA files, SQuAD and every 25th of its
# questions), as one tar cut into .gpu/part-* of 60 MB, each of which fits the device tool's
# 64 MiB carry: carry one per call.
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${MODEL_DIR:=$HOME/.cache/hasten-ci/models/all-MiniLM-L6-v2}"
: "${LM_DIR:=$HOME/.cache/hasten-ci/models/lm}"

scripts/cuda-toolchain.sh
# shellcheck disable=SC1091
source "${HASTEN_CUDA_TOOLCHAIN:-$HOME/.cache/hasten-cuda/toolchain}/env.sh"
export CARGO_TARGET_DIR=${HASTEN_CUDA_TARGET:-$HOME/.cache/hasten-cuda/target}
cargo build -p hasten-bench --bin hasten-encoder-bench --bin hasten-fusionrag-eval --features cuda
cargo build -p hasten-cloud-index --features cuda

grep -qx '/.gpu/' .git/info/exclude || echo '/.gpu/' >> .git/info/exclude
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib" .gpu/lm .gpu/data
for bin in cloud-index hasten-encoder-bench hasten-fusionrag-eval; do
    strip -o "$stage/bin/$bin" "$CARGO_TARGET_DIR/debug/$bin"
done
for lib in libopenblas.so.0 libblas.so.3 libgfortran.so.5 libquadmath.so.0 libgomp.so.1; do
    cp -L "$(ldconfig -p | grep -m1 "$lib " | awk '{print $NF}')" "$stage/lib/$lib"
done
tar -cJf .gpu/bins.tar.xz -C "$stage" bin lib
# The float16 conversion reads the weights with numpy, in a venv of its own when the system
# Python lacks it.
py=python3
if ! python3 -c 'import numpy' 2>/dev/null; then
    venv=$HOME/.cache/hasten-cuda/venv
    [ -x "$venv/bin/python" ] || { python3 -m venv "$venv" && "$venv/bin/pip" install --quiet numpy; }
    py=$venv/bin/python
fi
"$py" bench/gpu/minilm_f16.py "$MODEL_DIR" .gpu/minilm
model=$LM_DIR/SmolLM2-135M-Instruct.Q4_1.gguf
rm -f .gpu/lm/part-*
split -b 50000000 -d "$model" .gpu/lm/part-
sha256sum "$model" | cut -c1-64 > .gpu/lm/SHA256
cp ../shared/data/hotpotqa-distractor-100.jsonl ../shared/data/hotpotqa-distractor-500.jsonl \
    ../shared/data/squad-dev-v1.1-visible.json .gpu/data/
python3 bench/squad-questions.py ../shared/data/squad-dev-v1.1-visible.json 25 > .gpu/data/squad-questions.jsonl
# sed reads to the end: head would close the pipe early and pipefail would stop the script.
zcat ../shared/data/entityquestions-train-dev.jsonl.gz | sed -n '1,2000p' | gzip > .gpu/data/entityquestions-2000.jsonl.gz
rm -f .gpu/part-*
tar -cf - -C .gpu bins.tar.xz minilm lm data | split -b 60000000 -d - .gpu/part-
ls -la .gpu/part-*
