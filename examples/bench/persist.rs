//! (g) Persistence at scale: N leased locks against N `SET ... PX` keys on
//! one server each: `SAVE` (RDB size, time), AOF rewrite (size, time),
//! `DEBUG RELOAD` (until the module holds every lock again), `REPLICAOF NO ONE`
//! on a replica holding them all (how long the promoted server stalls), and
//! `FLUSHALL` with waiters parked on some of the locks. Then the load times
//! (`DEBUG RELOAD`, `DEBUG LOADAOF`), each side on a fresh server per round,
//! the sides taking turns.

use std::path::Path;
use std::time::{Duration, Instant};

use crate::locks::Lock;
use crate::readers::{collect_replies, park_clients};
use crate::scale::{load_locks, native_waiting, wait_until, LONG_LEASE_MS};
use crate::server::{Pinger, Server, Stall};
use crate::uncontended::median;
use crate::{cmd, Env};

pub struct Persist {
    pub lock: Lock,
    pub n: usize,
    pub rdb_bytes: u64,
    /// Medians of the rounds, and the rounds.
    pub save_ms: f64,
    pub save_rounds: Vec<f64>,
    pub aof_bytes: u64,
    pub rewrite_ms: f64,
    pub rewrite_rounds: Vec<f64>,
    /// After `DEBUG RELOAD` replied: until `rlock_locks` is back to N
    /// (native; the SET keys need nothing), and the worst PING meanwhile.
    pub rebuild_ms: f64,
    pub rebuild_stall: Stall,
    /// `REPLICAOF NO ONE` on the replica: its round trip, the time until the
    /// promoted server holds all N locks, and the worst PING on it from
    /// the command until then (+100 ms).
    pub promote_ms: f64,
    pub promote_rebuild_ms: f64,
    pub promote_stall: Stall,
    /// Worst PING on the replica in the 300 ms before the command (noise).
    pub promote_quiet: Stall,
    pub flush_ms: f64,
    pub flush_rounds: Vec<f64>,
    /// Waiters parked on lock keys during the `FLUSHALL`s (all rounds), and
    /// how many were told TRYAGAIN; the worst PING from `FLUSHALL` until the
    /// last was told: the median round's, and each round's.
    pub flush_waiters: usize,
    pub flush_told_retry: usize,
    pub flush_stall: Stall,
    pub flush_stall_rounds: Vec<f64>,
}

/// One round of one side's load times, on a fresh server.
pub struct Loads {
    pub lock: Lock,
    pub n: usize,
    /// From 1.
    pub round: usize,
    /// `DEBUG RELOAD` (save, flush, load) of N keys just made.
    pub reload_ms: f64,
    /// The load alone: `DEBUG RELOAD NOSAVE` of the file that reload saved,
    /// after a `FLUSHALL` (what issue 13 calls loading).
    pub rdb_load_ms: f64,
    /// `DEBUG LOADAOF` of the AOF rewritten from N keys made anew after a
    /// `FLUSHALL` (plain commands, no RDB preamble): flush, then replay of
    /// every command.
    pub aof_load_ms: f64,
}

/// Rounds of `SAVE`, of the AOF rewrite and of `FLUSHALL` (on the same
/// servers: the first two leave the keyspace as it was, the flushed keys are
/// reloaded), and of the load times (`loads`, a fresh server each); the
/// median is reported. One round of a second-long operation varies by
/// a third from run to run on a shared machine (seen: `SAVE` of the same `SET
/// PX` keys 681 ms in one full run, 953 ms in the one before).
pub const ROUNDS: usize = 3;

fn debug_reload(c: &mut crate::resp::Conn) -> f64 {
    let t = Instant::now();
    ok(
        cmd!(c; "DEBUG", "RELOAD").expect("DEBUG RELOAD"),
        "DEBUG RELOAD",
    );
    ms_since(t)
}

fn ms_since(t: Instant) -> f64 {
    t.elapsed().as_secs_f64() * 1000.0
}

fn ok(v: crate::resp::Value, what: &str) {
    assert!(!v.is_error(), "{what}: {v:?}");
}

fn config_set(c: &mut crate::resp::Conn, name: &str, value: &str) {
    let v = cmd!(c; "CONFIG", "SET", name, value).expect("CONFIG SET");
    ok(v, &format!("CONFIG SET {name} {value}"));
}

/// Sum of the sizes of the files in `dir` whose names contain `part`.
fn files_size(dir: &Path, part: &str) -> u64 {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().contains(part))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// No AOF rewrite running or waiting to run.
fn rewrite_finished(srv: &Server) -> bool {
    let p = srv.info("persistence");
    p.get("aof_rewrite_in_progress").is_some_and(|v| v == "0")
        && p.get("aof_rewrite_scheduled").is_some_and(|v| v == "0")
}

fn assert_rewrite_ok(srv: &Server) {
    let status = srv.info("persistence");
    assert_eq!(
        status.get("aof_last_bgrewrite_status").map(String::as_str),
        Some("ok"),
        "AOF rewrite failed:\n{}",
        srv.log()
    );
}

/// A fresh server holding the N keys of `lock` (the floor also on a server
/// without the module, `PlainFloor`: Redis's own cost).
fn server_with_keys(env: &Env, lock: Lock, n: usize) -> Server {
    let module = lock.with_module().then_some(env.module.as_path());
    let srv = Server::start_with(module, None, false);
    env.scripts.load(&mut srv.conn());
    load_locks(env, &srv, lock, "lock:", (n, 4, 1000), |_| LONG_LEASE_MS);
    assert_eq!(held(&srv, lock), leases(lock, n), "locks after the load");
    srv
}

/// The locks the module holds when `lock`'s N keys are loaded.
fn leases(lock: Lock, n: usize) -> i64 {
    if lock.imp == crate::locks::Impl::Native {
        n as i64
    } else {
        0
    }
}

/// Lock values the module on `srv` holds and serves (0 on a server without
/// it). Since issue 13 there is no schedule to rebuild after a load or a
/// promotion (a single-holder lock ends through its key's TTL), so the module
/// is ready as soon as its locks are loaded: this is what "rebuilt" waits for.
fn held(srv: &Server, lock: Lock) -> i64 {
    if lock.with_module() {
        srv.info_i64("rlock", "rlock_locks")
    } else {
        0
    }
}

/// Until `f` holds, polled every millisecond (for timing, unlike `wait_until`).
fn time_until(what: &str, mut f: impl FnMut() -> bool) -> Instant {
    let end = Instant::now() + Duration::from_secs(300);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(1));
    }
    Instant::now()
}

/// Section (g) but the load times, for every side in `locks`: all their
/// servers are alive together, so that each timed operation (`SAVE`, the AOF
/// rewrite, `FLUSHALL`) runs in rounds in which the sides take turns, and the
/// machine's drift over the minutes of a run falls on all of them. Measured
/// one side after the other, `SAVE` of the same `SET PX` keys took 2,061 ms
/// on one server and 1,705 ms on the next (1.21x for identical work), which
/// swung the ratios across their targets.
/// `waiters`: clients parked on as many lock keys before each `FLUSHALL`
/// (native only).
pub fn run(env: &Env, locks: &[Lock], n: usize, waiters: usize) -> Vec<Persist> {
    let servers: Vec<Server> = locks
        .iter()
        .map(|&lock| server_with_keys(env, lock, n))
        .collect();

    let save = in_turns(&servers, |srv| {
        let mut c = srv.conn();
        let t = Instant::now();
        ok(cmd!(c; "SAVE").expect("SAVE"), "SAVE");
        ms_since(t)
    });
    let rdb_bytes: Vec<u64> = servers
        .iter()
        .map(|srv| files_size(srv.dir(), "dump.rdb"))
        .collect();

    // AOF rewrite as plain commands (no RDB preamble, which would make it the
    // RDB again); serverCron notices the finished child, so hz 100 for 10 ms
    // granularity during the rewrite.
    for srv in &servers {
        let mut c = srv.conn();
        config_set(&mut c, "aof-use-rdb-preamble", "no");
        config_set(&mut c, "hz", "100");
    }
    let rewrite = in_turns(&servers, rewrite_once);
    let aof_bytes: Vec<u64> = servers
        .iter()
        .map(|srv| files_size(&srv.dir().join("appendonlydir"), ".base.aof"))
        .collect();
    for srv in &servers {
        config_set(&mut srv.conn(), "hz", "10");
    }

    // Stalls, not times compared side by side: one side after the other.
    let after: Vec<(Reload, Promotion)> = locks
        .iter()
        .zip(&servers)
        .map(|(&lock, srv)| (reload(srv, lock, n), promote(env, srv, lock, n)))
        .collect();

    // Each round's flush empties the server; the next round's keys come back
    // from the `dump.rdb` the reload above saved (`DEBUG RELOAD NOSAVE`), so
    // every round flushes values laid out by a load, as the first did.
    let flush = in_turns_with(&servers, |srv, side, round| {
        if round > 0 {
            reload_nosave(srv, locks[side], n);
        }
        flush_once(env, srv, locks[side], n, waiters)
    });

    locks
        .iter()
        .enumerate()
        .map(|(i, &lock)| {
            let (reload, promotion) = after[i];
            let flushes = &flush[i];
            let flush_ms: Vec<f64> = flushes.iter().map(|f| f.ms).collect();
            // The round whose worst PING is the median one.
            let mut by_stall: Vec<&Flush> = flushes.iter().collect();
            by_stall.sort_by(|a, b| a.stall.worst_ms.total_cmp(&b.stall.worst_ms));
            Persist {
                lock,
                n,
                rdb_bytes: rdb_bytes[i],
                save_ms: median(&save[i]),
                save_rounds: save[i].clone(),
                aof_bytes: aof_bytes[i],
                rewrite_ms: median(&rewrite[i]),
                rewrite_rounds: rewrite[i].clone(),
                rebuild_ms: reload.ms,
                rebuild_stall: reload.stall,
                promote_ms: promotion.ms,
                promote_rebuild_ms: promotion.rebuild_ms,
                promote_stall: promotion.stall,
                promote_quiet: promotion.quiet,
                flush_ms: median(&flush_ms),
                flush_rounds: flush_ms,
                flush_waiters: flushes.iter().map(|f| f.waiters).sum(),
                flush_told_retry: flushes.iter().map(|f| f.told_retry).sum(),
                flush_stall: by_stall[by_stall.len() / 2].stall,
                flush_stall_rounds: flushes.iter().map(|f| f.stall.worst_ms).collect(),
            }
        })
        .collect()
}

/// `ROUNDS` of `f` on every server, the servers taking turns within each
/// round: per server, its rounds' results.
fn in_turns<R>(servers: &[Server], mut f: impl FnMut(&Server) -> R) -> Vec<Vec<R>> {
    in_turns_with(servers, |srv, _, _| f(srv))
}

/// As `in_turns`, `f` also told the server's index and the round (from 0).
fn in_turns_with<R>(
    servers: &[Server],
    mut f: impl FnMut(&Server, usize, usize) -> R,
) -> Vec<Vec<R>> {
    let mut out: Vec<Vec<R>> = servers.iter().map(|_| Vec::new()).collect();
    for round in 0..ROUNDS {
        for (side, srv) in servers.iter().enumerate() {
            out[side].push(f(srv, side, round));
        }
    }
    out
}

/// One AOF rewrite, from `CONFIG SET appendonly yes` until Redis shows it
/// finished; AOF off again after it.
fn rewrite_once(srv: &Server) -> f64 {
    let mut c = srv.conn();
    let t = Instant::now();
    config_set(&mut c, "appendonly", "yes");
    let done = time_until("the AOF rewrite", || rewrite_finished(srv));
    assert_rewrite_ok(srv);
    config_set(&mut c, "appendonly", "no");
    done.duration_since(t).as_secs_f64() * 1000.0
}

#[derive(Clone, Copy)]
struct Reload {
    ms: f64,
    stall: Stall,
}

/// `DEBUG RELOAD` (timed in `loads`); here, until the module holds every
/// lock again, and the worst PING meanwhile.
fn reload(srv: &Server, lock: Lock, n: usize) -> Reload {
    debug_reload(&mut srv.conn());
    let pinger = Pinger::start(srv.port);
    let t = Instant::now();
    let rebuilt = time_until("the schedule after DEBUG RELOAD", || {
        held(srv, lock) == leases(lock, n)
    });
    std::thread::sleep(Duration::from_millis(100));
    let stall = pinger
        .stop()
        .window(t, rebuilt + Duration::from_millis(100));
    Reload {
        ms: rebuilt.duration_since(t).as_secs_f64() * 1000.0,
        stall,
    }
}

#[derive(Clone, Copy)]
struct Promotion {
    ms: f64,
    rebuild_ms: f64,
    stall: Stall,
    quiet: Stall,
}

/// A replica of `srv` (with the module if `srv` has it), synced, then
/// `REPLICAOF NO ONE` on it with a PING loop on the replica.
fn promote(env: &Env, srv: &Server, lock: Lock, n: usize) -> Promotion {
    let module = lock.with_module().then_some(env.module.as_path());
    let replica = srv.start_replica(module);
    let leases = leases(lock, n);
    assert_eq!(held(&replica, lock), leases, "the replica holds every lock");
    let pinger = Pinger::start(replica.port);
    std::thread::sleep(Duration::from_millis(400));
    let mut rc = replica.conn();
    let t = Instant::now();
    ok(
        cmd!(rc; "REPLICAOF", "NO", "ONE").expect("REPLICAOF"),
        "REPLICAOF NO ONE",
    );
    let ms = ms_since(t);
    let rebuilt = time_until("the schedule after promotion", || {
        held(&replica, lock) == leases
    });
    std::thread::sleep(Duration::from_millis(100));
    let log = pinger.stop();
    Promotion {
        ms,
        rebuild_ms: rebuilt.duration_since(t).as_secs_f64() * 1000.0,
        stall: log.window(t, rebuilt + Duration::from_millis(100)),
        quiet: log.within(t - Duration::from_millis(300), t),
    }
}

/// The N keys back from the server's `dump.rdb`, after a flush: the time
/// of the load command.
fn reload_nosave(srv: &Server, lock: Lock, n: usize) -> f64 {
    let mut c = srv.conn();
    let t = Instant::now();
    ok(
        cmd!(c; "DEBUG", "RELOAD", "NOSAVE").expect("DEBUG RELOAD NOSAVE"),
        "DEBUG RELOAD NOSAVE",
    );
    let load_ms = ms_since(t);
    let keys = cmd!(c; "DBSIZE").expect("DBSIZE");
    assert_eq!(keys.int(), Some(n as i64), "keys after DEBUG RELOAD NOSAVE");
    assert_eq!(held(srv, lock), leases(lock, n), "locks after the reload");
    load_ms
}

struct Flush {
    ms: f64,
    waiters: usize,
    told_retry: usize,
    stall: Stall,
}

/// `FLUSHALL SYNC` with `waiters` clients parked on as many lock keys (they
/// are told TRYAGAIN): its round trip, and the worst PING until the last
/// waiter's reply was read.
fn flush_once(env: &Env, srv: &Server, lock: Lock, n: usize, waiters: usize) -> Flush {
    let waiters = if leases(lock, n) > 0 {
        waiters.min(n)
    } else {
        0
    };
    let mut parked = park_clients(srv.port, waiters, |w, i| {
        lock.queue_acquire(
            w,
            &env.scripts,
            &format!("lock:{i:08}"),
            &crate::locks::owner(400 + i as u64, 1),
            LONG_LEASE_MS,
            Some(0),
        )
    });
    if waiters > 0 {
        wait_until("the waiters", Duration::from_secs(60), || {
            native_waiting(srv) == waiters as i64
        });
    }
    let mut c = srv.conn();
    let pinger = Pinger::start(srv.port);
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    ok(cmd!(c; "FLUSHALL", "SYNC").expect("FLUSHALL"), "FLUSHALL");
    let ms = ms_since(t);
    let replies = collect_replies(&mut parked, Duration::from_secs(60));
    let told_retry = replies
        .iter()
        .flatten()
        .filter(|(_, v)| matches!(v, crate::resp::Value::Error(e) if e.starts_with("TRYAGAIN")))
        .count();
    let last = replies.iter().flatten().map(|(t, _)| *t).max();
    let end = last
        .unwrap_or(t)
        .max(t + Duration::from_secs_f64(ms / 1000.0));
    std::thread::sleep(Duration::from_millis(50));
    let stall = pinger.stop().window(t, end);
    drop(parked);
    wait_until("an empty schedule", Duration::from_secs(60), || {
        held(srv, lock) == 0
    });
    Flush {
        ms,
        waiters,
        told_retry,
        stall,
    }
}

/// One round of the load times of one side. A fresh server each round, and
/// the sides take turns round by round (main.rs): the same thing measured
/// on one server several times in a row varies little, while the baseline's
/// `DEBUG RELOAD` took 1,583 ms in one run and 1,847 ms in the next, so one
/// server per side once made the ratio swing across the target (1.34x, then
/// 1.14x). Each load is the first after its keys were made: a reload
/// reallocates every value, so a second one in a row walks a warmer memory
/// layout (1,212 vs 708 ms where the first took 2,506 vs 1,811 ms).
pub fn loads(env: &Env, lock: Lock, n: usize, round: usize) -> Loads {
    let srv = server_with_keys(env, lock, n);
    let mut c = srv.conn();
    let reload_ms = debug_reload(&mut c);
    assert_eq!(
        held(&srv, lock),
        leases(lock, n),
        "locks after DEBUG RELOAD"
    );
    ok(cmd!(c; "FLUSHALL", "SYNC").expect("FLUSHALL"), "FLUSHALL");
    let rdb_load_ms = reload_nosave(&srv, lock, n);
    ok(cmd!(c; "FLUSHALL", "SYNC").expect("FLUSHALL"), "FLUSHALL");
    config_set(&mut c, "aof-use-rdb-preamble", "no");
    let aof_load_ms = aof_load(env, &srv, lock, n);
    assert_eq!(
        held(&srv, lock),
        leases(lock, n),
        "locks after DEBUG LOADAOF"
    );
    Loads {
        lock,
        n,
        round,
        reload_ms,
        rdb_load_ms,
        aof_load_ms,
    }
}

/// Makes the N keys anew (the first load after they were made, as for
/// `DEBUG RELOAD`), rewrites them into an AOF of plain commands, and times
/// `DEBUG LOADAOF`: a flush, then every command of the file through the
/// command table (`RLOCK.DELTA` for a lock, `SET` for a key; `PEXPIREAT`
/// after each). AOF stays on during the load, which reads the files the
/// rewrite listed.
fn aof_load(env: &Env, srv: &Server, lock: Lock, n: usize) -> f64 {
    load_locks(env, srv, lock, "lock:", (n, 4, 1000), |_| LONG_LEASE_MS);
    let mut c = srv.conn();
    config_set(&mut c, "appendonly", "yes");
    wait_until("the AOF rewrite", Duration::from_secs(300), || {
        rewrite_finished(srv)
    });
    assert_rewrite_ok(srv);
    let t = Instant::now();
    ok(
        cmd!(c; "DEBUG", "LOADAOF").expect("DEBUG LOADAOF"),
        "DEBUG LOADAOF",
    );
    let load_ms = ms_since(t);
    let keys = cmd!(c; "DBSIZE").expect("DBSIZE");
    assert_eq!(keys.int(), Some(n as i64), "keys after DEBUG LOADAOF");
    config_set(&mut c, "appendonly", "no");
    load_ms
}
