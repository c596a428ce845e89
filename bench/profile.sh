#!/usr/bin/env bash
# Instruction profile (valgrind callgrind) of one uncontended acquire and release:
# native RLOCK against SET NX PX + Lua compare-and-delete and Redisson's Lua
# scripts. This is how the numbers in bench/findings.md were taken.
#
#   bench/profile.sh [path/to/librlock.so]
#
# Without an argument it builds the module with debug info into
# target/profile/ (function names and inlined code resolve). For each lock it
# starts a fresh redis-server under callgrind (free port, temp dir, module
# loaded), sends N (default 20000) acquires on distinct free keys (lease 1 h, so
# that none ends however slow valgrind is), then the N releases, with
# redis-cli --pipe, and dumps one profile per phase. It prints
# instructions per call (Redis's call() inclusive, what INFO commandstats
# times) and the heaviest callees. Profiles stay in the printed directory for
# callgrind_annotate. CACHE_SIM=1 adds callgrind's cache simulation (L1/LL
# misses per call). SERVER_ARGS adds redis-server arguments, e.g.
# SERVER_ARGS="--appendonly yes --appendfsync no" to count the cost of building
# and propagating replicated effects. EXPIRY=1 profiles instead what Redis's
# active expiry pays per key (lock keys with a 20 s lease, nobody waiting,
# against SET PX keys): N keys made, counters zeroed, then everything until
# the last key is gone. Needs valgrind, redis-server and redis-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-20000}
so=${1:-}
if [ -z "$so" ]; then
    CARGO_PROFILE_RELEASE_DEBUG=true CARGO_TARGET_DIR=target/profile cargo build --release --lib
    so=target/profile/release/librlock.so
fi
so=$(readlink -f "$so")
for tool in valgrind callgrind_control callgrind_annotate redis-server redis-cli; do
    command -v $tool >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
work=$(mktemp -d /tmp/rlock-profile.XXXXXX)
owner=6f1c2a4e-8b1d-4e55-9a7c-3d2f1b0e9a11:1

# Inline commands, one per line (no argument contains a space).
commands() {
    awk -v n="$N" -v owner="$owner" -v fmt="$1" 'BEGIN {
        for (i = 0; i < n; i++) {
            key = sprintf("lock:%08d", i); line = fmt
            gsub(/KEY/, key, line); gsub(/OWNER/, owner, line)
            printf "%s\r\n", line
        }
    }'
}

# start_server <name>: a fresh redis-server under callgrind in $work/<name>,
# the module loaded; sets port, vg (valgrind's pid) and pid (the server's own,
# the process callgrind runs in).
start_server() {
    local name=$1
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])' 2>/dev/null || echo 7399)
    mkdir -p "$work/$name"
    valgrind --tool=callgrind --cache-sim="$([ -n "${CACHE_SIM:-}" ] && echo yes || echo no)" \
        --callgrind-out-file="$work/$name/cg.%p" \
        redis-server --port "$port" --bind 127.0.0.1 --dir "$work/$name" --save '' \
        --appendonly no ${SERVER_ARGS:-} --loadmodule "$so" > "$work/$name/valgrind.log" 2>&1 &
    vg=$!
    trap "kill $vg 2>/dev/null || true" EXIT
    for _ in $(seq 1 300); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.2; done
    pid=$(redis-cli -p "$port" INFO server | awk -F: '/^process_id:/ { print $2 }' | tr -d '\r')
}

stop_server() {
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait $vg || true
    trap - EXIT
}

# profile <name> <acquire format> <release format>: one fresh server, two dumps.
profile() {
    local name=$1 acquire=$2 release=$3 s sha
    start_server "$name"
    for s in floor_release reentrant_acquire reentrant_release; do
        sha=$(redis-cli -p "$port" SCRIPT LOAD "$(cat bench/lua/$s.lua)")
        acquire=${acquire//@$s/$sha}
        release=${release//@$s/$sha}
    done
    commands "$acquire" > "$work/$name/acquire.cmds"
    commands "$release" > "$work/$name/release.cmds"
    callgrind_control -z "$pid" >/dev/null 2>&1
    for phase in acquire release; do
        redis-cli -p "$port" --pipe < "$work/$name/$phase.cmds" >/dev/null
        callgrind_control --dump="$name-$phase" "$pid" >/dev/null 2>&1
    done
    stop_server
}

# expiry <name> <format>: N keys with a 20 s lease (valgrind takes several
# seconds to make them; none may end before the counters are zeroed), then one
# dump once all of them are gone.
expiry() {
    local name=$1
    start_server "$name"
    commands "$2" > "$work/$name/make.cmds"
    redis-cli -p "$port" --pipe < "$work/$name/make.cmds" >/dev/null
    callgrind_control -z "$pid" >/dev/null 2>&1
    while [ "$(redis-cli -p "$port" DBSIZE)" != 0 ]; do sleep 0.5; done
    callgrind_control --dump="$name-expiry" "$pid" >/dev/null 2>&1
    stop_server
}

if [ -n "${EXPIRY:-}" ]; then
    expiry 1-set "SET KEY OWNER NX PX 20000"
    expiry 2-rlock "RLOCK.ACQUIRE KEY OWNER PX 20000"
    echo "module: $so   keys: $N   profiles: $work"
    for dump in "$work"/*/cg.*.1; do
        echo
        echo "== $(grep -m1 '^desc: Trigger' "$dump" | sed 's/.*dump //'): instructions per key expired"
        callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null |
            grep -E '(activeExpireCycle|deleteExpiredKeyAndPropagate|moduleTimerHandler|RM_PublishMessage|rlock::notify::[a-z_]+|rlock::lease::run_slice) \[' |
            awk -v n="$N" '{ c = $1; gsub(",", "", c); l = $0
                sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, "", l); printf "%8d  %s\n", c / n, l }' || true
    done
    exit 0
fi

profile 1-floor "SET KEY OWNER NX PX 3600000" "EVALSHA @floor_release 1 KEY OWNER"
profile 2-rlock "RLOCK.ACQUIRE KEY OWNER PX 3600000" "RLOCK.RELEASE KEY OWNER"
profile 3-redisson "EVALSHA @reentrant_acquire 1 KEY 3600000 OWNER" \
    "EVALSHA @reentrant_release 2 KEY redisson_lock__channel:{KEY} 0 3600000 OWNER"

echo "module: $so   calls per phase: $N   profiles: $work"
for dump in "$work"/*/cg.*.[12]; do
    name=$(grep -m1 '^desc: Trigger' "$dump" | sed 's/.*dump //')
    total=$(callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null |
        awk '/ \?\?\?:call \[/ && !done { gsub(",", "", $1); print $1; done = 1 }' || true)
    [ -n "$total" ] || continue
    echo
    echo "== $name: $((total / N)) instructions per call (call() inclusive)"
    if [ -n "${CACHE_SIM:-}" ]; then
        callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null |
            awk -v n="$N" '/ \?\?\?:call \[/ && !done { done = 1
                # Ir Dr Dw I1mr D1mr D1mw ILmr DLmr DLmw, each followed by its (%).
                split($0, f, /[ ]+\([ 0-9.]+%\)[ ]*|[ ]+/); k = 0
                for (i = 1; i <= length(f); i++) if (f[i] ~ /^[0-9,]+$/) { v[++k] = f[i]; gsub(",", "", v[k]) }
                printf "   per call: L1 instruction misses %.1f, L1 data read/write misses %.1f/%.1f, LL data read/write misses %.2f/%.2f\n", v[4]/n, v[5]/n, v[6]/n, v[8]/n, v[9]/n }' || true
    fi
    callgrind_annotate --inclusive=yes --threshold=100 "$dump" 2>/dev/null |
        grep -E '(RM_[A-Za-z]+|rlock::[a-z_:]+|setKey|setExpire|luaCallFunction|evalGenericCommand|moduleNotifyKeyspaceEvent|lookupCommandByCString|moduleCreateArgvFromUserFormat) \[' |
        awk -v n="$N" 'NR <= 14 { c = $1; gsub(",", "", c); l = $0
            sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, "", l); printf "%8d  %s\n", c / n, l }' || true
done
