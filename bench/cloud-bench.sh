#!/usr/bin/env bash
# The sharded cloud tier against one in-process faiss index: 1M x 384 synthetic vectors in
# 4 shards behind a router (real processes), single-query latency and throughput with
# micro-batching on and off. Figures: docs/benchmarks/cloud-tier.md.
# Extra arguments go to hasten-cloud-bench (see --help), e.g. --vectors 100000 --seconds 2.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
cargo build --release -p hasten-cloud-index -p hasten-bench --bins
target_dir="${CARGO_TARGET_DIR:-target}"
"$target_dir/release/hasten-cloud-bench" --work run/cloud-bench "$@"
