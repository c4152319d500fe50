#!/usr/bin/env bash
# The dashboard's built assets (crates/threadbox-server/ui/dist/, embedded in the daemon)
# are committed so that `cargo build` and `make serve` need no npm. This rebuilds them from
# the locked sources and fails if the result differs from what is committed, as the
# openapi freshness test does for api/openapi.json (ADR 0096).
set -euo pipefail
cd "$(dirname "$0")/../crates/threadbox-server/ui"
npm ci --no-audit --no-fund --loglevel=error
npm run --silent build
if ! git diff --quiet --exit-code -- dist || [ -n "$(git status --porcelain -- dist)" ]; then
    echo "crates/threadbox-server/ui/dist is stale: run scripts/ui-check.sh and commit dist/" >&2
    git status --short -- dist >&2
    exit 1
fi
echo "dashboard assets up to date"
