#!/usr/bin/env bash
# Installs Prometheus and promtool from Debian's `prometheus` package into TOOLS_DIR (once)
# and prints the directory that holds both binaries. Only the package's files are unpacked
# (dpkg-deb -x): nothing is installed system-wide and no service starts.
#
#     scripts/fetch-prometheus.sh [TOOLS_DIR]     # default ~/.cache/hasten-ci/tools
set -euo pipefail

tools=${1:-${TOOLS_DIR:-$HOME/.cache/hasten-ci/tools}}
dest=$tools/prometheus-deb
bin=$dest/usr/bin

if [ ! -x "$bin/promtool" ] || [ ! -x "$bin/prometheus" ]; then
  echo "fetch-prometheus: downloading Debian's prometheus package" >&2
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  # apt-get download writes into the current directory; a fresh machine may have no package
  # lists yet.
  if ! (cd "$work" && apt-get download prometheus >/dev/null 2>&1); then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    (cd "$work" && apt-get download prometheus >/dev/null)
  fi
  dpkg-deb -x "$work"/prometheus_*.deb "$work/root"
  mkdir -p "$tools"
  rm -rf "$dest"
  mv "$work/root" "$dest"
fi
"$bin/promtool" --version >/dev/null
echo "$bin"
