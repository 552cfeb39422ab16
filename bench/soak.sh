#!/usr/bin/env bash
# Soak: steady TopViews-shaped load on the full local topology (2 shards x 2 replicas behind
# a router, a 3-node control plane, 2 edges with 2 tenants, mutual TLS everywhere) while
# faults are injected. Phases, by the share of the run at which each starts:
#
#   0     steady
#   0.12  replica down           a replica of shard 0 is killed
#   0.24  replica back           ... and restarted on the same port
#   0.32  cloud replica hung     a replica of shard 1 is frozen (SIGSTOP)
#   0.44  cloud replica resumed  ... and resumed (SIGCONT)
#   0.52  follower hung          a control-plane follower, the one most edges follow, is
#                                frozen (SIGSTOP); the edges start on different nodes, so
#                                while no node has failed yet one of them is on a follower
#   0.64  follower resumed       ... and resumed (SIGCONT); it must catch up
#   0.76  leader down            the control-plane leader is killed
#   0.88  leader back            ... and restarted from its data directory
#
# Prints and writes run/soak/report.json: error rate by kind and latency percentiles per
# phase, each edge's applied control-plane index through the run (and, for the hung
# follower, at the start and end of the phase with the entries committed meanwhile),
# committed entries missing from any node at the end, whether the nodes agree on one
# applied index, acknowledged proposals never committed, and cross-tenant acceptances;
# exits non-zero when an entry was lost, the nodes disagree, or a tenant was answered
# through another's cache.
#
# The soak resumes a frozen process before ending it, on errors and on SIGINT/SIGTERM/
# SIGHUP too; should it be killed outright, what it left frozen (run/soak/stopped.pids) is
# resumed and what it left running is ended here on exit.
#
#   bench/soak.sh [DURATION_S=600] [RATE_QPS=20]
set -euo pipefail
cd "$(dirname "$0")/.."
duration=${1:-600}
rate=${2:-20}
data=${DATA_DIR:-../shared/data}
run=run/soak
export HASTEN_MODEL_DIR=${HASTEN_MODEL_DIR:-$PWD/models/all-MiniLM-L6-v2}

cargo build --workspace --bins
target=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
bin=$target/debug
mkdir -p "$run"
work=$(realpath "$run")

# hasten-soak ends its processes itself, frozen ones resumed first, on errors and signals.
# Should it be killed outright, this resumes what it left frozen and ends what it left
# running: only the workspace's binaries whose command line names this soak's working
# directory (their ready files are there).
clean_up() {
  if [[ -f $work/stopped.pids ]]; then
    while read -r pid name; do
      if grep -qaF -- "$work/" "/proc/$pid/cmdline" 2> /dev/null; then
        echo "soak.sh: resuming $name (pid $pid), left frozen" >&2
        kill -CONT "$pid" 2> /dev/null || true
      fi
    done < "$work/stopped.pids"
    rm -f "$work/stopped.pids"
  fi
  local proc bin_dir
  bin_dir=$(realpath "$bin")
  for proc in /proc/[0-9]*; do
    if [[ $(readlink "$proc/exe" 2> /dev/null) == "$bin_dir"/* ]] &&
      grep -qaF -- "$work/" "$proc/cmdline" 2> /dev/null; then
      echo "soak.sh: ending $(tr '\0' ' ' < "$proc/cmdline" | cut -c1-60)... (pid ${proc#/proc/}), left running" >&2
      kill -CONT "${proc#/proc/}" 2> /dev/null || true
      kill -TERM "${proc#/proc/}" 2> /dev/null || true
    fi
  done
}
trap clean_up EXIT

# The demo's corpus (SQuAD + HotpotQA + wiki18 passages), cut into 2 shards; vectors are
# reused when the bundle exists.
bundle=run/demo/bundle-real
"$bin/cloud-index" build --squad "$data/squad-dev-v1.1-visible.json" \
  --hotpot "$data/hotpotqa-distractor-100.jsonl" --wiki18 "$data/wiki18-passages-1000.jsonl" \
  --out "$bundle" --shards 2 > /dev/null

# Enough TopViews-shaped questions for the whole run.
queries=$(python3 -c "print(int($duration * $rate * 1.2) + 100)")
"$bin/hasten-loadtest" workload --bundle "$bundle" --queries "$queries" \
  --save-workload "$run/workload.jsonl" > "$run/workload-stats.json"

"$bin/hasten-soak" --bundle "$bundle" --workload "$run/workload.jsonl" \
  --duration-s "$duration" --rate "$rate" --work "$run"
