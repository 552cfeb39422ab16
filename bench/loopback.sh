# Sourced by the benchmark scripts that run a cloud index and edges on loopback, from the
# repository root with $run (the run directory) set: the release binaries ($bin), a corpus
# bundle of SQuAD-dev's articles ($bundle, built once), waiting for a ready file, reading an
# address out of one, and the processes started, stopped when the script exits.
. bench/models.sh
bin=$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')/release
mkdir -p "$run"
bundle=$run/bundle
[ -d "$bundle" ] || "$bin/cloud-index" build --squad "${DATA_DIR:-../shared/data}/squad-dev-v1.1-visible.json" \
  --out "$bundle"

pids=()
trap 'kill "${pids[@]}" 2>/dev/null || true' EXIT
wait_ready() { for _ in $(seq 6000); do [ -s "$1" ] && return; sleep 0.1; done; echo "$1 never came" >&2; exit 1; }
field() { python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"; }

# start_cloud: a cloud index over $bundle, ready, its certificate in $run.
start_cloud() {
  rm -f "$run/cloud.ready" "$run/cloud.pem"
  "$bin/cloud-index" serve --bundle "$bundle" --quic-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 \
    --metrics-addr 127.0.0.1:0 --dev-cert-out "$run/cloud.pem" --ready-file "$run/cloud.ready" \
    > "$run/cloud.log" 2>&1 &
  pids+=($!)
  wait_ready "$run/cloud.ready"
}

# start_edge NAME [EDGE FLAGS...]: an edge in front of that cloud, ready.
start_edge() {
  local name=$1
  shift
  rm -f "$run/$name.ready"
  "$bin/edge-node" serve --bundle "$bundle" --cloud-addr "$(field "$run/cloud.ready" quic_addr)" \
    --cloud-ca "$run/cloud.pem" --http-addr 127.0.0.1:0 --grpc-addr 127.0.0.1:0 \
    --ready-file "$run/$name.ready" "$@" > "$run/$name.log" 2>&1 &
  pids+=($!)
  wait_ready "$run/$name.ready"
}
