#!/usr/bin/env bash
# Where a cold build's time goes: `make lint`'s clippy and `make test`'s build, run into an
# empty target directory with cargo's --timings, then each step's wall time, the time spent
# compiling code that only runs while compiling (proc macros, build scripts and their
# dependencies: "host" units) and the slowest units.
#
#   bench/build-time.sh [TARGET_DIR]   (default: a new directory under run/build-time/)
#
# TARGET_DIR must not exist or be empty: a warm directory measures nothing. The whole cold
# `.ci/run` is `HASTEN_CI_CACHE=$(mktemp -d) .ci/run` on a fresh clone; it prints each step's
# time as it goes.
set -euo pipefail
cd "$(dirname "$0")/.."

target=${1:-run/build-time/$(date -u +%Y%m%dT%H%M%SZ)}
if [ -d "$target" ] && [ -n "$(ls -A "$target")" ]; then
  echo "build-time: $target is not empty; give a new directory" >&2
  exit 2
fi
mkdir -p "$target"
export CARGO_TARGET_DIR=$target CARGO_INCREMENTAL=0 CARGO_TERM_COLOR=never

step() {
  local name=$1 start
  shift
  start=$(date +%s)
  "$@"
  echo "$name $(($(date +%s) - start))" >>"$target/steps.txt"
}
step clippy cargo clippy --workspace --all-targets --timings -- -D warnings
step build cargo build --workspace --bins --tests --timings

python3 - "$target" <<'EOF'
import json, pathlib, re, sys

target = pathlib.Path(sys.argv[1])
print("step       wall s")
for line in (target / "steps.txt").read_text().split("\n"):
    if line:
        name, secs = line.split()
        print(f"{name:<10} {int(secs):>6}")
reports = sorted((target / "cargo-timings").glob("cargo-timing-*.html"))
for step, report in zip(["clippy", "build"], reports):
    units = json.loads(re.search(r"const UNIT_DATA = (\[.*?\]);\n", report.read_text(), re.S).group(1))
    total = sum(u["duration"] for u in units)
    # cargo labels a unit built for the target "(check)", "(test)", "build-script" and so
    # on; a plain library unit in a clippy run is one compiled for the host.
    host = sum(u["duration"] for u in units if u["target"].strip() == "")
    print(f"\n{step}: {len(units)} units, {total:.0f} unit-seconds"
          + (f", {host:.0f} of them host libraries (proc macros and their dependencies)" if step == "clippy" else ""))
    for u in sorted(units, key=lambda u: -u["duration"])[:12]:
        print(f"  {u['duration']:7.1f} s  {u['name']} {u['target'].strip()}")
EOF
