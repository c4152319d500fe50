#!/usr/bin/env bash
# aws-lc-sys must stay out of the build (research/network.md §5; ADR 0060): rustls,
# tokio-rustls, hyper-rustls and reqwest turn it on by default, so every TLS crate is added
# with `default-features = false` and ring. This fails as soon as anything pulls it back in.
set -euo pipefail
cd "$(dirname "$0")/.."
out=$(cargo tree --workspace -e normal,build -i aws-lc-sys 2>&1 || true)
if grep -q '^aws-lc-sys' <<<"$out"; then
  echo "aws-lc-sys is in the dependency graph:" >&2
  echo "$out" >&2
  exit 1
fi
echo "ok: no aws-lc-sys in the dependency graph"
