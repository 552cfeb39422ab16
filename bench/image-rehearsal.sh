#!/usr/bin/env bash
# Builds Hasten's image on a machine without a container registry and brings the Helm chart's
# default release up from it (docs/benchmarks/image.md):
#   1. podman, runc and debootstrap from Debian's packages (installed when missing);
#   2. a Debian 12 (bookworm) base made with debootstrap (minbase), imported as
#      localhost/hasten-debian-base:bookworm: the registry's debian:bookworm-slim is
#      unreachable here;
#   3. the binaries built here in release (Debian 12 is this machine's system, so they run on
#      that base) and the encoder, copied into .image-context/;
#   4. the Dockerfile built with BINARIES=prebuilt and RUNTIME_IMAGE=that base: the runtime
#      stage as the release image has it (packages, user 10001, layout), the builder stage
#      skipped (its base, rust:1-bookworm, is a registry image too);
#   5. the chart rendered with its default values, and scripts/rehearse_install.py running
#      every pod's containers from the image (podman, host network, a loopback address per
#      pod): every readiness probe must answer and the helm test pod's command must pass.
#
#   bench/image-rehearsal.sh          (as root: podman runs rootful here)
#
# Podman runs with runc on vfs storage, with no default ulimits (crun and the default
# nofile/nproc limits are refused in this sandbox), and builds without intermediate layers
# (vfs copies each layer whole; ~13 GB free here). Output in $HASTEN_CI_CACHE/image-rehearsal.
set -euo pipefail
cd "$(dirname "$0")/.."

cache=${HASTEN_CI_CACHE:-$HOME/.cache/hasten-ci}
target=${CARGO_TARGET_DIR:-target}
model=${HASTEN_MODEL_DIR:-${MODEL_DIR:-models/all-MiniLM-L6-v2}}
image=${IMAGE:-localhost/hasten:rehearsal}
base=localhost/hasten-debian-base:bookworm
out=$cache/image-rehearsal
log() { echo "image-rehearsal: $*" >&2; }

mkdir -p "$out"
printf '[containers]\ndefault_ulimits = []\n' >"$out/containers.conf"
export CONTAINERS_CONF=$out/containers.conf
podman=(podman --runtime runc --storage-driver vfs)

for tool in podman runc debootstrap; do
  command -v "$tool" >/dev/null || { log "installing $tool"; apt-get install -y -q "$tool" >/dev/null; }
done
[ -d "$model" ] || { log "no encoder model at $model (make models)"; exit 1; }

if ! "${podman[@]}" image exists "$base"; then
  log "making the Debian 12 base with debootstrap"
  rm -rf "$out/rootfs"
  debootstrap --variant=minbase bookworm "$out/rootfs" http://deb.debian.org/debian >"$out/debootstrap.log"
  tar -C "$out/rootfs" -c . | "${podman[@]}" import - "$base" >/dev/null
  rm -rf "$out/rootfs"
fi

binaries=(edge-node cloud-index control-plane lm-worker kv-worker kv-operator hasten-admin hasten-loadtest)
log "building the binaries (release)"
cargo build --release --locked --bins -p hasten-edge-node -p hasten-cloud-index -p hasten-control-plane \
  -p hasten-lm-worker -p hasten-kv-worker -p hasten-kv-operator -p hasten-admin -p hasten-loadtest
rm -rf .image-context
mkdir -p .image-context/bin .image-context/models
# Without their debug info (~190 MB each): vfs storage copies every layer whole.
for b in "${binaries[@]}"; do strip --strip-debug -o ".image-context/bin/$b" "$target/release/$b"; done
cp -r "$model" .image-context/models/all-MiniLM-L6-v2

log "building $image from the Dockerfile (BINARIES=prebuilt)"
started=$(date +%s)
# Debian 12's buildah (1.28) tags the image and then fails removing the stage that
# `FROM ${BINARIES}` names ("identifier is not an image"): the tag is what counts.
"${podman[@]}" build --layers=false --network host --build-arg BINARIES=prebuilt \
  --build-arg RUNTIME_IMAGE="$base" -t "$image" . >"$out/build.log" 2>&1 ||
  grep -q "Successfully tagged $image" "$out/build.log" || { tail -30 "$out/build.log"; exit 1; }
rm -rf .image-context
log "built in $(($(date +%s) - started)) s: $("${podman[@]}" image inspect "$image" --format '{{.Size}}') bytes"
"${podman[@]}" run --rm "$image" edge-node --help | head -1

tools=$cache/tools
source scripts/helm-tools.sh
"$helm" template hasten helm/hasten --namespace hasten >"$out/default.yaml"
# The pods' directories are mounted at their own paths; the image's unprivileged user
# cannot reach into /root, so they live under /tmp.
release=${TMPDIR:-/tmp}/hasten-image-rehearsal
rm -rf "$release"
"$py" scripts/rehearse_install.py "$out/default.yaml" --work "$release" --image "$image" \
  --container-cli "${podman[*]}"
