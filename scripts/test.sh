#!/usr/bin/env bash
# The full test suite: Rust unit + integration tests against the real daemon, then the
# Python SDK / LangGraph tests against a real daemon. Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" != "0" ]; then
    echo "the test suite drives real sandboxes (namespaces, cgroups, overlayfs): run it as root" >&2
    exit 1
fi

echo "== lint"
# Early, so a format or lint failure fails CI in seconds. Clippy runs once per feature
# combination the tests build (the security suite builds the weakened one), because a
# lint or a type error can hide behind a feature (code-review F12, F14).
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo clippy --workspace --all-targets \
    --features threadbox/insecure-test-hooks,threadbox-agent/insecure-test-hooks -- -D warnings

echo "== build"
cargo build --workspace --bins

echo "== test images"
# A Debian rootfs made with mmdebstrap, to test rootfs images (cached across runs).
ROOTFS="$PWD/target/test-rootfs/debian"
if [ ! -x "$ROOTFS/usr/bin/python3" ]; then
    command -v mmdebstrap >/dev/null || { apt-get update -q && apt-get install -y -q mmdebstrap; }
    rm -rf "$ROOTFS" && mkdir -p "$(dirname "$ROOTFS")"
    mmdebstrap --quiet --variant=essential --include=python3-minimal bookworm "$ROOTFS"
fi
export THREADBOX_TEST_ROOTFS="$ROOTFS"

echo "== test tools"
# nft: only the egress golden test (threadbox-sys `net::tests`) uses it, to read back the
# table the kernel made of our own netlink batch. threadbox itself never runs nft.
command -v nft >/dev/null || { apt-get update -q && apt-get install -y -q nftables; }
# xfsprogs: `serve` keeps sandbox disks on an xfs store image where the root cannot
# reflink (ADR 0101), which every daemon test on an ext4 /tmp exercises.
command -v mkfs.xfs >/dev/null || { apt-get update -q && apt-get install -y -q xfsprogs; }
# `threadbox shell` is tested through a real terminal (tests/pty.rs).
command -v tmux >/dev/null || { apt-get update -q && apt-get install -y -q tmux; }
# docker-registry and skopeo: the OCI image tests (threadbox-oci, issue 14) run a registry
# on loopback and push the images they build into it; nothing is fetched from outside.
command -v docker-registry >/dev/null && command -v skopeo >/dev/null ||
    { apt-get update -q && apt-get install -y -q docker-registry skopeo; }
# umoci: `threadbox-bench layers --smoke` (bench/tests/smoke.rs) builds its pull figure's
# one-layer image with it, to push to that local registry; the smoke test requires the
# pull rows under CI, so it is installed here rather than left to skip.
command -v umoci >/dev/null || { apt-get update -q && apt-get install -y -q umoci; }
# git (with its HTTP transport): `tests/network_done.rs` clones a dumb-HTTP repository of
# the test upstream from inside a sandbox of the host image (the host's /usr).
command -v git >/dev/null || { apt-get update -q && apt-get install -y -q git; }
# node + npm: `tests/packages.rs` runs `npm install` inside a sandbox of the host image
# (the host's /usr), against the test upstream's local registry (ADR 0067).
command -v npm >/dev/null || { apt-get update -q && apt-get install -y -q nodejs npm; }
# pandas and matplotlib in the host image (the sandboxes' /usr): the interpreter's
# done-means graph (python/tests/test_interpreter_graph.py) loads a CSV and draws a chart.
/usr/bin/python3 -c 'import pandas, matplotlib' 2>/dev/null || {
    apt-get update -q && apt-get install -y -q --no-install-recommends python3-pandas python3-matplotlib; }
# promtool: `tests/metrics.rs` lints `/metrics` with it. Taken out of Debian's `prometheus`
# package rather than installing it, whose postinst would start a Prometheus server.
PROMTOOL="$PWD/target/tools/promtool"
if [ ! -x "$PROMTOOL" ]; then
    tmp="$(mktemp -d)"
    (cd "$tmp" && apt-get download -q prometheus) \
        || { apt-get update -q && (cd "$tmp" && apt-get download -q prometheus); }
    dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
    mkdir -p "$(dirname "$PROMTOOL")" && cp "$tmp/x/usr/bin/promtool" "$PROMTOOL"
    rm -rf "$tmp"
fi

# chromium: the dashboard's browser tests (python/tests/test_dashboard.py) drive Debian's
# Chromium with Playwright (never `playwright install`: no browser downloads).
command -v chromium >/dev/null || { apt-get update -q && apt-get install -y -q chromium; }

echo "== dashboard assets"
# The committed build of the dashboard matches its sources (rebuilt with npm, diffed).
scripts/ui-check.sh

# runsc (gVisor) for the `gvisor` tier (issue 16): bookworm-backports' static binary
# (0.0~20240729, systrap), through a private apt list so the host's sources stay as they
# are; `apt-get download` + `dpkg-deb -x`, nothing installed. The daemon finds it through
# THREADBOX_RUNSC (or `serve --runsc`, or PATH).
RUNSC="$PWD/target/tools/runsc"
if [ ! -x "$RUNSC" ]; then
    apt_dir="$(mktemp -d)"
    mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$apt_dir/dl"
    echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian bookworm-backports main" \
        > "$apt_dir/sources.list"
    apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
        -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache")
    apt-get "${apt_opts[@]}" update -q
    (cd "$apt_dir/dl" && apt-get "${apt_opts[@]}" download -q runsc)
    dpkg-deb -x "$apt_dir"/dl/runsc_*.deb "$apt_dir/x"
    mkdir -p "$(dirname "$RUNSC")" && cp "$apt_dir/x/usr/bin/runsc" "$RUNSC"
    rm -rf "$apt_dir"
fi
export THREADBOX_RUNSC="$RUNSC"

# Test daemons copy clones instead of mounting the reflink store image (ADR 0101): many
# harnesses end their daemon with SIGKILL, and a store left mounted keeps its root (and
# its host uid range) from being removed. `tests/store.rs` turns the store on explicitly.
export THREADBOX_STORE_IMAGE=off

echo "== rust tests"
cargo test --workspace -- --test-threads=2

if [ -f python/requirements-test.txt ]; then
    echo "== python tests"
    if [ ! -x .venv/bin/python ]; then
        python3 -m venv .venv
    fi
    .venv/bin/pip install -q --upgrade pip
    .venv/bin/pip install -q -r python/requirements-test.txt
    THREADBOX_BIN="$PWD/target/debug/threadbox" .venv/bin/pytest -q python/tests

    # The Deep Agents backend again at the newest deepagents 0.7.x (the main venv has the
    # pinned 0.6.12): its own venv, because the two cannot be installed side by side.
    echo "== python tests: deepagents 0.7"
    if [ ! -x .venv-deepagents07/bin/python ]; then
        python3 -m venv .venv-deepagents07
    fi
    .venv-deepagents07/bin/python -m pip install -q --upgrade pip
    .venv-deepagents07/bin/python -m pip install -q -r python/requirements-deepagents-0.7.txt
    THREADBOX_BIN="$PWD/target/debug/threadbox" .venv-deepagents07/bin/python -m pytest -q -p no:cacheprovider \
        python/tests/test_deepagents.py
fi
echo "== all tests passed"
