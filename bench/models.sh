# Sourced by the benchmark scripts from the repository root: the model directories (as
# `make models` fills them, unless HASTEN_LM_DIR / HASTEN_MODEL_DIR say otherwise) and
# $model, the small language model, which must exist.
export HASTEN_LM_DIR=${HASTEN_LM_DIR:-$PWD/models/lm}
export HASTEN_MODEL_DIR=${HASTEN_MODEL_DIR:-$PWD/models/all-MiniLM-L6-v2}
model=$HASTEN_LM_DIR/SmolLM2-135M-Instruct.Q4_1.gguf
if [ ! -f "$model" ]; then
    echo "$model not found: run \`make models\`" >&2
    exit 1
fi
