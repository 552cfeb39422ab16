#!/usr/bin/env bash
# How a control-plane node makes its writes durable, counted: hasten-replication-bench at
# one rate with strace attached to each of its 3 nodes, counting the sync calls
# (fdatasync, fsync, sync_file_range) and the Raft Readys each node handled (its
# hasten_cp_ready_phase_seconds{phase="persist"} count, in the report).
#
#   bench/durability-strace.sh [RATE=1000] [SECONDS=8]
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-1000}
seconds=${2:-8}
command -v strace > /dev/null || { echo "needs strace (apt-get install strace)" >&2; exit 1; }
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release -p hasten-control-plane -p hasten-bench \
  --bin control-plane --bin hasten-replication-bench
work=run/durability-strace
mkdir -p "$work"
"$TARGET/release/hasten-replication-bench" --rate "$rate" --sweep "$rate" \
  --seconds "$seconds" --work "$work" > "$work/bench.out" 2>&1 &
bench=$!
# The nodes are up once their ready files are written.
for _ in $(seq 100); do
  [ "$(ls "$work"/node-*.ready.json 2> /dev/null | wc -l)" -eq 3 ] && break
  sleep 0.1
done
tracers=()
for id in 1 2 3; do
  pid=$(pgrep -f -- "--data-dir $work/node-$id( |$)" | head -1)
  strace -f -c -e trace=fdatasync,fsync,sync_file_range -o "$work/strace-node-$id.txt" \
    -p "$pid" 2> /dev/null &
  tracers+=($!)
done
wait "$bench"
wait "${tracers[@]}" || true
for id in 1 2 3; do
  echo "node $id:"
  grep -E "fdatasync|fsync|sync_file_range|total" "$work/strace-node-$id.txt" || true
done
python3 - "$work/report.json" << 'PY'
import json, sys
report = json.load(open(sys.argv[1]))
phases = report["hasten"]["ready_phases"]
print("Readys handled (all nodes, persist phase):", int(phases["persist"]["count"]))
for run in report["hasten"]["runs"]:
    print(f"offered {run['offered']} entries, applied on every follower {run['applied_everywhere']}")
PY
