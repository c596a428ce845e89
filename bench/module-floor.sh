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
# 30000) acquisitions of distinct free keys of the variant's command and N of
# SET NX PX, in turns of CHUNK (default 500) commands, sent with redis-cli
# --pipe (lease 30 s, a Redisson owner), then `INFO commandstats`. Prints each
# variant's median µs per call and the median (and range) of its per-round
# ratios to the SET NX PX of the same server: the two share the server's
# moments, which a SET timed on another server seconds apart does not (this
# machine moves a server's speed by more than the ratios' differences).
# PAD="40 80 170" adds, for each count, the C lock run after that many 64-byte
# lines of no-op code (FLOOR.PADLOCK): what code footprint alone costs
# (bench/findings.md acquire-vs-set; bench/footprint.sh counts the lines a
# command's code takes).
# OTHER="a.so b.so" also times RLOCK.ACQUIRE of those builds (rlock.acquire@1,
# @2, ...) in the same rounds, each against its own server's SET NX PX.
# REPLICA=1 attaches a replica (a second redis-server with the same modules)
# to each server before its round, so that every effect is built and sent,
# and adds FLOOR.REPLOCK, the C lock that also replicates what it stored (the
# least a module can replicate; FLOOR.LOCK and TOKENLOCK send nothing).
# Needs a C compiler (cargo's linker), redis-server and redis-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-30000}
CHUNK=${CHUNK:-500}
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

# resp <file> <command>...: N commands of each given command (words
# separated by spaces, KEY for a fresh key, OWNER for the owner) in RESP, in
# turns of CHUNK commands each, so that every command of a server meets the
# same moments of the machine. The keys of each command have their own prefix.
resp() {
    local file=$1
    shift
    printf '%s\n' "$@" | awk -v n="$N" -v chunk="$CHUNK" -v owner="$owner" -f bench/resp.awk -f <(echo '
        { words[NR] = $0 }
        END {
            for (s = 0; s < n; s += chunk)
                for (v = 1; v <= NR; v++)
                    for (i = s; i < s + chunk && i < n; i++) resp(words[v], sprintf("v%d:%08d", v, i))
        }') > "$file"
}

# Every command has servers of its own, one a round, where it runs in turns
# with SET NX PX: its ratio is taken to that SET, on the same server in the
# same moments. (More commands on one server would share its caches among
# more code, which moves every ratio.)
declare -A command module floor
add() { command[$1]=$2 module[$1]=$3 floor[$1]=$4; }
add floor.lock FLOOR.LOCK "$so" "$work/floor.so"
add floor.tokenlock FLOOR.TOKENLOCK "$so" "$work/floor.so"
add rlock.acquire RLOCK.ACQUIRE "$so" "$work/floor.so"
variants="floor.lock floor.tokenlock rlock.acquire"
if [ -n "${REPLICA:-}" ]; then
    add floor.replock FLOOR.REPLOCK "$so" "$work/floor.so"
    variants="$variants floor.replock"
fi
n_other=0
for other in ${OTHER:-}; do
    n_other=$((n_other + 1))
    cp "$(readlink -f "$other")" "$work/other$n_other.so"
    add "rlock.acquire@$n_other" RLOCK.ACQUIRE "$work/other$n_other.so" "$work/floor.so"
    variants="$variants rlock.acquire@$n_other"
done
for lines in ${PAD:-}; do
    add "floor.padlock+$lines" FLOOR.PADLOCK "$so" "$work/floor-pad$lines.so"
    variants="$variants floor.padlock+$lines"
done
for name in $variants; do
    resp "$work/$name.resp" "SET KEY OWNER NX PX 30000" "${command[$name]} KEY OWNER PX 30000"
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

# one <variant>: "<µs per call of SET NX PX> <µs per call of the variant's
# command>" on a fresh server where the two ran in turns.
one() {
    local name=$1 dir port pid replica_port replica_pid
    # Each server in a directory of its own: a dump.rdb where it starts (the
    # repository's, or a replica's full sync of an earlier round) would be
    # loaded, and Redis makes a replication backlog after loading one, so the
    # module would build its effects in a round that has no replica.
    dir=$(mktemp -d "$work/server.XXXXXX")
    mkdir "$dir/replica"
    port=$(free_port)
    redis-server --port "$port" --bind 127.0.0.1 --dir "$dir" --save '' --appendonly no \
        --loadmodule "${module[$name]}" --loadmodule "${floor[$name]}" > "$work/server.log" 2>&1 &
    pid=$!
    for _ in $(seq 1 100); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.05; done
    if [ -n "${REPLICA:-}" ]; then
        replica_port=$(free_port)
        redis-server --port "$replica_port" --bind 127.0.0.1 --dir "$dir/replica" --save '' --appendonly no \
            --replicaof 127.0.0.1 "$port" --loadmodule "${module[$name]}" --loadmodule "${floor[$name]}" \
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
        awk -F'[:,=]' -v n="$N" -v stat="cmdstat_${command[$name],,}" '
            { for (i = 2; i < NF; i += 2) v[$i] = $(i + 1)
              if (v["calls"] == n) us[$1] = v["usec"] / v["calls"] }
            END { if (("cmdstat_set" in us) && (stat in us)) printf "%.4f %.4f\n", us["cmdstat_set"], us[stat] }'
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$pid" 2>/dev/null || true
    if [ -n "${REPLICA:-}" ]; then
        redis-cli -p "$replica_port" shutdown nosave >/dev/null 2>&1 || true
        wait "$replica_pid" 2>/dev/null || true
    fi
}

for r in $(seq 1 "$ROUNDS"); do
    for name in $(printf '%s\n' $variants | shuf); do
        times=$(one "$name")
        [ -n "$times" ] || { echo "no time for $name; server log:" >&2; cat "$work/server.log" >&2; exit 1; }
        echo "$r $name $times" >> "$work/times"
    done
done

echo "module: $so   calls per command and round: $N, in turns of $CHUNK   rounds: $ROUNDS   replica: ${REPLICA:-no}"
echo "(server µs per call by INFO commandstats; the ratio to SET NX PX on the same server in the same turns)"
awk -v order="$variants" '
    function median(a, n,   i, j, t) {
        for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j - 1] > a[j]; j--) { t = a[j]; a[j] = a[j - 1]; a[j - 1] = t }
        return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
    }
    { set[$1, $2] = $3; t[$1, $2] = $4; q[$1, $2] = $4 / $3; rounds[$1] = 1 }
    END {
        n = 0
        for (k in set) us[++n] = set[k]
        printf "%-20s %.3f µs   (median over every server)\n", "set", median(us, n)
        count = split(order, names_in_order, " ")
        for (k = 1; k <= count; k++) {
            name = names_in_order[k]; n = 0; lo = 1e9; hi = 0
            for (r in rounds) {
                n++; us[n] = t[r, name]; ratio[n] = q[r, name]
                if (q[r, name] < lo) lo = q[r, name]
                if (q[r, name] > hi) hi = q[r, name]
            }
            printf "%-20s %.3f µs   %.2fx SET NX PX (rounds %.2fx-%.2fx)\n", name, median(us, n), median(ratio, n), lo, hi
        }
    }' "$work/times"
