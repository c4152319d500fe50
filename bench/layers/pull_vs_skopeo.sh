#!/bin/sh
# Pull throughput of the daemon as shipped (a release build) against `skopeo copy` of the
# same image from the same local registry, interleaved, in one run (issue 14's figure).
# The image: a root file system directory (default: the suite's Debian rootfs) as one gzip
# layer made by umoci, pushed to Debian's docker-registry on loopback. Needs root, umoci,
# skopeo, docker-registry. Usage:
#   bench/layers/pull_vs_skopeo.sh [--bin target/release/threadbox] [--rootfs DIR] [--runs 3]
# Superseded by `threadbox-bench layers` (bench/src/layers.rs, ADR 0211: the same image,
# registry and interleaving, with medians and the ratio); kept because earlier figures in
# docs/layers.md name this script.
set -eu
BIN=target/release/threadbox
ROOTFS=target/test-rootfs/debian
RUNS=3
while [ $# -gt 0 ]; do
  case "$1" in
    --bin) BIN=$2; shift 2 ;;
    --rootfs) ROOTFS=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
BIN=$(realpath "$BIN")
W=$(mktemp -d /tmp/tb-bench-pull-XXXXXX)
REG= DAEMON=
cleanup() {
  [ -n "$DAEMON" ] && kill "$DAEMON" 2>/dev/null && wait "$DAEMON" 2>/dev/null
  [ -n "$REG" ] && kill "$REG" 2>/dev/null
  umount -l "$W/root/sandboxes" 2>/dev/null || true
  rm -rf "$W"
}
trap cleanup EXIT INT TERM
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
mkdir -p "$W/storage" "$W/root"
printf 'version: 0.1\nlog:\n  level: error\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%s\n' "$W/storage" "$PORT" > "$W/reg.yml"
docker-registry serve "$W/reg.yml" >/dev/null 2>&1 & REG=$!
umoci init --layout "$W/layout"
umoci new --image "$W/layout:1"
umoci insert --image "$W/layout:1" "$ROOTFS" /
until skopeo copy --quiet --insecure-policy --dest-tls-verify=false "oci:$W/layout:1" "docker://127.0.0.1:$PORT/bench/debian:1" 2>/dev/null; do sleep 0.2; done
BLOB=$(du -b "$W/layout/blobs/sha256" | tail -1 | cut -f1)
THREADBOX_STORE_IMAGE=off "$BIN" serve --root "$W/root" --listen 127.0.0.1:0 > "$W/daemon.log" 2>&1 & DAEMON=$!
until [ -S "$W/root/threadbox.sock" ]; do sleep 0.05; done
export THREADBOX_URL="unix://$W/root/threadbox.sock"
now() { date +%s.%N; }
for i in $(seq "$RUNS"); do
  t=$(now); skopeo copy --quiet --insecure-policy --src-tls-verify=false "docker://127.0.0.1:$PORT/bench/debian:1" "dir:$W/out$i"; s=$(echo "$(now) - $t" | bc)
  rm -rf "$W/out$i"
  t=$(now); "$BIN" image pull --insecure --name "bench$i" "127.0.0.1:$PORT/bench/debian:1" >/dev/null; p=$(echo "$(now) - $t" | bc)
  "$BIN" image rm "bench$i" >/dev/null
  echo "run $i: skopeo $s s, threadbox pull $p s"
done
echo "blobs in the layout: $BLOB bytes (the gzip layer, its config and manifest)"
