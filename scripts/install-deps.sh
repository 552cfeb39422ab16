#!/usr/bin/env bash
# Installs the system packages Hasten builds against (faiss is compiled from source by the
# faiss crate's `static` feature and needs cmake and a BLAS/LAPACK), when they are missing.
set -euo pipefail

packages=(cmake libopenblas-dev liblapack-dev)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

echo "installing ${missing[*]}" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
