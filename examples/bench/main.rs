//! `make bench`: the native locks against the Lua baselines, in one run.
//!
//! Starts its own redis-server processes (free loopback port, temp dir, the
//! module loaded, no persistence; a fresh one per measurement so that no run
//! inherits another's keys, timers or fragmentation), measures
//!
//! - (a) uncontended cost: server µs per call and pipelined throughput of
//!   acquire and release, native vs `SET NX PX` (the floor) vs Redisson's Lua;
//! - (b) contention: K clients on one key, native BLOCK vs Redisson's
//!   subscribe-and-retry protocol;
//! - (c) expiry handoff: lease deadline -> waiter's grant;
//! - (d) scale: memory per lock, idle CPU with many leased locks, release
//!   cost with many waiters;
//! - (e) many holders: RWLOCK READ ops with up to 100,000 readers in (with and
//!   without a replica, replicated bytes per change), and one release that
//!   admits thousands of queued readers;
//! - (f) expiry storm: 500,000 leases ending in the same millisecond;
//! - (g) persistence at scale: RDB, AOF rewrite, DEBUG RELOAD, promotion and
//!   FLUSHALL with 1,000,000 locks against as many `SET PX` keys, and the load
//!   times (DEBUG RELOAD, DEBUG LOADAOF) on fresh servers, the sides taking turns;
//! - (m) multi-key locks, (k) KEEPALIVE at scale;
//! - (s) semaphores: K = 64 clients on LIMIT 8 against Redisson's semaphore
//!   protocol, and the ops with 100,000 holdings in (the uncontended rows of
//!   SEMAPHORE and Redisson's PermitExpirableSemaphore are in (a));
//! - (w) the memory of a parked waiter against a `BLPOP` client, on every
//!   server `make deps` provides;
//!
//! and writes BENCHMARKS.md (machine, versions, tables, ratios, targets).
//!
//! `BENCH_QUICK=1` shrinks every size for a smoke run. `BENCH_ONLY=a,b,c,d,e,f,g`
//! runs a subset (`a1`: time per call, all setups; `a2`: throughput; `a3` or
//! `replica`: time per call with a replica only; `d1`: memory and idle CPU,
//! `d2`: release with waiters; `e1` or `readers`: ops with N readers in; `e2`
//! or `admit`: a release admitting N readers; `f` or `storm`; `g` or
//! `persist`; `m` or `multilock`; `k` or `keepalive`; `s` or `semaphore`;
//! `w` or `waiters`).
//! `BENCH_OUT` overrides the output file.

mod contention;
mod expiry;
mod keepalive;
mod locks;
mod multilock;
mod persist;
mod readers;
mod report;
mod resp;
mod scale;
mod server;
mod storm;
mod uncontended;
mod waiters;

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use locks::{Family, Impl, Lock, Scripts};

pub struct Cfg {
    pub quick: bool,
    pub cost_calls: usize,
    pub cost_rounds: usize,
    pub tput_secs: f64,
    pub tput_clients: usize,
    pub tput_max_keys_per_client: usize,
    pub pipeline: usize,
    pub contention_secs: f64,
    pub ks: Vec<usize>,
    pub expiry_trials: usize,
    pub scale_locks: usize,
    pub idle_secs: f64,
    pub waiters: usize,
    pub native_releases: usize,
    pub lua_releases: usize,
    /// (e) readers already holding the key; ops measured per size.
    pub readers: Vec<usize>,
    pub reader_ops: usize,
    /// (e) readers queued behind a writer, admitted by one release.
    pub admit: Vec<usize>,
    /// (f) leases sharing one deadline, and the keys among them with a waiter.
    pub storm_leases: usize,
    pub storm_waiters: usize,
    /// (g) locks (and SET PX keys) saved, rewritten, reloaded, flushed.
    pub persist_locks: usize,
    /// (m) client counts of the multi-key lock runs.
    pub multilock_ks: Vec<usize>,
    /// (k) KEEPALIVE holdings, their lease, and the measured window: a whole
    /// number of renewal periods (lease / 3), as renewals come in bursts.
    pub keepalive_holdings: usize,
    pub keepalive_lease_ms: u64,
    pub keepalive_secs: f64,
    /// (w) clients parked at once, per server, to weigh one parked waiter.
    pub parked_waiters: usize,
}

impl Cfg {
    fn new(quick: bool) -> Cfg {
        if quick {
            Cfg {
                quick,
                cost_calls: 20_000,
                cost_rounds: 1,
                tput_secs: 1.0,
                tput_clients: 8,
                tput_max_keys_per_client: 200_000,
                pipeline: 64,
                contention_secs: 1.5,
                ks: vec![1, 8, 64],
                expiry_trials: 20,
                scale_locks: 100_000,
                idle_secs: 3.0,
                waiters: 1_000,
                native_releases: 200,
                lua_releases: 50,
                readers: vec![1, 1_000, 10_000],
                reader_ops: 300,
                admit: vec![200, 1_000, 2_000],
                storm_leases: 100_000,
                storm_waiters: 200,
                persist_locks: 100_000,
                multilock_ks: vec![4, 16],
                keepalive_holdings: 20_000,
                keepalive_lease_ms: 6_000,
                keepalive_secs: 6.0,
                parked_waiters: 1_000,
            }
        } else {
            Cfg {
                quick,
                cost_calls: 30_000,
                cost_rounds: 5,
                tput_secs: 1.5,
                tput_clients: 8,
                tput_max_keys_per_client: 500_000,
                pipeline: 64,
                contention_secs: 3.0,
                ks: vec![1, 8, 64],
                expiry_trials: 100,
                scale_locks: 1_000_000,
                idle_secs: 5.0,
                waiters: 10_000,
                native_releases: 1_000,
                lua_releases: 100,
                readers: vec![1, 1_000, 10_000, 100_000],
                reader_ops: 1_000,
                admit: vec![1_000, 5_000, 10_000],
                storm_leases: 500_000,
                storm_waiters: 1_000,
                persist_locks: 1_000_000,
                multilock_ks: vec![4, 16],
                keepalive_holdings: 100_000,
                keepalive_lease_ms: 30_000,
                keepalive_secs: 30.0,
                parked_waiters: 5_000,
            }
        }
    }
}

pub struct Env {
    pub module: PathBuf,
    pub scripts: Arc<Scripts>,
    pub cfg: Cfg,
}

/// A barrier whose waits time out (a stuck or dead thread fails the run
/// instead of hanging it).
pub struct Gate {
    n: usize,
    state: Mutex<(usize, u64)>,
    cv: Condvar,
}

impl Gate {
    pub fn new(n: usize) -> Gate {
        Gate {
            n,
            state: Mutex::new((0, 0)),
            cv: Condvar::new(),
        }
    }

    pub fn wait(&self) {
        let mut st = self.state.lock().expect("gate");
        let generation = st.1;
        st.0 += 1;
        if st.0 == self.n {
            st.0 = 0;
            st.1 += 1;
            self.cv.notify_all();
            return;
        }
        let (st, timeout) = self
            .cv
            .wait_timeout_while(st, Duration::from_secs(300), |s| s.1 == generation)
            .expect("gate");
        assert!(
            !timeout.timed_out() || st.1 != generation,
            "benchmark threads did not meet within 300 s"
        );
    }
}

static STARTED: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

pub fn progress(msg: &str) {
    let t = STARTED.get_or_init(Instant::now).elapsed().as_secs_f64();
    eprintln!("[bench {t:6.1}s] {msg}");
}

/// Every measurement here may need thousands of sockets: lift the soft limit
/// on open files to the hard one (redis-server inherits it).
fn raise_fd_limit() -> u64 {
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
        lim.rlim_cur
    }
}

pub const NATIVE: [Lock; 5] = [
    Lock::new(Impl::Native, Family::Reentrant),
    Lock::new(Impl::Native, Family::Fair),
    Lock::new(Impl::Native, Family::Write),
    Lock::new(Impl::Native, Family::Read),
    Lock::new(Impl::Native, Family::Semaphore),
];
pub const LUA: [Lock; 5] = [
    Lock::new(Impl::Lua, Family::Reentrant),
    Lock::new(Impl::Lua, Family::Fair),
    Lock::new(Impl::Lua, Family::Write),
    Lock::new(Impl::Lua, Family::Read),
    Lock::new(Impl::Lua, Family::Semaphore),
];
pub const FLOOR: Lock = Lock::new(Impl::Floor, Family::Reentrant);
pub const PLAIN_FLOOR: Lock = Lock::new(Impl::PlainFloor, Family::Reentrant);

#[derive(Default)]
pub struct Results {
    pub costs: Vec<uncontended::CallCost>,
    pub throughput: Vec<uncontended::Throughput>,
    pub contention: Vec<contention::ContentionResult>,
    pub expiry: Vec<expiry::Handoff>,
    pub memory: Vec<scale::Memory>,
    pub idle_empty: Option<scale::Idle>,
    pub waiters: Vec<scale::Waiters>,
    pub readers: Vec<readers::ReadersScale>,
    pub admit: Vec<readers::Admit>,
    pub admit_wanted: Vec<usize>,
    pub storms: Vec<storm::Storm>,
    pub persist: Vec<persist::Persist>,
    pub loads: Vec<persist::Loads>,
    pub multilock: Vec<multilock::MultiResult>,
    pub keepalive: Vec<keepalive::KeepAlive>,
    pub waiter_memory: Vec<waiters::WaiterMemory>,
    /// (s) a semaphore with N holdings: the (e) ops, with and without a replica.
    pub semaphore_holders: Vec<readers::ReadersScale>,
    pub runtime_s: f64,
    pub sections: SectionTimes,
    pub load_before: String,
    pub load_after: String,
    pub fd_limit: u64,
    pub waiters_wanted: usize,
}

/// Wall time of each section of the run, for the run-time row.
#[derive(Default)]
pub struct SectionTimes {
    pub done: Vec<(&'static str, f64)>,
    current: Option<(&'static str, Instant)>,
}

impl SectionTimes {
    /// Ends the section running, if any, and starts `name`.
    fn enter(&mut self, name: &'static str) {
        self.close();
        self.current = Some((name, Instant::now()));
    }

    fn close(&mut self) {
        if let Some((name, at)) = self.current.take() {
            self.done.push((name, at.elapsed().as_secs_f64()));
        }
    }
}

fn main() {
    let started = *STARTED.get_or_init(Instant::now);
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| !v.is_empty() && v != "0");
    let only: Option<Vec<String>> = std::env::var("BENCH_ONLY").ok().map(|v| {
        v.split(',')
            .map(|s| s.trim().to_lowercase())
            .filter(|s| !s.is_empty())
            .collect()
    });
    let run = |section: &str| only.as_ref().is_none_or(|o| o.iter().any(|s| s == section));
    let run_any = |names: &[&str]| names.iter().any(|n| run(n));
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let module = std::env::var_os("RLOCK_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target/release/librlock.so"));
    if !module.exists() {
        eprintln!(
            "{} is missing: build the module first (`make build`, or `make bench` which does)",
            module.display()
        );
        std::process::exit(2);
    }
    let out = std::env::var_os("BENCH_OUT")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("BENCHMARKS.md"));
    let env = Env {
        module,
        scripts: Arc::new(Scripts::read(&root.join("bench/lua"))),
        cfg: Cfg::new(quick),
    };
    let mut r = Results {
        fd_limit: raise_fd_limit(),
        load_before: report::loadavg(),
        ..Default::default()
    };
    progress(&format!(
        "mode: {}; open-files limit {}",
        if quick { "quick (BENCH_QUICK)" } else { "full" },
        r.fd_limit
    ));

    let mut locks = vec![FLOOR, PLAIN_FLOOR];
    for (n, l) in NATIVE.iter().zip(LUA.iter()) {
        locks.push(*n);
        locks.push(*l);
    }
    // With a replica attached: effects are built and sent down the link, as
    // in production; every uncontended row, each against the floor on the
    // same setup.
    let mut with_replica = vec![FLOOR.with_replica()];
    for (n, l) in NATIVE.iter().zip(LUA.iter()) {
        with_replica.push(n.with_replica());
        with_replica.push(l.with_replica());
    }
    if run_any(&["a", "a1"]) {
        r.sections.enter("(a) uncontended: server time per call");
        progress("(a) uncontended: server time per call");
        // Also with AOF on: effects are then built and written out.
        let mut all = locks.clone();
        all.extend([FLOOR.with_aof(), NATIVE[0].with_aof(), LUA[0].with_aof()]);
        all.extend(with_replica.iter().copied());
        r.costs = uncontended::call_costs(&env, &all);
    } else if run_any(&["a3", "replica"]) {
        r.sections.enter("(a) uncontended: server time per call");
        progress("(a) uncontended: server time per call, with a replica");
        r.costs = uncontended::call_costs(&env, &with_replica);
    }
    if run("a") || run("a2") {
        r.sections.enter("(a) uncontended: pipelined throughput");
        progress("(a) uncontended: pipelined throughput");
        for lock in &locks {
            let t = uncontended::throughput(&env, *lock);
            progress(&format!(
                "  {:<44} acquire {:>9.0}/s  release {:>9.0}/s",
                lock.label(),
                t.acquire_per_s,
                t.release_per_s
            ));
            r.throughput.push(t);
        }
    }

    if run("b") {
        r.sections.enter("(b) contention");
        progress("(b) contention");
        let pairs = [
            Lock::new(Impl::Native, Family::Reentrant),
            Lock::new(Impl::Lua, Family::Reentrant),
            Lock::new(Impl::Native, Family::Fair),
            Lock::new(Impl::Lua, Family::Fair),
        ];
        for &k in &env.cfg.ks {
            for lock in pairs {
                let c = contention::run(&env, lock, k);
                progress(&format!(
                    "  K={k:<3} {:<28} {:>8.0} acq/s  p50 {:>7.0} us  p99 {:>8.0} us  {:.2} cmds/acq  {:.2} wake-ups/release",
                    lock.label(),
                    c.rate(),
                    c.percentile_us(50.0),
                    c.percentile_us(99.0),
                    c.commands_per_acquisition(),
                    c.wakeups_per_release()
                ));
                r.contention.push(c);
            }
        }
    }

    if run("c") {
        r.sections.enter("(c) expiry hand-over");
        progress("(c) expiry handoff");
        for lock in [
            Lock::new(Impl::Native, Family::Reentrant),
            Lock::new(Impl::Lua, Family::Reentrant),
        ] {
            let h = expiry::run(&env, lock);
            progress(&format!(
                "  {:<28} p50 {:.2} ms  p99 {:.2} ms  max {:.2} ms",
                lock.label(),
                h.percentile_ms(50.0),
                h.percentile_ms(99.0),
                h.max_ms()
            ));
            r.expiry.push(h);
        }
    }

    if run("d") || run("d1") {
        r.sections.enter("(d) scale: held locks");
        let n = env.cfg.scale_locks;
        progress(&format!("(d) scale: {n} held locks"));
        for (lock, idle) in [
            (Lock::new(Impl::Native, Family::Reentrant), true),
            (Lock::new(Impl::Lua, Family::Reentrant), true),
            (FLOOR, false),
        ] {
            let m = scale::memory(&env, lock, n, idle);
            progress(&format!(
                "  {:<44} {:.0} B/lock{}",
                lock.label(),
                m.bytes_per_lock,
                m.idle
                    .as_ref()
                    .map(|i| format!(", idle CPU {:.2}% of a core", i.cpu_pct))
                    .unwrap_or_default()
            ));
            r.memory.push(m);
        }
        let e = scale::idle_empty(&env);
        progress(&format!(
            "  empty server: idle CPU {:.2}% of a core",
            e.cpu_pct
        ));
        r.idle_empty = Some(e);
    }

    if run("d") || run("d2") {
        r.sections.enter("(d) scale: release with waiters");
        r.waiters_wanted = env.cfg.waiters;
        let n = env
            .cfg
            .waiters
            .min((r.fd_limit as usize).saturating_sub(256))
            .max(2);
        progress(&format!("(d) scale: release with {n} waiters vs 1"));
        let native = Lock::new(Impl::Native, Family::Reentrant);
        let lua = Lock::new(Impl::Lua, Family::Reentrant);
        let m = env.cfg.native_releases.min(n);
        let lm = env.cfg.lua_releases;
        let (one, many) = scale::native_release(&env, native, n, m);
        for w in [
            one,
            many,
            scale::lua_release(&env, lua, 1, lm),
            scale::lua_release(&env, lua, n, lm),
        ] {
            progress(&format!(
                "  {:<28} {:>6} waiters: {:8.2} us/release (server), rtt p50 {:.0} us, woken {}",
                w.lock.label(),
                w.waiters,
                w.server_us,
                w.rtt_p50_us,
                w.woken
            ));
            r.waiters.push(w);
        }
    }

    if run_any(&["e", "e1", "readers"]) {
        r.sections.enter("(e) RWLOCK READ ops with N readers");
        progress("(e) RWLOCK READ ops with N readers in");
        {
            let sizes = &env.cfg.readers;
            for x in
                readers::readers_scale(&env, readers::Shared::Readers, sizes, env.cfg.reader_ops)
            {
                progress(&format!(
                    "  {:>7} readers{:<16} acquire {:8.2} us  renew {:8.2} us  release {:8.2} us{}",
                    x.readers,
                    if x.replica { ", with a replica" } else { "" },
                    x.acquire.us_per_call,
                    x.renew.us_per_call,
                    x.release.us_per_call,
                    match (
                        x.acquire.bytes_per_change,
                        x.renew.bytes_per_change,
                        x.release.bytes_per_change
                    ) {
                        (Some(a), Some(b), Some(c)) =>
                            format!("  bytes/change {a:.0} / {b:.0} / {c:.0}"),
                        _ => String::new(),
                    }
                ));
                r.readers.push(x);
            }
        }
    }

    if run_any(&["e", "e2", "admit"]) {
        r.sections.enter("(e) one release admitting N readers");
        progress("(e) one release admitting N queued readers");
        for &want in &env.cfg.admit {
            let n = want.min((r.fd_limit as usize).saturating_sub(256)).max(1);
            r.admit_wanted.push(want);
            let a = readers::admit(&env, n);
            progress(&format!(
                "  {n:>6} readers: release {:.0} us (server), all served in {:.1} ms = {:.2} us/reader, worst PING {:.1} ms",
                a.release_us,
                a.all_served_ms,
                a.us_per_reader(),
                a.stall.worst_ms
            ));
            r.admit.push(a);
        }
    }

    if run_any(&["f", "storm"]) {
        r.sections.enter("(f) expiry storm");
        let (n, w) = (env.cfg.storm_leases, env.cfg.storm_waiters);
        progress(&format!("(f) expiry storm: {n} leases, one deadline"));
        // Redis's own expiry: SET PX keys on a server without the module.
        let sides = [(storm::NATIVE, w), (PLAIN_FLOOR, 0)];
        for (round, (lock, waiters)) in (1..=storm::ROUNDS).flat_map(|r| sides.map(|s| (r, s))) {
            let x = storm::run(&env, lock, n, waiters, round);
            progress(&format!(
                "  round {round}: {:<44} worst PING {:.1} ms, p99 {:.2} ms, all ended after {} ms, waiters served {}/{}",
                lock.label(),
                x.stall.worst_ms,
                x.stall.p99_ms,
                x.all_ended_ms.map(|v| format!("{v:.0}")).unwrap_or("(not within 30 s)".into()),
                x.served,
                x.waiters
            ));
            r.storms.push(x);
        }
    }

    if run_any(&["g", "persist"]) {
        r.sections.enter("(g) persistence at scale");
        let n = env.cfg.persist_locks;
        progress(&format!(
            "(g) persistence at scale: {n} locks vs SET PX keys"
        ));
        for x in persist::run(
            &env,
            &[storm::NATIVE, FLOOR, PLAIN_FLOOR],
            n,
            env.cfg.storm_waiters,
        ) {
            progress(&format!(
                "  {:<44} RDB {:.0} B/key in {:.0} ms, AOF {:.0} B/key in {:.0} ms, REPLICAOF NO ONE {:.1} ms, stall {:.1} ms (quiet {:.1}), FLUSHALL {:.0} ms, stall {:.1} ms",
                x.lock.label(),
                x.rdb_bytes as f64 / n as f64,
                x.save_ms,
                x.aof_bytes as f64 / n as f64,
                x.rewrite_ms,
                x.promote_ms,
                x.promote_stall.worst_ms,
                x.promote_quiet.worst_ms,
                x.flush_ms,
                x.flush_stall.worst_ms
            ));
            r.persist.push(x);
        }
        // The load times: a fresh server per round and side, the sides taking turns.
        for round in 1..=persist::ROUNDS {
            for lock in [storm::NATIVE, PLAIN_FLOOR] {
                let x = persist::loads(&env, lock, n, round);
                progress(&format!(
                    "  round {round}: {:<44} DEBUG RELOAD {:.0} ms, RDB load {:.0} ms, DEBUG LOADAOF {:.0} ms",
                    lock.label(),
                    x.reload_ms,
                    x.rdb_load_ms,
                    x.aof_load_ms
                ));
                r.loads.push(x);
            }
        }
    }

    if run_any(&["m", "multilock"]) {
        r.sections.enter("(m) multi-key locks");
        progress("(m) multi-key locks: K clients, random pairs of 8 keys");
        for &k in &env.cfg.multilock_ks {
            for native in [true, false] {
                let m = multilock::run(&env, native, k);
                progress(&format!(
                    "  K={k:<3} {:<28} {:>8.0} acq/s  p50 {:>7.0} us  p99 {:>8.0} us  {:.2} cmds/acq",
                    m.label(),
                    m.rate(),
                    m.percentile_us(50.0),
                    m.percentile_us(99.0),
                    m.commands_per_acquisition()
                ));
                r.multilock.push(m);
            }
        }
    }

    if run_any(&["k", "keepalive"]) {
        r.sections.enter("(k) KEEPALIVE");
        progress(&format!(
            "(k) KEEPALIVE: {} holdings, lease {} ms, a replica attached",
            env.cfg.keepalive_holdings, env.cfg.keepalive_lease_ms
        ));
        for x in keepalive::run(&env) {
            progress(&format!(
                "  {:<34} CPU {:.2}% of a core, {:.0} renewals/s (expected {:.0}), {:.0} replication B/s",
                x.label(),
                x.cpu_pct,
                x.renewals_per_s,
                x.expected_per_s(),
                x.repl_bytes_per_s
            ));
            r.keepalive.push(x);
        }
    }

    if run_any(&["s", "semaphore"]) {
        r.sections.enter("(s) semaphores");
        progress("(s) semaphores: K = 64 clients on LIMIT 8");
        for imp in [Impl::Native, Impl::Lua] {
            let lock = Lock::new(imp, Family::Semaphore);
            let c = contention::run(&env, lock, 64);
            progress(&format!(
                "  K=64  {:<40} {:>8.0} acq/s  p50 {:>7.0} us  p99 {:>8.0} us  {:.2} cmds/acq  {:.2} wake-ups/release",
                lock.label(),
                c.rate(),
                c.percentile_us(50.0),
                c.percentile_us(99.0),
                c.commands_per_acquisition(),
                c.wakeups_per_release()
            ));
            r.contention.push(c);
        }
        progress("(s) semaphores: ops with N holdings in");
        let top = env.cfg.readers.iter().copied().max().unwrap_or(1);
        {
            let shared = readers::Shared::Permits;
            for x in readers::readers_scale(&env, shared, &[1, top], env.cfg.reader_ops) {
                progress(&format!(
                    "  {:>7} holdings{:<16} acquire {:8.2} us  renew {:8.2} us  release {:8.2} us",
                    x.readers,
                    if x.replica { ", with a replica" } else { "" },
                    x.acquire.us_per_call,
                    x.renew.us_per_call,
                    x.release.us_per_call,
                ));
                r.semaphore_holders.push(x);
            }
        }
    }

    if run_any(&["w", "waiters"]) {
        r.sections.enter("(w) memory of a parked waiter");
        progress(&format!(
            "(w) memory of a parked waiter: {} clients, per server",
            env.cfg.parked_waiters
        ));
        let mut leaving = Vec::new();
        for (label, binary) in waiters::servers() {
            for native in [true, false] {
                leaving.push(waiters::park_and_leave(&env, label, &binary, native));
            }
        }
        for x in leaving.into_iter().map(waiters::Leaving::finish) {
            progress(&format!(
                "  {:<20} {:<26} {:>8.0} B/client; left after 1 s {:>7.0}, 10 s {:>7.0}",
                x.server,
                x.label(),
                x.bytes_per_waiter,
                x.left_after_1s,
                x.left_after_10s
            ));
            r.waiter_memory.push(x);
        }
    }

    r.sections.close();
    r.runtime_s = started.elapsed().as_secs_f64();
    r.load_after = report::loadavg();
    let text = report::render(&env, &r, &root);
    std::fs::write(&out, &text).unwrap_or_else(|e| panic!("writing {}: {e}", out.display()));
    progress(&format!("wrote {} ({:.0} s)", out.display(), r.runtime_s));
    print!("{}", report::summary(&r));
}
