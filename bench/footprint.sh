#!/usr/bin/env bash
# How much code one uncontended acquire runs through: the 64-byte lines of
# machine code the server executes on (almost) every call, for SET NX PX, the
# C module floor (bench/floor_module.c) and RLOCK.ACQUIRE, split by the object
# they belong to (redis-server, the allocator, libc, the module). Unlike a
# time, the count is the same from run to run, so a change to the module's hot
# path can be judged by it before any benchmark: bench/findings.md
# "acquire-vs-set" has why it matters (a call's code beyond the 32 KB L1
# instruction cache costs time) and bench/module-floor.sh PAD=... what a
# number of lines costs.
#
#   bench/footprint.sh [path/to/librlock.so]
#
# For each command a fresh redis-server under callgrind (--dump-instr), 500
# calls to warm it, counters zeroed, N (default 2000) calls on distinct free
# keys sent with redis-cli --pipe, one dump. A line counts when one of its
# instructions ran on at least half of the N calls. TOP=k also lists the k
# module functions with the most instructions on those lines. AOF=1 runs the
# servers with the AOF on (appendfsync no), so that every command's effect is
# built and propagated, as with a replica attached. CMD="..." counts another
# command in RLOCK.ACQUIRE's place, KEY and OWNER standing for a fresh key and
# the owner (e.g. CMD="SEMAPHORE.ACQUIRE KEY OWNER LIMIT 5 PX 3600000", or
# CMD="FLOOR.REPLOCK KEY OWNER PX 3600000" with AOF=1). LOAD=1 counts an RDB
# load instead: the N keys made, SAVE, FLUSHALL, counters zeroed, DEBUG
# RELOAD NOSAVE, so "a call" is one value read back (bench/findings.md
# "rdb-load": what any module type's load costs beside a SET key's). Every
# mode also prints the instructions per call, all code counted, and, but for
# LOAD=1, those run inside the command's own procedure (setCommand or the
# module command dispatcher, callees included): the span INFO commandstats
# times, so their ratio is a run-to-run stable image of the ratio `make bench`
# judges (bench/findings.md "replica-acquire-vs-set"). Run it on another server
# by putting that server first in PATH as redis-server. Needs
# valgrind, python3, objdump, a C compiler, redis-server and redis-cli.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-2000}
aof=no
[ -z "${AOF:-}" ] || aof=yes
so=${1:-}
if [ -z "$so" ]; then
    cargo build --release --lib
    so=target/release/librlock.so
fi
so=$(readlink -f "$so")
for tool in valgrind callgrind_control python3 objdump cc redis-server redis-cli; do
    command -v $tool >/dev/null || { echo "missing: $tool" >&2; exit 1; }
done
header=$(ls "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/redis-module-*/src/include/redismodule.h 2>/dev/null | tail -1 || true)
[ -n "$header" ] || { echo "redismodule.h not found (build the module once with cargo)" >&2; exit 1; }
work=$(mktemp -d /tmp/rlock-footprint.XXXXXX)
trap 'rm -rf "$work"' EXIT
cc -O2 -fPIC -shared -I"$(dirname "$header")" -o "$work/floor.so" bench/floor_module.c
owner=6f1c2a4e-8b1d-4e55-9a7c-3d2f1b0e9a11:1

# RESP commands as a client sends them, keys <prefix>:<n>.
commands() {
    awk -v n="$1" -v prefix="$2" -v owner="$owner" -v words="$3" -f bench/resp.awk -f <(echo '
        BEGIN { for (i = 0; i < n; i++) resp(words, sprintf("%s:%08d", prefix, i)) }')
}

# count <name> <command words>: one server, one dump in $work/<name>.
count() {
    local name=$1 format=$2 port vg pid
    port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
    mkdir -p "$work/$name.d"
    valgrind --tool=callgrind --dump-instr=yes --compress-pos=no --compress-strings=no \
        --callgrind-out-file="$work/$name.%p" \
        redis-server --port "$port" --bind 127.0.0.1 --dir "$work/$name.d" --save '' \
        --appendonly "$aof" --appendfsync no --enable-debug-command yes \
        --loadmodule "$so" --loadmodule "$work/floor.so" > "$work/$name.log" 2>&1 &
    vg=$!
    for _ in $(seq 1 300); do [ "$(redis-cli -p "$port" ping 2>/dev/null)" = PONG ] && break; sleep 0.2; done
    pid=$(redis-cli -p "$port" INFO server | awk -F: '/^process_id:/ { print $2 }' | tr -d '\r')
    commands 500 warm "$format" | redis-cli -p "$port" --pipe >/dev/null
    if [ -n "${LOAD:-}" ]; then
        commands "$N" lock "$format" | redis-cli -p "$port" --pipe >/dev/null
        redis-cli -p "$port" save >/dev/null
        redis-cli -p "$port" flushall >/dev/null
        callgrind_control -z "$pid" >/dev/null 2>&1
        [ "$(redis-cli -p "$port" debug reload nosave)" = OK ] || { echo "$name: DEBUG RELOAD NOSAVE failed" >&2; exit 1; }
        # The warm-up keys load too.
        [ "$(redis-cli -p "$port" dbsize)" = $((N + 500)) ] || { echo "$name: keys missing after the load" >&2; exit 1; }
    else
        callgrind_control -z "$pid" >/dev/null 2>&1
        commands "$N" lock "$format" | redis-cli -p "$port" --pipe >/dev/null
    fi
    callgrind_control --dump="$name" "$pid" >/dev/null 2>&1
    redis-cli -p "$port" shutdown nosave >/dev/null 2>&1 || true
    wait "$vg" || true
    mv "$(ls "$work/$name".*[0-9].1 | head -1)" "$work/$name.out"
}

count set "SET KEY OWNER NX PX 3600000"
count floor "FLOOR.TOKENLOCK KEY OWNER PX 3600000"
cmd=${CMD:-RLOCK.ACQUIRE KEY OWNER PX 3600000}
count rlock "$cmd"

what="calls: $N   AOF: $aof" calls=$N
[ -z "${LOAD:-}" ] || { calls=$((N + 500)); what="RDB load of $calls keys, a call = one value"; }
echo "module: $so   $what   (64-byte lines of code executed on at least half of the calls)"
python3 - "$calls" "${TOP:-0}" "$work" "$(readlink -f "$(command -v redis-server)")" "${cmd%% *}" "$so" "${LOAD:-}" <<'EOF'
import collections, re, subprocess, sys

calls, top, work, server, command, so, load = int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:8]


def object_name(ob):
    # Debian's redis-server is a link to redis-check-rdb.
    return "redis-server" if ob == server else ob.rsplit("/", 1)[-1]


total_instructions = {}
# Instructions run inside the command's own procedure (setCommand, or the
# module command dispatcher), callees included: the span INFO commandstats
# times, so the ratio of these is the instruction-count image of table (a)'s.
PROCS = ("setCommand", "RedisModuleCommandDispatcher", "ValkeyModuleCommandDispatcher")
in_proc = collections.Counter()


def hot_instructions(path):
    """(object, address) -> function of the instructions run on >= half the calls.
    Addresses are offsets within their object, so the object is part of the key."""
    runs, function = collections.Counter(), {}
    ob = fn = None
    after_calls = False
    for line in open(path, errors="replace"):
        if line.startswith("summary:"):
            total_instructions[path] = int(line.split()[1])
        if line.startswith("ob="):
            ob = line[3:].strip()
        elif line.startswith("fn="):
            fn = line[3:].strip()
        elif line.startswith("calls="):
            after_calls = True  # the next cost line is the callee's, inclusive
        elif line.startswith("0x"):
            fields = line.split()  # address, source line, Ir
            if fn in PROCS:  # its own instructions and its callees' (after calls=)
                in_proc[path] += int(fields[2]) if len(fields) > 2 else 0
            if after_calls:
                after_calls = False
                continue
            at = (ob, int(fields[0], 16))
            runs[at] += int(fields[2]) if len(fields) > 2 else 0
            function[at] = fn
    return {at: function[at] for at, n in runs.items() if n >= calls / 2}


def instruction_sizes(obj):
    starts = []
    dump = subprocess.run(["objdump", "-d", "--no-show-raw-insn", obj], capture_output=True, text=True)
    for line in dump.stdout.splitlines():
        m = re.match(r"^\s+([0-9a-f]+):\s", line)
        if m:
            starts.append(int(m.group(1), 16))
    return {a: b - a for a, b in zip(starts, starts[1:])}


for name, label in [("set", "SET NX PX"), ("floor", "C module floor"), ("rlock", command)]:
    hot = hot_instructions(f"{work}/{name}.out")
    lines = collections.defaultdict(set)
    for ob, address in hot:
        lines[ob].add(address >> 6)
    total = sum(len(s) for s in lines.values())
    by_object = ", ".join(
        f"{object_name(ob)} {len(s)}" for ob, s in sorted(lines.items(), key=lambda x: -len(x[1]))
    )
    per_call = total_instructions.get(f"{work}/{name}.out", 0) / calls
    proc = "" if load else f" ({in_proc[f'{work}/{name}.out'] / calls:,.0f} in the command's procedure)"
    print(f"{label:18} {total:4} lines ({total * 64 / 1024:.1f} KB): {by_object}; "
          f"{per_call:,.0f} instructions per call{proc}")
    module = [(ob, a) for ob, a in hot if ob == so]
    if module:
        sizes = instruction_sizes(module[0][0])
        size = sum(sizes.get(a, 4) for _, a in module)
        print(f"{'':18} {so.rsplit('/', 1)[-1]}: {len(module)} instructions, {size} bytes, "
              f"{len({a >> 6 for _, a in module})} lines (packed: {-(-size // 64)})")
        per_function = collections.defaultdict(list)
        for ob, a in module:
            per_function[hot[ob, a]].append(a)
        heaviest = sorted(per_function.items(), key=lambda x: -len(x[1]))[:top]
        for fn, addresses in heaviest:
            print(f"{'':20} {len(addresses):4} instructions {len({a >> 6 for a in addresses}):3} lines  {fn[:90]}")
EOF
