//! Chaos: a seeded random driver. Several connections send random, mostly
//! valid commands of every family on a small key set (so they collide), mixed
//! with keyspace operations on the same keys (DEL, UNLINK, RENAME, MOVE, COPY,
//! SWAPDB, FLUSHDB/FLUSHALL, EXPIRE/PERSIST, DUMP/RESTORE [REPLACE], SET over a
//! lock), MULTI/EXEC blocks, Lua scripts calling lock commands, SELECT, CLIENT
//! KILL and CLIENT UNBLOCK of holders and parked waiters, short CLIENT PAUSE
//! WRITE, DEBUG RELOAD and BGREWRITEAOF (appendonly yes), with a replica attached
//! the whole time. Leases are mostly 1-50 ms, so expiry and hand-over happen all
//! the time; some holds are KEEPALIVE, some waiters BLOCK 0.
//!
//! Checked: both servers stay up and log no panic, internal error, assertion,
//! refused replicated change, nor any error the replica answered its master's
//! stream with (Redis's own commands too); every reply has the shape its
//! command promises and every error reply is one the contract allows (the
//! kinds seen are printed); no command hangs; at mid-run snapshots (traffic
//! stopped, writes paused, the replica caught up) the replica's `DEBUG
//! DIGEST` equals the master's (per-key
//! `DEBUG DIGEST-VALUE` differences are printed when not); at the end, with every
//! client gone, no waiter or KEEPALIVE binding is left, `DEBUG RELOAD` and a
//! restart from the AOF give back the same digest, the replica follows, and after
//! every lock is force-released the counters are back at zero.
//!
//! `RLOCK_CHAOS_SEED=n` replays a seed (timing still varies), `RLOCK_CHAOS_SECS`
//! sets the duration (default 20 s). The seed is printed in every failure.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

use common::*;
use redis::RedisError;

// ---------------------------------------------------------------- randomness

/// common::Rng (splitmix64), with what the driver picks with it.
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x9E37_79B9_7F4A_7C15)
    }
    /// lo ..= hi
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi - lo + 1)
    }
    /// true with probability `percent` %
    fn pct(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
    fn pick<'a, T>(&mut self, v: &'a [T]) -> &'a T {
        &v[self.below(v.len() as u64) as usize]
    }
}

fn seed() -> u64 {
    std::env::var("RLOCK_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
                % 1_000_000_007
        })
}

fn duration() -> Duration {
    let secs = std::env::var("RLOCK_CHAOS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    Duration::from_secs(secs)
}

// ---------------------------------------------------------------- commands

/// The fifth key is `ck0`'s parking name (what `ck0`'s waiters are parked on
/// in Redis): every lock made there is offered to them, and they are told
/// TRYAGAIN (`blocking::on_key_ready`; declining crashed Redis 7.0).
const KEYS: [&str; 8] = [
    "ck0",
    "ck1",
    "ck2",
    "ck3",
    "ck0\0rlock:parked",
    "ck5",
    "ck6",
    "ck7",
];
/// Short owners, Redisson's `<uuid>:<threadId>` (packed in 17 bytes by the
/// encoding), a binary one and a long one.
const OWNERS: [&str; 6] = [
    "o0",
    "o1",
    "8d5f4c2e-1a2b-4c3d-9e8f-0123456789ab:1",
    "8d5f4c2e-1a2b-4c3d-9e8f-0123456789ab:42",
    "bin\0\r\n\x7f-owner",
    "long-owner-0123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789012345678901234567890123456789",
];
const FAMILIES: [&str; 4] = ["RLOCK", "FAIRLOCK", "RWLOCK", "SEMAPHORE"];

type Args = Vec<Vec<u8>>;

fn args(parts: &[&str]) -> Args {
    parts.iter().map(|s| s.as_bytes().to_vec()).collect()
}

fn text(a: &Args) -> String {
    a.iter()
        .map(|p| {
            if p.iter().all(|b| b.is_ascii_graphic()) {
                String::from_utf8_lossy(p).into_owned()
            } else {
                format!("<{} bytes>", p.len())
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Key `i` is mostly used by family `i % 4`, so most commands find a lock
/// of their own family, and some collide.
fn key_and_family(r: &mut Rng) -> (&'static str, &'static str) {
    let i = r.below(KEYS.len() as u64) as usize;
    let fam = if r.pct(85) {
        FAMILIES[i % 4]
    } else {
        *r.pick(&FAMILIES)
    };
    (KEYS[i], fam)
}

fn lease(r: &mut Rng, out: &mut Vec<String>) {
    match r.below(100) {
        0..=64 => out.extend(["PX".into(), r.range(1, 50).to_string()]),
        65..=84 => out.extend(["PX".into(), r.range(100, 1500).to_string()]),
        85..=91 => out.extend(["EX".into(), "1".into()]),
        _ => {} // the default lease (30 s)
    }
}

/// What a command's successful reply must look like.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    TokenOrNil,
    Int,
    One,
    ZeroOrOne,
    InfoOrNil,
    TokensOrNil,
    Ints,
    Any,
}

struct Cmd {
    args: Args,
    shape: Shape,
}

fn cmd_of(parts: Vec<String>, shape: Shape) -> Cmd {
    Cmd {
        args: parts.into_iter().map(String::into_bytes).collect(),
        shape,
    }
}

/// A BLOCK timeout up to `max`: never 0 (forever) on a worker's own
/// connection (`max` above 100), which would wait past the hang timeout;
/// inside MULTI and scripts (`max` 100) BLOCK is one try, 0 included.
fn block_ms(r: &mut Rng, max: u64) -> u64 {
    r.range(if max > 100 { 1 } else { 0 }, max)
}

/// A random, valid command of one of the lock families. `block_max`: the
/// longest BLOCK it may carry (0: none); `keepalive`: whether it may bind.
fn lock_command(r: &mut Rng, block_max: u64, keepalive: bool) -> Cmd {
    let (key, fam) = key_and_family(r);
    let owner = *r.pick(&OWNERS);
    let rw = fam == "RWLOCK";
    let sem = fam == "SEMAPHORE";
    let mode = || if rw { Some(()) } else { None };
    let rwmode = |r: &mut Rng| if r.pct(60) { "READ" } else { "WRITE" };
    let mut p: Vec<String> = Vec::new();
    match r.below(100) {
        0..=39 => {
            p.push(format!("{fam}.ACQUIRE"));
            p.push(key.into());
            if mode().is_some() {
                p.push(rwmode(r).into());
            }
            p.push(owner.into());
            let mut opts: Vec<Vec<String>> = Vec::new();
            let mut l = Vec::new();
            lease(r, &mut l);
            if !l.is_empty() {
                opts.push(l);
            }
            if block_max > 0 && r.pct(40) {
                opts.push(vec!["BLOCK".into(), block_ms(r, block_max).to_string()]);
            }
            if keepalive && r.pct(20) {
                opts.push(vec!["KEEPALIVE".into()]);
            }
            if sem {
                let limit = r.range(1, 4);
                opts.push(vec!["LIMIT".into(), limit.to_string()]);
                if r.pct(50) {
                    opts.push(vec!["PERMITS".into(), r.range(1, limit).to_string()]);
                }
            }
            // options in any order
            for i in (1..opts.len()).rev() {
                opts.swap(i, r.below(i as u64 + 1) as usize);
            }
            p.extend(opts.into_iter().flatten());
            cmd_of(p, Shape::TokenOrNil)
        }
        40..=64 => {
            p.push(format!("{fam}.RELEASE"));
            p.push(key.into());
            if rw {
                p.push(rwmode(r).into());
            }
            p.push(owner.into());
            if sem && r.pct(30) {
                p.extend(["PERMITS".into(), r.range(1, 2).to_string()]);
            }
            cmd_of(p, Shape::Int)
        }
        65..=76 => {
            p.extend([format!("{fam}.RENEW"), key.into(), owner.into()]);
            lease(r, &mut p);
            cmd_of(p, Shape::One)
        }
        77..=80 => cmd_of(
            vec![format!("{fam}.FORCERELEASE"), key.into()],
            Shape::ZeroOrOne,
        ),
        _ => cmd_of(vec![format!("{fam}.INFO"), key.into()], Shape::InfoOrNil),
    }
}

/// Two or three distinct keys.
fn some_keys(r: &mut Rng) -> Vec<&'static str> {
    let n = r.range(2, 3) as usize;
    let mut ks: Vec<&str> = Vec::new();
    while ks.len() < n {
        let k = *r.pick(&KEYS);
        if !ks.contains(&k) {
            ks.push(k);
        }
    }
    ks
}

fn multi_key_command(r: &mut Rng, block_max: u64, keepalive: bool) -> Cmd {
    let ks = some_keys(r);
    let owner = *r.pick(&OWNERS);
    let mut p: Vec<String> = Vec::new();
    let which = r.below(100);
    let name = match which {
        0..=54 => "RLOCK.ACQUIREALL",
        55..=84 => "RLOCK.RELEASEALL",
        _ => "RLOCK.RENEWALL",
    };
    p.push(name.into());
    p.push(ks.len().to_string());
    p.extend(ks.iter().map(|k| k.to_string()));
    p.push(owner.into());
    match which {
        0..=54 => {
            lease(r, &mut p);
            if block_max > 0 && r.pct(40) {
                p.extend(["BLOCK".into(), block_ms(r, block_max).to_string()]);
            }
            if keepalive && r.pct(15) {
                p.push("KEEPALIVE".into());
            }
            cmd_of(p, Shape::TokensOrNil)
        }
        55..=84 => cmd_of(p, Shape::Ints),
        _ => {
            lease(r, &mut p);
            cmd_of(p, Shape::One)
        }
    }
}

/// DUMP payloads taken during the run, restored later (over any key).
type Dumps = Mutex<Vec<Vec<u8>>>;

fn keyspace_command(r: &mut Rng, db: i64, dumps: &Dumps) -> Cmd {
    let k = *r.pick(&KEYS);
    let k2 = *r.pick(&KEYS);
    let other_db = if db == 0 { "1" } else { "0" };
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let any = |v: Vec<String>| cmd_of(v, Shape::Any);
    match r.below(100) {
        0..=7 => any(s(&["DEL", k])),
        8..=11 => any(s(&["UNLINK", k, k2])),
        12..=19 => any(s(&[if r.pct(70) { "RENAME" } else { "RENAMENX" }, k, k2])),
        20..=24 => any(s(&["MOVE", k, other_db])),
        25..=32 => {
            let mut v = s(&["COPY", k, k2]);
            if r.pct(30) {
                v.extend(s(&["DB", other_db]));
            }
            if r.pct(50) {
                v.push("REPLACE".into());
            }
            any(v)
        }
        33..=36 => any(s(&["PEXPIRE", k, &r.range(1, 100).to_string()])),
        37..=39 => any(s(&["EXPIRE", k, &r.range(1, 3).to_string()])),
        40..=42 => any(s(&["PERSIST", k])),
        43..=49 => any(s(&["DUMP", k])),
        50..=61 => {
            let payload = {
                let d = dumps.lock().unwrap();
                if d.is_empty() {
                    None
                } else {
                    Some(d[r.below(d.len() as u64) as usize].clone())
                }
            };
            match payload {
                None => any(s(&["EXISTS", k])),
                Some(p) => {
                    let ttl = if r.pct(60) {
                        "0".to_string()
                    } else {
                        r.range(1, 2000).to_string()
                    };
                    let mut a: Args = vec![b"RESTORE".to_vec(), k.into(), ttl.into_bytes(), p];
                    if r.pct(70) {
                        a.push(b"REPLACE".to_vec());
                    }
                    Cmd {
                        args: a,
                        shape: Shape::Any,
                    }
                }
            }
        }
        62..=64 => {
            if r.pct(50) {
                any(s(&["SET", k, "v", "PX", &r.range(1, 200).to_string()]))
            } else {
                any(s(&["SET", k, "v"]))
            }
        }
        65..=66 => any(s(&["LPUSH", k, "x"])),
        67..=72 => any(s(&["PTTL", k])),
        73..=77 => any(s(&["TYPE", k])),
        78..=82 => any(s(&["MEMORY", "USAGE", k])),
        83..=87 => any(s(&["DEBUG", "DIGEST-VALUE", k, k2])),
        88..=90 => any(s(&["OBJECT", "ENCODING", k])),
        91..=93 => any(s(&["SCAN", "0", "COUNT", "100"])),
        94..=96 => any(s(&["EXISTS", k, k2])),
        _ => any(s(&[
            "PEXPIREAT",
            k,
            &(unix_ms() + r.range(1, 100) as i64).to_string(),
        ])),
    }
}

/// A command for a MULTI/EXEC block or a script (no BLOCK waits there, and
/// KEEPALIVE only in MULTI).
fn inner_command(r: &mut Rng, db: i64, dumps: &Dumps, keepalive: bool) -> Cmd {
    match r.below(100) {
        0..=59 => lock_command(r, 100, keepalive),
        60..=74 => multi_key_command(r, 100, keepalive),
        _ => keyspace_command(r, db, dumps),
    }
}

// ---------------------------------------------------------------- checking

struct Shared {
    seed: u64,
    stop: AtomicBool,
    /// Traffic takes it shared for each operation; a snapshot takes it whole.
    gate: RwLock<()>,
    /// Error replies seen, by kind.
    kinds: Mutex<BTreeMap<String, u64>>,
    /// What must fail the test.
    findings: Mutex<Vec<String>>,
    /// Client ids of the traffic connections (for CLIENT KILL / UNBLOCK).
    ids: Mutex<BTreeMap<usize, i64>>,
    dumps: Dumps,
    ops: AtomicU64,
    /// `RLOCK_CHAOS_TRACE=file`: every command and its reply, timestamped.
    trace: Option<Mutex<std::fs::File>>,
    /// Whether a replica follows the master (else the replica's operations
    /// go to the master: DEBUG RELOAD there, which diverges a replica).
    with_replica: bool,
}

impl Shared {
    fn finding(&self, what: String) {
        let mut f = self.findings.lock().unwrap();
        if f.len() < 50 {
            eprintln!("chaos seed {}: FINDING: {what}", self.seed);
            f.push(what);
        }
    }
    fn count_kind(&self, kind: String) {
        *self.kinds.lock().unwrap().entry(kind).or_default() += 1;
    }
}

/// The error replies the contract allows, as a short kind, or None.
fn allowed_error(e: &RedisError) -> Option<String> {
    allowed(e.code().unwrap_or(""), e.detail().unwrap_or(""))
}

fn allowed(code: &str, detail: &str) -> Option<String> {
    let ok = match code {
        "WRONGTYPE" | "NOTOWNER" | "TRYAGAIN" | "DEADLOCK" | "BUSYKEY" | "UNBLOCKED"
        | "EXECABORT" => true,
        "ERR" => [
            "the owner holds READ: upgrading to WRITE would deadlock",
            "the owner holds fewer permits than it releases",
            "no such key",
            "source and destination objects are the same",
            "KEEPALIVE binds a holding to a client connection",
            "Background append only file rewriting",
            "Background save already in progress",
            "No such client",
            // COPY of a lock key: the data type has no copy callback (a copy
            // would be a second lock with the same holders and tokens).
            "not supported for this module key",
        ]
        .iter()
        .any(|p| detail.starts_with(p)),
        _ => false,
    };
    if !ok {
        return None;
    }
    let short: String = detail
        .split_whitespace()
        .take(4)
        .collect::<Vec<_>>()
        .join(" ");
    Some(if code == "ERR" {
        format!("ERR {short}")
    } else if code == "TRYAGAIN" && detail.contains("parked on") {
        // A waiter of ck0 offered a lock made at its parking name.
        "TRYAGAIN (parking name taken)".to_string()
    } else {
        code.to_string()
    })
}

/// The errors a script returned as strings (`error: CODE detail`), each
/// judged as a reply would be.
fn script_errors(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::BulkString(b) => {
            let s = String::from_utf8_lossy(b);
            if let Some(e) = s.strip_prefix("error: ") {
                out.push(e.to_string());
            }
        }
        Value::Array(a) => a.iter().for_each(|x| script_errors(x, out)),
        _ => {}
    }
}

fn is_disconnect(e: &RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal()
}

fn is_timeout(e: &RedisError) -> bool {
    e.is_timeout()
}

fn is_token(v: &Value) -> bool {
    matches!(v, Value::Int(t) if *t > 0)
}

fn shape_ok(shape: Shape, v: &Value) -> bool {
    match shape {
        Shape::Any => true,
        Shape::TokenOrNil => matches!(v, Value::Nil) || is_token(v),
        Shape::Int => matches!(v, Value::Int(n) if *n >= 0),
        Shape::One => matches!(v, Value::Int(1)),
        Shape::ZeroOrOne => matches!(v, Value::Int(0) | Value::Int(1)),
        Shape::InfoOrNil => match v {
            Value::Nil => true,
            Value::Array(a) => a.len() % 2 == 0 && !a.is_empty(),
            Value::Map(_) => true,
            _ => false,
        },
        Shape::TokensOrNil => match v {
            Value::Nil => true,
            Value::Array(a) => !a.is_empty() && a.iter().all(is_token),
            _ => false,
        },
        Shape::Ints => {
            matches!(v, Value::Array(a) if a.iter().all(|x| matches!(x, Value::Int(n) if *n >= 0)))
        }
    }
}

/// A `*.INFO` reply (RESP2: field, value, ...) as a map of its top fields.
fn info_fields(v: &Value) -> BTreeMap<String, Value> {
    let mut out = BTreeMap::new();
    if let Value::Array(a) = v {
        for kv in a.chunks(2) {
            if let [Value::BulkString(k), val] = kv {
                out.insert(String::from_utf8_lossy(k).into_owned(), val.clone());
            }
        }
    }
    out
}

/// What a lock's `*.INFO` must say whatever happened to it: its family, at
/// least one live holder, a writer alone, a semaphore's sums.
fn info_consistent(family: &str, v: &Value) -> Result<(), String> {
    if matches!(v, Value::Nil) {
        return Ok(());
    }
    let f = info_fields(v);
    let int = |name: &str| match f.get(name) {
        Some(Value::Int(n)) => Ok(*n),
        other => Err(format!("{name} is {other:?}")),
    };
    let want = family.to_lowercase();
    match f.get("kind") {
        Some(Value::BulkString(k)) if k == want.as_bytes() => {}
        other => return Err(format!("kind {other:?}, expected {want}")),
    }
    if int("waiters")? < 0 {
        return Err("negative waiters".into());
    }
    match family {
        "RLOCK" | "FAIRLOCK" if int("holds")? < 1 || int("token")? < 1 || int("ttl")? < 0 => {
            return Err("holds, token or ttl out of range".into());
        }
        "RWLOCK" => {
            let writer = !matches!(f.get("writer"), Some(Value::Nil));
            let readers = match f.get("readers") {
                Some(Value::Array(a)) => a.len() as i64,
                other => return Err(format!("readers {other:?}")),
            };
            if readers != int("reader_count")? {
                return Err("reader_count differs from the readers listed".into());
            }
            if !writer && readers == 0 {
                return Err("no writer and no reader".into());
            }
            if writer && int("writer_holds")? < 1 {
                return Err("a writer with no WRITE hold".into());
            }
        }
        "SEMAPHORE" => {
            let (limit, used, available) = (int("limit")?, int("used")?, int("available")?);
            let holders = match f.get("holders") {
                Some(Value::Array(a)) => a.clone(),
                other => return Err(format!("holders {other:?}")),
            };
            let sum: i64 = holders
                .iter()
                .map(|h| match info_fields(h).get("permits") {
                    Some(Value::Int(n)) if *n > 0 => *n,
                    _ => i64::MIN / 4,
                })
                .sum();
            if holders.is_empty() || sum != used || available != (limit - used).max(0) {
                return Err(format!(
                    "limit {limit} used {used} available {available}, holders' permits sum to {sum}"
                ));
            }
            if int("holder_count")? != holders.len() as i64 {
                return Err("holder_count differs from the holders listed".into());
            }
        }
        _ => {}
    }
    Ok(())
}

/// Anything that mentions an internal error or a panic is a finding wherever
/// it appears (also nested in a script's or a transaction's reply).
fn mentions_internal(v: &Value) -> bool {
    match v {
        Value::ServerError(e) => {
            let s = format!("{e:?}");
            s.contains("internal") || s.contains("panic")
        }
        Value::SimpleString(s) => s.contains("internal error"),
        Value::BulkString(b) => String::from_utf8_lossy(b).contains("internal error"),
        Value::Array(a) | Value::Set(a) => a.iter().any(mentions_internal),
        Value::Map(m) => m
            .iter()
            .any(|(k, v)| mentions_internal(k) || mentions_internal(v)),
        _ => false,
    }
}

/// What happened to one call, from the driver's point of view.
enum Outcome {
    Done,
    /// The connection is gone (killed by the driver, or the server died).
    Reconnect,
}

fn judge(sh: &Shared, what: &str, shape: Shape, res: redis::RedisResult<Value>) -> Outcome {
    sh.ops.fetch_add(1, Ordering::Relaxed);
    if let Some(t) = &sh.trace {
        use std::io::Write;
        let thread = std::thread::current().name().unwrap_or("?").to_string();
        let _ = writeln!(
            t.lock().unwrap(),
            "{} [{thread}] {what} -> {:?}",
            unix_ms(),
            res
        );
    }
    match res {
        Ok(v) => {
            if mentions_internal(&v) {
                sh.finding(format!("{what}: reply mentions an internal error: {v:?}"));
            } else if !shape_ok(shape, &v) {
                sh.finding(format!(
                    "{what}: malformed reply {v:?} (expected {shape:?})"
                ));
            } else if shape == Shape::InfoOrNil {
                let family = what
                    .trim_start_matches("(replica) ")
                    .split('.')
                    .next()
                    .unwrap();
                if let Err(e) = info_consistent(family, &v) {
                    sh.finding(format!("{what}: inconsistent INFO ({e}): {v:?}"));
                }
            }
            let mut errs = Vec::new();
            script_errors(&v, &mut errs);
            for e in errs {
                let (code, detail) = e.split_once(' ').unwrap_or((&e, ""));
                match allowed(code, detail) {
                    Some(kind) => sh.count_kind(format!("script: {kind}")),
                    None => sh.finding(format!("{what}: unexpected error in a script: {e}")),
                }
            }
            Outcome::Done
        }
        Err(e) if is_timeout(&e) => {
            sh.finding(format!("{what}: no reply within the read timeout (hang?)"));
            Outcome::Reconnect
        }
        Err(e) if is_disconnect(&e) => Outcome::Reconnect,
        Err(e) => {
            match allowed_error(&e) {
                Some(kind) => sh.count_kind(kind),
                None => {
                    let s = e.to_string();
                    sh.count_kind(format!("UNEXPECTED {}", e.code().unwrap_or("?")));
                    sh.finding(format!("{what}: unexpected error reply: {s}"));
                }
            }
            Outcome::Done
        }
    }
}

fn send(c: &mut Connection, a: &Args) -> redis::RedisResult<Value> {
    let mut command = redis::cmd(std::str::from_utf8(&a[0]).unwrap());
    for p in &a[1..] {
        command.arg(&p[..]);
    }
    command.query(c)
}

fn connect(s_port: u16, timeout: Option<Duration>) -> Option<Connection> {
    for _ in 0..200 {
        if let Ok(client) = redis::Client::open(format!("redis://127.0.0.1:{s_port}/")) {
            if let Ok(c) = client.get_connection_with_timeout(Duration::from_secs(2)) {
                c.set_read_timeout(timeout).ok()?;
                return Some(c);
            }
        }
        sleep(Duration::from_millis(50));
    }
    None
}

// ---------------------------------------------------------------- traffic

/// A traffic connection: its id registered for CLIENT KILL/UNBLOCK, its db.
struct Conn {
    c: Connection,
    db: i64,
}

fn open(sh: &Shared, port: u16, slot: usize, timeout: Option<Duration>) -> Option<Conn> {
    let mut c = connect(port, timeout)?;
    let id: i64 = redis::cmd("CLIENT").arg("ID").query(&mut c).ok()?;
    sh.ids.lock().unwrap().insert(slot, id);
    Some(Conn { c, db: 0 })
}

/// No reply within this long is a hang (valgrind slows the server ~20x).
fn read_timeout() -> Duration {
    Duration::from_secs(if valgrind() { 200 } else { 20 })
}

/// A worker: random commands of every kind, BLOCK up to 300 ms.
fn worker(sh: Arc<Shared>, port: u16, slot: usize) {
    let mut r = Rng::new(sh.seed.wrapping_mul(1000 + slot as u64));
    let mut conn = open(&sh, port, slot, Some(read_timeout()));
    while !sh.stop.load(Ordering::Relaxed) {
        let Some(cn) = conn.as_mut() else {
            sh.finding(format!("worker {slot}: cannot connect to the master"));
            return;
        };
        let _g = sh.gate.read().unwrap();
        if sh.stop.load(Ordering::Relaxed) {
            break;
        }
        let outcome = match r.below(100) {
            0..=49 => {
                let c = lock_command(&mut r, 300, true);
                let res = send(&mut cn.c, &c.args);
                judge(&sh, &text(&c.args), c.shape, res)
            }
            50..=59 => {
                let c = multi_key_command(&mut r, 300, true);
                let res = send(&mut cn.c, &c.args);
                judge(&sh, &text(&c.args), c.shape, res)
            }
            60 => {
                // A lock with more holders than Redis frees in place (64):
                // readers or permits, sometimes UNLINKed at once.
                let (key, fam) = if r.pct(50) {
                    (KEYS[2 + 4 * r.below(2) as usize], "RWLOCK")
                } else {
                    (KEYS[3 + 4 * r.below(2) as usize], "SEMAPHORE")
                };
                let n = r.range(65, 120);
                // One at a time: the crate's pipeline stops reading at the
                // first error reply and leaves the rest on the connection.
                let mut last = Outcome::Done;
                for i in 0..n {
                    let mut c = vec![format!("{fam}.ACQUIRE"), key.to_string()];
                    if fam == "RWLOCK" {
                        c.push("READ".into());
                    }
                    c.extend([format!("m{i}"), "PX".into(), r.range(20, 400).to_string()]);
                    if fam == "SEMAPHORE" {
                        c.extend(["LIMIT".into(), "200".into()]);
                    }
                    let c = cmd_of(c, Shape::TokenOrNil);
                    let res = send(&mut cn.c, &c.args);
                    let stop = !matches!(res, Ok(Value::Int(_)));
                    last = judge(&sh, &text(&c.args), c.shape, res);
                    if stop {
                        break;
                    }
                }
                if r.pct(40) && matches!(last, Outcome::Done) {
                    let c = args(&["UNLINK", key]);
                    let res = send(&mut cn.c, &c);
                    last = judge(&sh, &text(&c), Shape::Any, res);
                }
                last
            }
            61..=83 => {
                let c = keyspace_command(&mut r, cn.db, &sh.dumps);
                let res = send(&mut cn.c, &c.args);
                if c.args[0] == b"DUMP" {
                    if let Ok(Value::BulkString(p)) = &res {
                        let mut d = sh.dumps.lock().unwrap();
                        if d.len() < 32 {
                            d.push(p.clone());
                        } else {
                            let i = r.below(32) as usize;
                            d[i] = p.clone();
                        }
                    }
                }
                judge(&sh, &text(&c.args), c.shape, res)
            }
            84..=89 => {
                // MULTI/EXEC mixing lock and keyspace commands.
                let n = r.range(2, 5);
                let mut p = redis::pipe();
                p.atomic();
                let mut what = vec!["MULTI".to_string()];
                for _ in 0..n {
                    let c = inner_command(&mut r, cn.db, &sh.dumps, true);
                    what.push(text(&c.args));
                    let mut command = redis::cmd(std::str::from_utf8(&c.args[0]).unwrap());
                    for a in &c.args[1..] {
                        command.arg(&a[..]);
                    }
                    p.add_command(command);
                }
                let res: redis::RedisResult<Value> = p.query(&mut cn.c);
                judge(&sh, &what.join(" ; "), Shape::Any, res)
            }
            90..=94 => {
                // A script calling lock commands (BLOCK is one try there).
                let n = r.range(1, 4);
                let mut a: Args = vec![b"EVAL".to_vec(), SCRIPT.as_bytes().to_vec(), b"0".to_vec()];
                for _ in 0..n {
                    let c = inner_command(&mut r, cn.db, &sh.dumps, false);
                    // DEBUG is not allowed in scripts; RESTORE payloads are binary.
                    if c.args[0] == b"RESTORE" || c.args[0] == b"DEBUG" {
                        continue;
                    }
                    a.push(c.args.len().to_string().into_bytes());
                    a.extend(c.args);
                }
                let res = send(&mut cn.c, &a);
                judge(&sh, &text(&a), Shape::Any, res)
            }
            95 => {
                // An RWLOCK downgrade: WRITE, READ by the same owner, WRITE released.
                let k = KEYS[2 + 4 * r.below(2) as usize];
                let o = *r.pick(&OWNERS);
                let px = r.range(5, 300).to_string();
                let mut last = Outcome::Done;
                for (c, shape) in [
                    (
                        args(&["RWLOCK.ACQUIRE", k, "WRITE", o, "PX", &px]),
                        Shape::TokenOrNil,
                    ),
                    (
                        args(&["RWLOCK.ACQUIRE", k, "READ", o, "PX", &px]),
                        Shape::TokenOrNil,
                    ),
                    (args(&["RWLOCK.RELEASE", k, "WRITE", o]), Shape::Int),
                ] {
                    let res = send(&mut cn.c, &c);
                    last = judge(&sh, &text(&c), shape, res);
                    if let Outcome::Reconnect = last {
                        break;
                    }
                }
                last
            }
            96..=97 => {
                let db = if r.pct(70) { 0 } else { 1 };
                let res = send(&mut cn.c, &args(&["SELECT", &db.to_string()]));
                if res.is_ok() {
                    cn.db = db;
                }
                judge(&sh, &format!("SELECT {db}"), Shape::Any, res)
            }
            _ => {
                // Close the connection (ends its KEEPALIVE holdings) and open another.
                Outcome::Reconnect
            }
        };
        drop(_g);
        if let Outcome::Reconnect = outcome {
            conn = open(&sh, port, slot, Some(read_timeout()));
        }
    }
}

/// Each argument group (count, then the command) runs through redis.pcall;
/// the script returns every reply (errors as strings so it goes on).
const SCRIPT: &str = r#"
local out = {}
local i = 1
while i <= #ARGV do
  local n = tonumber(ARGV[i])
  local cmd = {}
  for j = 1, n do cmd[j] = ARGV[i + j] end
  local ok = redis.pcall(unpack(cmd))
  if type(ok) == 'table' and ok.err then
    out[#out + 1] = 'error: ' .. ok.err
  else
    out[#out + 1] = ok
  end
  i = i + n + 1
end
return out
"#;

/// A parker: long waits (BLOCK 0 or seconds), often KEEPALIVE; once granted
/// it holds a moment, then releases or hangs up. CLIENT KILL / UNBLOCK and
/// deleted keys end its waits too.
fn parker(sh: Arc<Shared>, port: u16, slot: usize) {
    let mut r = Rng::new(sh.seed.wrapping_mul(2000 + slot as u64));
    let mut conn = open(&sh, port, slot, None);
    while !sh.stop.load(Ordering::Relaxed) {
        let Some(cn) = conn.as_mut() else {
            sh.finding(format!("parker {slot}: cannot connect to the master"));
            return;
        };
        let (key, fam) = key_and_family(&mut r);
        let owner = format!("p{slot}");
        let mut p: Vec<String> = vec![format!("{fam}.ACQUIRE"), key.into()];
        if fam == "RWLOCK" {
            p.push(if r.pct(50) { "READ" } else { "WRITE" }.into());
        }
        p.push(owner.clone());
        lease(&mut r, &mut p);
        let block = if r.pct(30) { 0 } else { r.range(500, 5000) };
        p.extend(["BLOCK".into(), block.to_string()]);
        if r.pct(50) {
            p.push("KEEPALIVE".into());
        }
        if fam == "SEMAPHORE" {
            p.extend(["LIMIT".into(), r.range(1, 3).to_string()]);
        }
        let c = cmd_of(p, Shape::TokenOrNil);
        // Sometimes the client gives up first: its socket times out and is
        // closed while the server has it parked (a disconnected waiter).
        let hang_up = r.pct(25);
        if hang_up {
            let ms = r.range(50, 2000);
            let _ = cn.c.set_read_timeout(Some(Duration::from_millis(ms)));
        }
        let res = send(&mut cn.c, &c.args);
        if hang_up {
            if matches!(&res, Err(e) if is_timeout(e)) {
                sh.ops.fetch_add(1, Ordering::Relaxed);
                conn = open(&sh, port, slot, None);
                continue;
            }
            let _ = cn.c.set_read_timeout(None);
        }
        let granted = matches!(res, Ok(Value::Int(_)));
        let mut outcome = judge(&sh, &text(&c.args), c.shape, res);
        if granted && matches!(outcome, Outcome::Done) {
            sleep(Duration::from_millis(r.range(0, 80)));
            if r.pct(50) {
                let mut rel: Vec<String> = vec![format!("{fam}.RELEASE"), key.into()];
                if fam == "RWLOCK" {
                    rel.push(c.args[2].iter().map(|&b| b as char).collect());
                }
                rel.push(owner);
                let rc = cmd_of(rel, Shape::Int);
                let res = send(&mut cn.c, &rc.args);
                outcome = judge(&sh, &text(&rc.args), rc.shape, res);
            } else {
                outcome = Outcome::Reconnect;
            }
        }
        if let Outcome::Reconnect = outcome {
            if sh.stop.load(Ordering::Relaxed) {
                break;
            }
            conn = open(&sh, port, slot, None);
        }
    }
}

/// Rare, server-wide operations.
fn admin(sh: Arc<Shared>, port: u16, replica_port: u16) {
    let mut r = Rng::new(sh.seed.wrapping_mul(3000));
    let mut c = connect(port, Some(read_timeout())).expect("admin connection");
    let mut rc = connect(replica_port, Some(read_timeout())).expect("admin connection to replica");
    while !sh.stop.load(Ordering::Relaxed) {
        sleep(Duration::from_millis(r.range(20, 250)));
        let _g = sh.gate.read().unwrap();
        if sh.stop.load(Ordering::Relaxed) {
            break;
        }
        let ids: Vec<i64> = sh.ids.lock().unwrap().values().copied().collect();
        let id = ids[r.below(ids.len() as u64) as usize].to_string();
        let (a, on_replica): (Args, bool) = match r.below(1000) {
            // Redis 7.0 crashed here before waiters were parked beside their
            // keys: tests/rlock.rs::killing_a_waiter_after_a_hand_over_on_lease_end_is_safe.
            0..=349 => (args(&["CLIENT", "KILL", "ID", &id]), false),
            350..=549 => {
                if r.pct(50) {
                    (args(&["CLIENT", "UNBLOCK", &id, "ERROR"]), false)
                } else {
                    (args(&["CLIENT", "UNBLOCK", &id]), false)
                }
            }
            550..=669 => (
                args(&["CLIENT", "PAUSE", &r.range(5, 40).to_string(), "WRITE"]),
                false,
            ),
            670..=769 => (args(&["SWAPDB", "0", "1"]), false),
            770..=829 => (args(&["BGREWRITEAOF"]), false),
            // Not DEBUG RELOAD on the master: Redis drops keys past their
            // TTL as it loads, without propagating a DEL, and the replica
            // keeps them (any type: a string too). It runs at the end, once
            // nothing is near its deadline.
            830..=869 => (args(&["DEBUG", "RELOAD"]), true),
            870..=899 => (
                args(&[if r.pct(50) { "FLUSHDB" } else { "FLUSHALL" }])
                    .into_iter()
                    .chain(if r.pct(30) {
                        Some(b"ASYNC".to_vec())
                    } else {
                        None
                    })
                    .collect(),
                false,
            ),
            900..=939 => (
                args(&[
                    "CONFIG",
                    "SET",
                    "rlock.deadlock-check-ms",
                    *r.pick(&["0", "20", "100", "1000"]),
                ]),
                false,
            ),
            940..=969 => (args(&["CLIENT", "KILL", "TYPE", "master"]), true),
            970..=984 => (args(&["DEBUG", "RELOAD"]), true),
            _ => (
                args(&[
                    "CONFIG",
                    "SET",
                    "rlock.default-lease-ms",
                    *r.pick(&["50", "1000", "30000"]),
                ]),
                false,
            ),
        };
        // Redis 7.0 mishandles CLIENT UNBLOCK of a client that CLIENT PAUSE
        // holds: UNBLOCK ... ERROR answers it twice (UNBLOCKED, then the
        // command's own reply once the pause ends: a plain SET too), plain
        // UNBLOCK crashes the server ("Unknown btype in
        // replyToBlockedClientTimedOut()"). A pause lasts until Redis notices
        // its end (up to a cron tick late): end it first.
        if a[0] == b"CLIENT" && a[1] == b"UNBLOCK" {
            let _ = send(&mut c, &args(&["CLIENT", "UNPAUSE"]));
        }
        // RLOCK_CHAOS_SKIP=word,word: leaves out the server-wide operations
        // whose text contains a word (to narrow a failure down).
        let what = text(&a);
        if std::env::var("RLOCK_CHAOS_SKIP")
            .unwrap_or_default()
            .split(',')
            .any(|w| !w.is_empty() && what.contains(w))
        {
            continue;
        }
        let on_replica = on_replica && sh.with_replica;
        let conn = if on_replica { &mut rc } else { &mut c };
        let res = send(conn, &a);
        let what = format!("{}{}", if on_replica { "(replica) " } else { "" }, text(&a));
        if let Outcome::Reconnect = judge(&sh, &what, Shape::Any, res) {
            let fresh = connect(
                if on_replica { replica_port } else { port },
                Some(read_timeout()),
            );
            match fresh {
                Some(f) if on_replica => rc = f,
                Some(f) => c = f,
                None => {
                    sh.finding(format!("admin: cannot reconnect after {what}"));
                    return;
                }
            }
        }
    }
}

/// Reads on the replica: INFO of every family, DIGEST-VALUE, MEMORY USAGE;
/// a lock command there must get READONLY.
fn replica_reader(sh: Arc<Shared>, port: u16) {
    let mut r = Rng::new(sh.seed.wrapping_mul(4000));
    let mut c = connect(port, Some(read_timeout())).expect("replica connection");
    while !sh.stop.load(Ordering::Relaxed) {
        sleep(Duration::from_millis(r.range(1, 10)));
        let k = *r.pick(&KEYS);
        let fam = *r.pick(&FAMILIES);
        let (a, shape) = match r.below(100) {
            0..=59 => (args(&[&format!("{fam}.INFO"), k]), Shape::InfoOrNil),
            60..=74 => (args(&["DEBUG", "DIGEST-VALUE", k]), Shape::Any),
            75..=89 => (args(&["MEMORY", "USAGE", k]), Shape::Any),
            _ => {
                let a = args(&["RLOCK.ACQUIRE", k, "ro", "PX", "10"]);
                match send(&mut c, &a) {
                    Err(e) if e.code() == Some("READONLY") => {}
                    Err(e) if is_disconnect(&e) => {
                        c = match connect(port, Some(read_timeout())) {
                            Some(c) => c,
                            None => return,
                        }
                    }
                    other => sh.finding(format!("replica: RLOCK.ACQUIRE gave {other:?}")),
                }
                continue;
            }
        };
        let res = send(&mut c, &a);
        if let Outcome::Reconnect = judge(&sh, &format!("(replica) {}", text(&a)), shape, res) {
            c = match connect(port, Some(read_timeout())) {
                Some(c) => c,
                None => return,
            };
        }
    }
}

// ---------------------------------------------------------------- snapshots

fn info_field(c: &mut Connection, section: &str, name: &str) -> Option<String> {
    let info: String = redis::cmd("INFO").arg(section).query(c).ok()?;
    let prefix = format!("{name}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().to_string())
}

/// Every key of dbs 0 and 1 with its DEBUG DIGEST-VALUE and TYPE.
fn per_key(c: &mut Connection) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for db in 0..2 {
        let _: () = redis::cmd("SELECT").arg(db).query(c).unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
        for k in keys {
            let d: Vec<String> = redis::cmd("DEBUG")
                .arg("DIGEST-VALUE")
                .arg(&k)
                .query(c)
                .unwrap_or_default();
            let t: String = redis::cmd("TYPE").arg(&k).query(c).unwrap_or_default();
            // Absolute, so the same on both servers (DEBUG DIGEST mixes it in).
            let at: i64 = redis::cmd("PEXPIRETIME").arg(&k).query(c).unwrap_or(-3);
            out.insert(
                format!("db{db}:{k}"),
                format!("{t} {} expires-at={at}", d.join(",")),
            );
        }
    }
    let _: () = redis::cmd("SELECT").arg(0).query(c).unwrap();
    out
}

/// The replica has applied everything the master sent.
fn caught_up(m: &mut Connection, rep: &mut Connection, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let mo = info_field(m, "replication", "master_repl_offset");
        let ro = info_field(rep, "replication", "slave_repl_offset");
        let up = info_field(rep, "replication", "master_link_status");
        if mo.is_some() && mo == ro && up.as_deref() == Some("up") {
            return true;
        }
        sleep(Duration::from_millis(5));
    }
    false
}

/// With writes paused on the master and the replica caught up: the same
/// digest on both. On a difference, the keys that differ.
fn compare(sh: &Shared, m: &mut Connection, rep: &mut Connection, when: &str) -> bool {
    if !sh.with_replica {
        return true;
    }
    let limit = Duration::from_secs(if valgrind() { 100 } else { 10 });
    if !caught_up(m, rep, limit) {
        sh.finding(format!(
            "{when}: the replica did not catch up within {limit:?}"
        ));
        return false;
    }
    let (dm, dr) = (digest(m), digest(rep));
    if dm == dr {
        return true;
    }
    let (km, kr) = (per_key(m), per_key(rep));
    let mut diff = Vec::new();
    for k in km.keys().chain(kr.keys()) {
        let (a, b) = (km.get(k), kr.get(k));
        if a != b
            && !diff
                .iter()
                .any(|d: &String| d.starts_with(&format!("{k}:")))
        {
            diff.push(format!("{k}: master {a:?} replica {b:?}"));
        }
    }
    let (sm, sr) = (keyspace(m), keyspace(rep));
    sh.finding(format!(
        "{when}: replica digest {dr} != master digest {dm}; keyspace master [{sm}] replica [{sr}]; live keys that differ:\n  {}",
        diff.join("\n  ")
    ));
    false
}

/// `INFO keyspace`'s db lines: counts keys past their TTL that Redis has not
/// reclaimed yet, which KEYS and DIGEST-VALUE skip and DEBUG DIGEST does not.
fn keyspace(c: &mut Connection) -> String {
    let s: String = redis::cmd("INFO")
        .arg("keyspace")
        .query(c)
        .unwrap_or_default();
    s.lines()
        .filter(|l| l.starts_with("db"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// Makes Redis delete every key past its TTL: `SCAN` expires the keys it
/// meets (on a master whose writes are not paused), `KEYS` only skips them.
fn reclaim_expired(c: &mut Connection) {
    for db in 0..2 {
        let _: () = redis::cmd("SELECT").arg(db).query(c).unwrap();
        let mut cursor = 0u64;
        loop {
            let (next, _): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("COUNT")
                .arg(1000)
                .query(c)
                .unwrap();
            cursor = next;
            if cursor == 0 {
                break;
            }
        }
    }
    let _: () = redis::cmd("SELECT").arg(0).query(c).unwrap();
}

/// Locks whose holds have all ended, taken out of the keyspace. Such a lock
/// normally goes with its key's TTL; one whose TTL a `PERSIST` took off stays
/// until a command touches it (README, "Limits and known gaps"), while a load
/// drops it. A `RENEW` by nobody ends what is over and changes nothing else.
fn reclaim_ended_locks(c: &mut Connection) {
    for db in 0..2 {
        let _: () = redis::cmd("SELECT").arg(db).query(c).unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
        for k in keys {
            for fam in FAMILIES {
                let _ = call(c, &[&format!("{fam}.RENEW"), &k, "\0nobody"]);
            }
        }
    }
    let _: () = redis::cmd("SELECT").arg(0).query(c).unwrap();
}

/// DEBUG DIGEST with the per-key view and `INFO keyspace` taken at the same
/// state: keys past their TTL are reclaimed first (DEBUG DIGEST counts them
/// until Redis's own expiry gets to them, and a restart drops them), and the
/// snapshot is taken again if anything changed while it was being read.
fn settled_snapshot(c: &mut Connection) -> (String, BTreeMap<String, String>, String) {
    let mut last = None;
    for _ in 0..5 {
        reclaim_expired(c);
        reclaim_ended_locks(c);
        let d = digest(c);
        let keys = per_key(c);
        let space = keyspace(c);
        if digest(c) == d {
            return (d, keys, space);
        }
        last = Some((d, keys, space));
    }
    last.unwrap()
}

fn unpause(c: &mut Connection) {
    let _: () = redis::cmd("CLIENT").arg("UNPAUSE").query(c).unwrap();
}

/// Lines of a server log that must not be there.
fn bad_log_lines(log: &str) -> Vec<String> {
    const BAD: [&str; 9] = [
        "panicked",
        "internal error",
        "ASSERTION",
        "crashed",
        "refused a replicated change",
        "Guru Meditation",
        "BUG REPORT",
        "rlock: refused",
        // A replica answering its master's command with an error (any
        // command, Redis's own too): "== CRITICAL == This replica is sending
        // an error to its master" (Valkey: "its primary").
        "is sending an error to its",
    ];
    // Redis follows a replica's error with the tail of its replication
    // backlog ("Latest backlog is: ..."): kept, it shows what came before.
    log.lines()
        .filter(|l| BAD.iter().any(|b| l.contains(b)) || l.contains("Latest backlog is"))
        .map(String::from)
        .take(20)
        .collect()
}

/// The smallest `ttl` field anywhere in a `*.INFO` reply.
fn min_ttl(v: &Value, acc: &mut i64) {
    if let Value::Array(a) = v {
        for (i, x) in a.iter().enumerate() {
            if let (Value::BulkString(name), Some(Value::Int(t))) = (x, a.get(i + 1)) {
                if name == b"ttl" {
                    *acc = (*acc).min(*t);
                }
            }
            min_ttl(x, acc);
        }
    }
}

/// When the last hold of each lock key of `keys` (`per_key`'s) ends, unix ms
/// (now for a lock none of whose holds is live).
fn holds_end(c: &mut Connection, keys: &BTreeMap<String, String>) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for name in keys.keys() {
        let Some((db, k)) = name.strip_prefix("db").and_then(|n| n.split_once(':')) else {
            continue;
        };
        let _: () = redis::cmd("SELECT").arg(db).query(c).unwrap();
        let now = unix_ms();
        for fam in FAMILIES {
            if let Ok(v) = call(c, &[&format!("{fam}.INFO"), k]) {
                let mut longest = 0;
                max_ttl(&v, &mut longest);
                out.insert(name.clone(), now + longest);
            }
        }
    }
    let _: () = redis::cmd("SELECT").arg(0).query(c).unwrap();
    out
}

/// The longest `ttl` field anywhere in a `*.INFO` reply.
fn max_ttl(v: &Value, acc: &mut i64) {
    if let Value::Array(a) = v {
        for (i, x) in a.iter().enumerate() {
            if let (Value::BulkString(name), Some(Value::Int(t))) = (x, a.get(i + 1)) {
                if name == b"ttl" {
                    *acc = (*acc).max(*t);
                }
            }
            max_ttl(x, acc);
        }
    }
}

/// The shortest time any hold or key of dbs 0 and 1 has left (ms).
fn shortest_time_left(c: &mut Connection) -> i64 {
    let mut least = i64::MAX;
    for db in 0..2 {
        let _: () = redis::cmd("SELECT").arg(db).query(c).unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
        for k in keys {
            let pttl: i64 = redis::cmd("PTTL").arg(&k).query(c).unwrap();
            if pttl >= 0 {
                least = least.min(pttl);
            }
            for fam in FAMILIES {
                if let Ok(v) = call(c, &[&format!("{fam}.INFO"), &k]) {
                    min_ttl(&v, &mut least);
                }
            }
        }
    }
    let _: () = redis::cmd("SELECT").arg(0).query(c).unwrap();
    least
}

/// Every lock key of dbs 0 and 1 force-released; what is left are other types.
fn force_release_all(c: &mut Connection) {
    for db in 0..2 {
        let _: () = redis::cmd("SELECT").arg(db).query(c).unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
        for k in keys {
            for fam in FAMILIES {
                let _ = call(c, &[&format!("{fam}.FORCERELEASE"), &k]);
            }
        }
    }
    let _: () = redis::cmd("SELECT").arg(0).query(c).unwrap();
}

fn lock_keys(c: &mut Connection) -> Vec<String> {
    let mut out = Vec::new();
    for db in 0..2 {
        let _: () = redis::cmd("SELECT").arg(db).query(c).unwrap();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(c).unwrap();
        for k in keys {
            let t: String = redis::cmd("TYPE").arg(&k).query(c).unwrap();
            if !["string", "list", "none"].contains(&t.as_str()) {
                out.push(format!("db{db}:{k} ({t})"));
            }
        }
    }
    let _: () = redis::cmd("SELECT").arg(0).query(c).unwrap();
    out
}

// ---------------------------------------------------------------- the run

fn named(name: String, f: impl FnOnce() + Send + 'static) -> JoinHandle<()> {
    std::thread::Builder::new().name(name).spawn(f).unwrap()
}

fn chaos_run(seed: u64, secs: Duration, with_replica: bool) {
    eprintln!(
        "chaos: seed {seed}, {} s, server {}, {} (RLOCK_CHAOS_SEED={seed} to replay)",
        secs.as_secs(),
        server_binary(),
        if with_replica {
            "with a replica"
        } else {
            "no replica, DEBUG RELOAD on the master"
        }
    );
    let mut master = Server::start_with(
        &[
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--maxclients",
            "200",
        ],
        &[],
    );
    let mut replica = Server::start();
    if with_replica {
        replica.replicate_from(&master);
    }
    let mut m = master.client();
    let mut rep = replica.client();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("rlock.deadlock-check-ms")
        .arg(100)
        .query(&mut m)
        .unwrap();
    let sh = Arc::new(Shared {
        seed,
        stop: AtomicBool::new(false),
        gate: RwLock::new(()),
        kinds: Mutex::new(BTreeMap::new()),
        findings: Mutex::new(Vec::new()),
        ids: Mutex::new(BTreeMap::new()),
        dumps: Mutex::new(Vec::new()),
        ops: AtomicU64::new(0),
        with_replica,
        // One file per run (the two tests would share it otherwise).
        trace: std::env::var("RLOCK_CHAOS_TRACE").ok().map(|p| {
            let p = format!("{p}.{}", if with_replica { "replica" } else { "reloads" });
            Mutex::new(std::fs::File::create(p).unwrap())
        }),
    });
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    const WORKERS: usize = 4;
    const PARKERS: usize = 3;
    for slot in 0..WORKERS {
        let sh = sh.clone();
        let port = master.port;
        threads.push(named(format!("w{slot}"), move || worker(sh, port, slot)));
    }
    for slot in WORKERS..WORKERS + PARKERS {
        let sh = sh.clone();
        let port = master.port;
        threads.push(named(format!("p{slot}"), move || parker(sh, port, slot)));
    }
    wait_until(Duration::from_secs(10), || {
        sh.ids.lock().unwrap().len() == WORKERS + PARKERS
    });
    {
        let sh = sh.clone();
        let (port, rport) = (master.port, replica.port);
        threads.push(named("admin".into(), move || admin(sh, port, rport)));
    }
    if with_replica {
        let sh = sh.clone();
        let rport = replica.port;
        threads.push(named("reader".into(), move || replica_reader(sh, rport)));
    }

    // Mid-run snapshots every ~3 s, liveness every 50 ms.
    let start = Instant::now();
    let mut next_snapshot = start + Duration::from_secs(3);
    let mut snapshots = 0;
    let mut matched = 0;
    while start.elapsed() < secs && sh.findings.lock().unwrap().is_empty() {
        sleep(Duration::from_millis(50));
        if !master.is_running() || !replica.is_running() {
            sh.finding("a server died".into());
            break;
        }
        if Instant::now() >= next_snapshot {
            next_snapshot = Instant::now() + Duration::from_secs(3);
            let _g = sh.gate.write().unwrap();
            pause_writes(&mut m, 20_000);
            snapshots += 1;
            if compare(
                &sh,
                &mut m,
                &mut rep,
                &format!("mid-run snapshot {snapshots}"),
            ) {
                matched += 1;
            }
            unpause(&mut m);
        }
    }

    if master.is_running() {
        let counters: Vec<String> = [
            "grants",
            "contended_grants",
            "wait_timeouts",
            "lease_expirations",
            "forced_releases",
            "deadlocks",
            "keepalive_renewals",
        ]
        .iter()
        .map(|n| format!("{n}={}", stat(&mut m, n)))
        .collect();
        eprintln!("chaos seed {seed}: INFO rlock {}", counters.join(" "));
    }
    // Stop the traffic; hang up every traffic connection (parkers may wait for ever).
    sh.stop.store(true, Ordering::Relaxed);
    sleep(Duration::from_millis(400));
    let alive = master.is_running() && replica.is_running();
    if alive {
        let _: redis::RedisResult<Value> = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("normal")
            .arg("SKIPME")
            .arg("yes")
            .query(&mut m);
    }
    for t in threads {
        if t.join().is_err() {
            sh.finding("a driver thread panicked".into());
        }
    }
    let mut m = master.client();
    let mut rep = replica.client();
    if alive {
        // No client is left: nobody waits, no binding is left.
        let settled = (0..if valgrind() { 4000 } else { 400 }).any(|_| {
            sleep(Duration::from_millis(10));
            stat(&mut m, "waiters") == 0 && stat(&mut m, "keepalive_holds") == 0
        });
        if !settled {
            sh.finding(format!(
                "with every client gone: waiters {} keepalive_holds {} (expected 0)",
                stat(&mut m, "waiters"),
                stat(&mut m, "keepalive_holds")
            ));
        }
        pause_writes(&mut m, 30_000);
        compare(&sh, &mut m, &mut rep, "right after the run");
        unpause(&mut m);
        // Let the short leases run out first: holds past their deadline are
        // dropped at load (and Redis drops keys past their TTL as DEBUG
        // RELOAD loads them, without telling the replica).
        let mut stable = false;
        for _ in 0..40 {
            let least = shortest_time_left(&mut m);
            if least < 8000 {
                sleep(Duration::from_millis((least.max(0) as u64 + 100).min(3000)));
                continue;
            }
            reclaim_ended_locks(&mut m);
            let d1 = digest(&mut m);
            sleep(Duration::from_millis(300));
            if d1 == digest(&mut m) {
                stable = true;
                break;
            }
        }
        if !stable {
            sh.finding("the dataset did not settle after the run".into());
        }
        // The final state, replica against master; DEBUG RELOAD keeps it.
        pause_writes(&mut m, 30_000);
        compare(&sh, &mut m, &mut rep, "after the run");
        let before = digest(&mut m);
        let _: () = redis::cmd("DEBUG").arg("RELOAD").query(&mut m).unwrap();
        let after = digest(&mut m);
        if before != after {
            sh.finding(format!(
                "DEBUG RELOAD (writes paused) changed the digest {before} -> {after}"
            ));
        }
        compare(&sh, &mut m, &mut rep, "after DEBUG RELOAD");
        unpause(&mut m);
        // Restart from the AOF (after a rewrite and one more change).

        let _: Value = redis::cmd("BGREWRITEAOF").query(&mut m).unwrap();
        wait_until(Duration::from_secs(20), || {
            info_field(&mut m, "persistence", "aof_rewrite_in_progress").as_deref() == Some("0")
                && info_field(&mut m, "persistence", "aof_rewrite_scheduled").as_deref()
                    == Some("0")
        });
        // One more change after the rewrite, to the incremental AOF.
        let _ = call(
            &mut m,
            &["RLOCK.ACQUIRE", "after-rewrite", "z", "PX", "60000"],
        );
        let (before, keys_before, space_before) = settled_snapshot(&mut m);
        let holds_end = holds_end(&mut m, &keys_before);
        master.restart();
        let mut m2 = master.client();
        let (after, keys_after, space_after) = settled_snapshot(&mut m2);
        // A lock whose holds all ended before the restart had read it back
        // is dropped at load: a lease with just over the settling margin
        // left can run out meanwhile (a lock whose TTL was taken off by
        // PERSIST even stays in the live keyspace after that, see README).
        let read_back = unix_ms();
        let differ: Vec<&String> = keys_before
            .keys()
            .chain(keys_after.keys())
            .filter(|k| keys_before.get(*k) != keys_after.get(*k))
            .collect();
        let diff: Vec<String> = differ
            .iter()
            .filter(|k| {
                let ended = holds_end.get(**k).is_some_and(|&end| end < read_back);
                let dropped_at_load = ended && !keys_after.contains_key(**k);
                !dropped_at_load
            })
            .map(|k| format!("{k}: {:?} -> {:?}", keys_before.get(*k), keys_after.get(*k)))
            .collect();
        if before != after && (differ.is_empty() || !diff.is_empty()) {
            sh.finding(format!(
                "restart from the AOF changed the digest {before} -> {after}; keyspace [{space_before}] -> [{space_after}]; live keys that differ:\n  {}",
                diff.join("\n  ")
            ));
        }
        // The replica resyncs with the restarted master.
        compare(&sh, &mut m2, &mut rep, "after the master's restart");

        // Everything released: the counters are back at zero, the replica follows.
        force_release_all(&mut m2);
        let left = lock_keys(&mut m2);
        if !left.is_empty() {
            sh.finding(format!(
                "lock keys left after FORCERELEASE of all: {left:?}"
            ));
        }
        for (name, want) in [
            ("locks", 0),
            ("waiters", 0),
            ("lease_schedule", 0),
            ("keepalive_holds", 0),
        ] {
            let got = stat(&mut m2, name);
            if got != want {
                sh.finding(format!(
                    "INFO rlock {name} is {got} after releasing everything"
                ));
            }
        }
        compare(&sh, &mut m2, &mut rep, "after releasing everything");
        let left = lock_keys(&mut rep);
        if !left.is_empty() {
            sh.finding(format!("lock keys left on the replica: {left:?}"));
        }
    }
    for (name, s) in [("master", &mut master), ("replica", &mut replica)] {
        if !s.is_running() {
            sh.finding(format!("the {name} is not running"));
        }
        let bad = bad_log_lines(&s.log());
        if !bad.is_empty() {
            sh.finding(format!("the {name}'s log:\n  {}", bad.join("\n  ")));
        }
    }
    let kinds = sh.kinds.lock().unwrap().clone();
    eprintln!(
        "chaos seed {seed}: {} commands, {snapshots} snapshots ({matched} matched); error replies seen: {kinds:?}",
        sh.ops.load(Ordering::Relaxed)
    );
    let findings = sh.findings.lock().unwrap().clone();
    if !findings.is_empty() {
        let tail: String = master
            .log()
            .lines()
            .rev()
            .take(30)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        panic!(
            "chaos seed {seed} (RLOCK_CHAOS_SEED={seed} to replay) on {}: {} finding(s):\n{}\n--- master log tail:\n{tail}",
            server_binary(),
            findings.len(),
            findings.join("\n")
        );
    }
}

fn secs() -> Duration {
    if valgrind() {
        duration().min(Duration::from_secs(60))
    } else {
        duration()
    }
}

/// The whole mix with a replica attached (no DEBUG RELOAD on the master
/// until the end: see `admin`).
#[test]
fn chaos_with_a_replica() {
    chaos_run(seed(), secs(), true);
}

/// The same mix without a replica, and DEBUG RELOAD on the master (parked
/// waiters and KEEPALIVE holdings across reloads) as often as the rest.
#[test]
fn chaos_with_reloads_of_the_master() {
    chaos_run(seed() ^ 1, secs() / 2, false);
}
