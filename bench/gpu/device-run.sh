#!/usr/bin/env bash
# Runs on a lent GPU machine (no Rust, no network), from the repository root, over what
# bench/gpu/pack.sh put under .gpu/ (carried there in parts, one per call: .gpu/part-*;
# see docs/benchmarks/gpu.md).
#   bench/gpu/device-run.sh probe      what the machine has (GPU, CUDA libraries, glibc)
#   bench/gpu/device-run.sh build      `cloud-index build --device cuda` over HotpotQA-500
#   bench/gpu/device-run.sh encoder    encoder bench: candle on the CPU against CUDA
#   bench/gpu/device-run.sh fusionrag  FusionRAG evaluation with --device cuda [eval args]
#   bench/gpu/device-run.sh fusionrag-squad
#                                      the same on SQuAD questions, each with its top 5 passages
#                                      retrieved from a SQuAD bundle built here on CUDA [eval args]
# Results go to $OUT (the device tool brings that folder back).
set -uo pipefail
here=$(pwd)
gpu=$here/.gpu
work=/tmp/hasten-gpu
out=${OUT:-$work/out}
mkdir -p "$work" "$out"

cuda_libs() {
    # The image's PyTorch ships the CUDA 13 libraries the binaries were linked against.
    local venv=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/cu13/lib
    if [ -e "$venv/libcublas.so.13" ]; then
        echo "$venv"
    else
        find / -xdev -name 'libcublas.so.13' -printf '%h\n' 2>/dev/null | sort -u | paste -sd:
    fi
}

unpack() {
    if [ ! -e "$gpu/bins.tar.xz" ]; then
        ls "$gpu"/part-* >/dev/null 2>&1 || { echo "nothing under .gpu: run bench/gpu/pack.sh"; exit 2; }
        cat "$gpu"/part-* | tar -x -C "$gpu" || { echo "the parts do not make the payload"; exit 2; }
    fi
    if [ ! -x "$work/bin/cloud-index" ]; then
        tar -xJf "$gpu/bins.tar.xz" -C "$work" || { echo "no binaries: carry .gpu/bins.tar.xz"; exit 2; }
    fi
    export LD_LIBRARY_PATH="$work/lib:$(cuda_libs):${LD_LIBRARY_PATH:-}"
    export HASTEN_MODEL_DIR=$gpu/minilm
    for b in "$work"/bin/*; do
        if ldd "$b" | grep -q 'not found'; then
            echo "$b is missing libraries:"; ldd "$b" | grep 'not found'; exit 2
        fi
    done
}

lm_model() {
    cat "$gpu"/lm/part-* > "$work/model.gguf"
    if [ "$(sha256sum "$work/model.gguf" | cut -c1-64)" != "$(cat "$gpu/lm/SHA256")" ]; then
        echo "the model's parts do not add up: carry every .gpu/part-* (one per call)"; exit 2
    fi
}

case "${1:-}" in
probe)
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    ldd --version | head -1
    echo "CUDA library folders: $(cuda_libs)"
    ldconfig -p | grep -E 'libgomp|libopenblas|libblas|libgfortran|libstdc' | head
    ls -la "$gpu" "$gpu"/* 2>/dev/null | head -40
    ;;
build)
    unpack
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
    "$work/bin/cloud-index" build --device cuda --hotpot "$gpu/data/hotpotqa-distractor-500.jsonl" \
        --model-dir "$gpu/minilm" --out "$work/bundle-cuda" 2>&1 | grep -E 'encoder loaded|bundle ready|Error|error' \
        | tee "$out/build-cuda.txt"
    ;;
encoder)
    unpack
    "$work/bin/hasten-encoder-bench" --hotpot "$gpu/data/hotpotqa-distractor-500.jsonl" \
        --questions "$gpu/data/entityquestions-2000.jsonl.gz" \
        --passages "${PASSAGES:-2048}" --queries 200 --runtimes candle,cuda --model-dir "$gpu/minilm" \
        --out "$out/encoder.json" 2>&1 | tee "$out/encoder.txt"
    ;;
fusionrag)
    unpack
    lm_model
    shift
    "$work/bin/hasten-fusionrag-eval" "$gpu/data/hotpotqa-distractor-100.jsonl" --device cuda \
        --model "$work/model.gguf" --encoder "$gpu/minilm" --work "$work/fusionrag" "$@" \
        2>&1 | tee "$out/fusionrag.txt"
    cp "$work"/fusionrag/*.json "$out"/ 2>/dev/null
    ;;
fusionrag-squad)
    unpack
    lm_model
    shift
    if [ ! -d "$work/squad-bundle" ]; then
        "$work/bin/cloud-index" build --device cuda --squad "$gpu/data/squad-dev-v1.1-visible.json" \
            --model-dir "$gpu/minilm" --out "$work/squad-bundle" 2>&1 \
            | grep -E 'encoder loaded|bundle ready|Error|error' | tee "$out/squad-build.txt"
    fi
    "$work/bin/hasten-fusionrag-eval" "$gpu/data/squad-questions.jsonl" --device cuda \
        --retrieve-from "$work/squad-bundle" --passages 5 \
        --model "$work/model.gguf" --encoder "$gpu/minilm" --work "$work/fusionrag-squad" "$@" \
        2>&1 | tee "$out/fusionrag-squad.txt"
    mkdir -p "$out/squad"
    cp "$work"/fusionrag-squad/*.json "$out"/squad/ 2>/dev/null
    ;;
*)
    echo "usage: $0 probe|build|encoder|fusionrag|fusionrag-squad [eval args]"; exit 2
    ;;
esac
