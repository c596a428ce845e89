# rlock: build, run and test the Redis lock module.
SO := target/release/librlock.so

.PHONY: all deps build run test unit bench fmt lint clean

all: build

# Installs what building and testing need, only when missing (we run as root in CI).
deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	dpkg -s libclang-dev >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi

build: deps
	cargo build --release

# Starts redis-server in the foreground on redis.conf (port 6379), module loaded.
run: build
	redis-server redis.conf

# Unit tests of the pure lock logic, then integration tests against real
# redis-server processes that load $(SO).
test: build
	cargo test --release --tests -- --test-threads=4

bench:
	@echo "make bench: not yet (see the benchmark issue)"

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --release --all-targets -- -D warnings

clean:
	cargo clean
