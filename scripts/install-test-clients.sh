#!/usr/bin/env bash
# Installs the client libraries the integration tests talk to Hasten with, into a virtual
# environment at $1: the OpenAI Python SDK (tests/tests/answers.rs drives /v1/chat/completions
# with it, as an application would).
set -euo pipefail
venv=${1:?usage: install-test-clients.sh VENV_DIR}
openai_version=3.54.0
if [ -x "$venv/bin/python" ] && "$venv/bin/python" -c "import openai, sys; sys.exit(openai.__version__ != '$openai_version')" 2>/dev/null; then
    exit 0
fi
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet --disable-pip-version-check "openai==$openai_version"
echo "installed openai $openai_version into $venv" >&2
