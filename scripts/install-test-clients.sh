#!/usr/bin/env bash
# Installs the client libraries the integration tests talk to Hasten with, pinned so that a
# run is repeatable, into two virtual environments under $1:
#   openai-venv       the OpenAI Python SDK (tests/tests/answers.rs)
#   rag-clients-venv  LangChain's ChatOpenAI and LlamaIndex's OpenAILike, with the OpenAI SDK
#                     they support (LlamaIndex needs openai < 3), for tests/tests/chat_clients.rs
#   llama-server-venv llama.cpp's own HTTP server, prebuilt in the xllamacpp wheel (MIT,
#                     github.com/xorbitsai/xllamacpp, llama.cpp build b11549, CPU with AVX2), the
#                     real engine of tests/tests/engine.rs; the wheel's SHA-256 is pinned
set -euo pipefail
dir=${1:?usage: install-test-clients.sh DIR}

install() {
    local venv=$1; shift
    local stamp="$venv/.hasten-pins" pins="$*"
    if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$pins" ]; then
        return 0
    fi
    rm -rf "$venv"
    python3 -m venv "$venv"
    if [ "$1" = --require-hashes ]; then
        shift
        printf '%s\n' "$@" > "$venv/requirements.txt"
        "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: \
            --require-hashes -r "$venv/requirements.txt"
    else
        "$venv/bin/pip" install --quiet --disable-pip-version-check --only-binary=:all: "$@"
    fi
    echo "$pins" > "$stamp"
    echo "installed $pins into $venv" >&2
}

install "$dir/openai-venv" "openai==3.54.0"
install "$dir/rag-clients-venv" \
    "openai==2.54.0" \
    "langchain-openai==1.7.4" "langchain-core==1.8.3" \
    "llama-index-llms-openai-like==0.8.1" "llama-index-llms-openai==0.8.3" "llama-index-core==0.14.25"
install "$dir/llama-server-venv" --require-hashes \
    "xllamacpp==2026.10.11549 --hash=sha256:c54e7d13520ecc989c63dc99d55de3065e2f343a91f43f053d16b5e62077c261"
