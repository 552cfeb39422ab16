#!/usr/bin/env bash
# Restart time of a control-plane member: two builds of `control-plane` started in turn on
# fresh copies of one node's data directory, each timed from spawn until it writes its ready
# file (its log opened and replayed, its ports bound).
#
#   bench/restart-ab.sh OLD_BINARY NEW_BINARY DATA_DIR [TRIALS]
#
# DATA_DIR: a member's data directory, e.g. `<work>/node-1` left by
# `hasten-replication-bench --work <work> --fill 60` (its nodes are killed at the end, so the
# directory is a crashed member's, with a log that has run: its last segment a reused file).
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n 2,10p "$0" >&2
  exit 2
fi
OLD=$1 NEW=$2 DATA=$3 TRIALS=${4:-4}
[ -d "$DATA" ] || { echo "no data directory at $DATA" >&2; exit 2; }
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
for trial in $(seq 1 "$TRIALS"); do
  for variant in old new; do
    binary=$OLD
    [ "$variant" = new ] && binary=$NEW
    rm -rf "$WORK/data" "$WORK/ready.json"
    cp -a "$DATA" "$WORK/data"
    # The copy's write-back finishes before the clock starts.
    sync; sleep 4
    start=$(date +%s%N)
    "$binary" --id 1 --listen 127.0.0.1:17401 --metrics-addr 127.0.0.1:0 \
      --peer 1=127.0.0.1:17401 --peer 2=127.0.0.1:17402 --peer 3=127.0.0.1:17403 \
      --data-dir "$WORK/data" --ready-file "$WORK/ready.json" 2> "$WORK/$variant.log" &
    pid=$!
    while [ ! -s "$WORK/ready.json" ]; do
      kill -0 "$pid" 2> /dev/null || { cat "$WORK/$variant.log" >&2; exit 1; }
      sleep 0.005
    done
    end=$(date +%s%N)
    kill "$pid"; wait "$pid" || true
    echo "trial $trial $variant: ready after $(( (end - start) / 1000000 )) ms"
  done
done
rm -rf "$WORK/data"
sync
