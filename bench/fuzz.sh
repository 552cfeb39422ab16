#!/usr/bin/env bash
# Runs every cargo-fuzz target in fuzz/ for a few minutes each and records the outcome in
# run/fuzz/report.md (figures: docs/benchmarks/fuzzing.md). Installs cargo-fuzz from
# crates.io when missing. This machine has one stable toolchain: libFuzzer's -Z flags are
# allowed with RUSTC_BOOTSTRAP=1. Sanitizer: none (the fuzzed paths are safe Rust; a panic
# or failed assertion is the finding), which keeps the C++ (faiss) link plain.
#   bench/fuzz.sh [seconds per target, default 180]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-180}
scripts/install-deps.sh
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz --locked
export RUSTC_BOOTSTRAP=1
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/fuzz"
out=run/fuzz
mkdir -p "$out"
targets=(quic_frame json_request raft_message)
report="$out/report.md"
{
  echo "| target | seconds | runs | coverage (edges) | corpus | outcome |"
  echo "|---|---|---|---|---|---|"
} > "$report"
for target in "${targets[@]}"; do
  log="$out/$target.log"
  status=0
  (cd fuzz && cargo fuzz run --sanitizer none "$target" -- \
      -max_total_time="$seconds" -print_final_stats=1) > "$log" 2>&1 || status=$?
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1 || true)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || true)
  corpus=$(find "fuzz/corpus/$target" -type f 2>/dev/null | wc -l)
  if [ "$status" -eq 0 ]; then
    outcome="no crash"
  else
    artifact=$(grep -o 'fuzz/artifacts/[^ ]*' "$log" | tail -1 || true)
    outcome="CRASH (exit $status) ${artifact:-see $log}"
  fi
  echo "| $target | $seconds | ${runs:-?} | ${cov:-?} | $corpus | $outcome |" >> "$report"
  echo "$target: $outcome" >&2
done
cat "$report"
