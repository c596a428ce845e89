#!/usr/bin/env bash
# What part of RLOCK.ACQUIRE's server time over SET NX PX is the module API's
# (paid by any module) and what part is rlock's own: the same uncontended
# acquire, timed as `make bench` table (a) times it, against a minimal lock in
# a C module (bench/floor_module.c: open the key, store a 48-byte value, set
# the TTL, reply). bench/findings.md "acquire-vs-set" has a run.
#
#   bench/module-floor.sh [path/to/librlock.so]
#
# For each of ROUNDS (default 7) rounds, in a shuffled order: a fresh
# redis-server (both modules loaded) per variant, CONFIG RESETSTAT, N (default
# 30000) acquisitions of distinct free keys sent with redis-cli --pipe (lease
# 30 s, a Redisson owner), then `INFO commandstats`. Prints each variant's
# median µs per call and the median of its per-round ratios to SET NX PX.
# PAD="40 80 170" adds, for each count, the C lock run after that many 64-byte
# lines of no-op code (FLOOR.PADLOCK): what code footprint alone costs
# (bench/findings.md acquire-vs-set; bench/footprint.sh counts the lines a
# command's code takes).
# OTHER="a.so b.so" also times RLOCK.ACQUIRE of those builds (rlock.acquire@1,
# @2, ...) in the same rounds: two builds compared on the same servers and
# moments, which separate runs of this machine cannot do.
# REPLICA=1 attaches a replica (a second redis-server with the same modules)
# to each server before its round, so that every effect is built and sent,
# and adds FLOOR.REPLOCK, the C lock that also replicates what it stored (the
# least a module can replicate; FLOOR.LOCK and TOKENLOCK send nothing).
# Needs a C compiler (cargo's linker), redis-server and redis-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-30000}
ROUNDS=${ROUNDS:-7}
so=${1:-}
if [ -z "$so" ]; then
    cargo build --release --lib
    so=target/release/librlock.so
fi
so=$(readlink -f "$so")
header=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/redis-module-*/src/include/redismodule.h 2>/dev/null | tail -1 || true)
[ -n "$header" ] || { echo "redismodule.h not found (build the module once with cargo)" >&2; exit 1; }
work=$(mktemp -d /tmp/rlock-module-floor.XXXXXX)
trap 'rm -rf "$work"' EXIT
cc -O2 -fPIC -shared -I"$(dirname "$header")" -o "$work/floor.so" bench/floor_module.c
for lines in ${PAD:-}; do
    cc -O2 -fPIC -shared -DPAD_LINES="$lines" -I"$(dirname "$header")" \
        -o "$work/floor-pad$lines.so" bench/floor_module.c
done
owner=6f1c2a4e-8b1d-4e55-9a7c-3d2f1b0e9a11:1

# resp <variant> <command words, KEY for the key>: N commands in RESP.
resp() {
    local name=$1
    shift
    awk -v n="$N" -v owner="$owner" -v words="$*" 'BEGIN {
        k = split(words, w, " ")
        for (i = 0; i < n; i++) {
            printf "*%d\r\n", k
            for (j = 1; j <= k; j++) {
                a = w[j]
                if (a == "KEY") a = sprintf("lock:%08d", i)
                else if (a == "OWNER") a = owner
                printf "$%d\r\n%s\r\n", length(a), a
            }
        }
    }' > "$work/$name.resp"
}
resp set SET KEY OWNER NX PX 30000
resp floor.lock FLOOR.LOCK KEY OWNER PX 30000
resp floor.tokenlock FLOOR.TOKENLOCK KEY OWNER PX 30000
resp rlock.acquire RLOCK.ACQUIRE KEY OWNER PX 30000
variants="set floor.lock floor.tokenlock rlock.acquire"
if [ -n "${REPLICA:-}" ]; then
    resp floor.replock FLOOR.REPLOCK KEY OWNER PX 30000
    variants="$variants floor.replock"
fi
n_other=0
for other in ${OTHER:-}; do
    n_other=$((n_other + 1))
    cp "$(readlink -f "$other")" "$work/other$n_other.so"
    cp "$work/rlock.acquire.resp" "$work/rlock.acquire@$n_other.resp"
    variants="$variants rlock.acquire@$n_other"
done
for lines in ${PAD:-}; do
    resp "floor.padlock+$lines" FLOOR.PADLOCK KEY OWNER PX 30000
    variants="$variants floor.padlock+$lines"
done

# A port below Linux's ephemeral range (32768 and up), so that no client
# connection of an earlier round holds it.
free_port() {
    local p
    for _ in $(seq 1 50); do
        p=$((20000 + RANDOM % 12000))
        redis-cli -p "$p" ping >/dev/null 2>&1 || { echo "$p"; return; }
    done
    echo 7399
}

# one <variant>: µs per call of the variant's command on a fresh server.
one() {
    local name=$1 port pid replica_port replica_pid floor=$work/floor.so module=$so
    case $name in
    floor.padlock+*) floor=$work/floor-pad${name#floor.padlock+}.so ;;
    rlock.acquire@*) module=$work/other${name#rlock.acquire@}.so ;;
    esac
    port=$(free_port)
    redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
        --loadmodule "$module" --loadmodule "$floor" > "$work/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
    if [ -n "${REPLICA:-}" ]; then
        replica_port=$(free_port)
        redis-server --port "$replica_port" --bind 127.0.0.1 --save '' --appendonly no \
            --replicaof 127.0.0.1 "$port" --loadmodule "$module" --loadmodule "$floor" \
            > "$work/replica.log" 2>&1 &
        replica_pid=$!
        for _ in $(seq 1 200); do
            redis-cli -p "$port" INFO replication | grep -q '^slave0:.*state=online' && break
            sleep 0.05
        done
    fi
    redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
    redis-cli -p "$port" --pipe < "$work/$name.resp" >/dev/null
    redis-cli -p "$port" INFO commandstats | tr -d '\r' |
        awk -F'[:,=]' -v c="cmdstat_${name%[+@]*}" '$1 == c { for (i = 2; i < NF; i += 2) v[$i] = $(i + 1)
            if (v["calls"] + 0 > 0) printf "%.4f\n", v["usec"] / v["calls"] }'
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$pid" 2>/dev/null || true
    if [ -n "${REPLICA:-}" ]; then
        redis-cli -p "$replica_port" shutdown nosave >/dev/null 2>&1 || true
        wait "$replica_pid" 2>/dev/null || true
    fi
}

for r in $(seq 1 "$ROUNDS"); do
    for name in $(printf '%s\n' $variants | shuf); do
        us=$(one "$name")
        [ -n "$us" ] || { echo "no time for $name; server log:" >&2; cat "$work/server.log" >&2; exit 1; }
        echo "$r $name $us" >> "$work/times"
    done
done

echo "module: $so   calls per round: $N   rounds: $ROUNDS   replica: ${REPLICA:-no}   (server µs per call, INFO commandstats)"
awk -v order="$variants" '
    function median(a, n,   i, j, t) {
        for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { t[$1, $2] = $3; rounds[$1] = 1 }
    END {
        count = split(order, names_in_order, " ")
        for (k = 1; k <= count; k++) {
            name = names_in_order[k]; n = 0
            for (r in rounds) { n++; us[n] = t[r, name]; ratio[n] = t[r, name] / t[r, "set"] }
            printf "%-20s %.3f µs   %.2fx SET NX PX\n", name, median(us, n), median(ratio, n)
        }
    }' "$work/times"
