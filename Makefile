# The two front-door commands are `make serve` and `make test` (see README.md).
.PHONY: build serve test lint openapi bench

build:
	cargo build --release --workspace --bins

# Builds everything and starts the daemon on embedded defaults
# (root /var/lib/threadbox, SQLite, the host image, unix socket + 127.0.0.1:7420).
serve: build
	@# xfsprogs: instant checkpoints and forks on an ext4 root (ADR 0101); without it they copy.
	@command -v mkfs.xfs >/dev/null || apt-get install -y -q xfsprogs || echo "no xfsprogs: checkpoints will copy"
	./target/release/threadbox serve

# Installs what the tests need, then runs every suite.
test:
	./scripts/test.sh

lint:
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings
	# Features are additive (F14): the agent's test hooks turn on threadbox-sys's, and
	# core, built without its own, must still compile beside it.
	cargo check -p threadbox-agent --features threadbox-agent/insecure-test-hooks
	cargo check -p threadbox-core -p threadbox-agent --features threadbox-agent/insecure-test-hooks
	./scripts/check-no-aws-lc.sh

openapi:
	cargo run -q -p threadbox -- openapi > api/openapi.json
