//! (d) Scale: memory per held lock, CPU of an idle server holding many leased
//! locks, and the cost of one release with many waiters on the key.

use std::time::{Duration, Instant};

use crate::contention::percentile;
use crate::locks::{owner, Impl, Lock};
use crate::resp::{Conn, Value};
use crate::server::Server;
use crate::{cmd, q, Env};

/// Lease of the held locks here: long enough that none ends during the run.
pub const LONG_LEASE_MS: u64 = 3_600_000;

pub struct Memory {
    pub lock: Lock,
    pub locks: usize,
    pub bytes_per_lock: f64,
    /// MEMORY USAGE of one lock key (what Redis attributes to the key itself).
    pub memory_usage_key: i64,
    pub load_per_s: f64,
    pub idle: Option<Idle>,
}

pub struct Idle {
    pub secs: f64,
    /// CPU time used while idle, in % of one core.
    pub cpu_pct: f64,
}

pub struct Waiters {
    pub lock: Lock,
    pub waiters: usize,
    pub releases: usize,
    /// Server µs per release call (INFO commandstats).
    pub server_us: f64,
    pub rtt_p50_us: f64,
    pub rtt_p99_us: f64,
    /// Native: clients that received a reply during the releases (each one a grant).
    /// Redisson: unlock messages delivered per release (PUBLISH receivers).
    pub woken: f64,
}

fn measure_idle(srv: &Server, settle: Duration, secs: f64) -> Idle {
    std::thread::sleep(settle);
    let c0 = srv.cpu_ns();
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    let cpu = (srv.cpu_ns() - c0) as f64 / 1e9;
    let wall = t0.elapsed().as_secs_f64();
    Idle {
        secs: wall,
        cpu_pct: cpu / wall * 100.0,
    }
}

/// A fresh server with no keys: what Redis itself costs when idle.
pub fn idle_empty(env: &Env) -> Idle {
    let srv = Server::start(&env.module, None);
    measure_idle(&srv, Duration::from_secs(1), env.cfg.idle_secs)
}

/// Takes `n` locks on the distinct free keys `<prefix><i:08>` (i < n) over
/// `threads` connections, `batch` commands per flush, one owner per
/// connection; each call's lease is `lease(i)` ms, computed when the call is
/// queued.
pub fn load_locks(
    env: &Env,
    srv: &Server,
    lock: Lock,
    prefix: &str,
    (n, threads, batch): (usize, usize, usize),
    lease: impl Fn(usize) -> u64 + Send + Sync + Copy + 'static,
) {
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let scripts = env.scripts.clone();
            let port = srv.port;
            let prefix = prefix.to_string();
            std::thread::spawn(move || {
                let mut c = Conn::connect(port).expect("connect");
                let who = owner(200 + t as u64, 1);
                let keys: Vec<usize> = (t..n).step_by(threads).collect();
                for chunk in keys.chunks(batch) {
                    for &i in chunk {
                        let k = format!("{prefix}{i:08}");
                        lock.queue_acquire(&mut c, &scripts, &k, &who, lease(i), None);
                    }
                    c.flush().expect("send");
                    for v in c.read_n(chunk.len()).expect("replies") {
                        assert_eq!(lock.acquire_result(&v), Ok(None), "load {v:?}");
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("loader thread");
    }
}

/// Loads `n` held locks (distinct keys, long leases) and measures the memory
/// they add, then optionally the idle CPU of the server holding them.
pub fn memory(env: &Env, lock: Lock, n: usize, idle: bool) -> Memory {
    let srv = Server::start(&env.module, None);
    env.scripts.load(&mut srv.conn());
    let before = srv.info_i64("memory", "used_memory");
    let t0 = Instant::now();
    load_locks(env, &srv, lock, "lock:", (n, 4, 1000), |_| LONG_LEASE_MS);
    let load_secs = t0.elapsed().as_secs_f64();
    // Let the loaders' connections close before reading memory.
    std::thread::sleep(Duration::from_millis(200));
    let mut c = srv.conn();
    let dbsize = cmd!(c; "DBSIZE").expect("DBSIZE").int().unwrap_or(-1);
    assert!(
        dbsize as usize >= n,
        "DBSIZE {dbsize} after loading {n} locks"
    );
    let after = srv.info_i64("memory", "used_memory");
    let usage = cmd!(c; "MEMORY", "USAGE", "lock:00000000", "SAMPLES", "0")
        .expect("MEMORY USAGE")
        .int()
        .unwrap_or(-1);
    drop(c);
    let idle = idle.then(|| measure_idle(&srv, Duration::from_secs(2), env.cfg.idle_secs));
    Memory {
        lock,
        locks: n,
        bytes_per_lock: (after - before) as f64 / n as f64,
        memory_usage_key: usage,
        load_per_s: n as f64 / load_secs,
        idle,
    }
}

/// Polls `f` with a growing pause (50 µs up to 20 ms) until it holds.
pub fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let end = Instant::now() + timeout;
    let mut pause = Duration::from_micros(50);
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(20));
    }
}

pub fn native_waiting(srv: &Server) -> i64 {
    srv.info_i64("rlock", "rlock_waiters")
}

fn int(v: Value) -> i64 {
    v.int()
        .unwrap_or_else(|| panic!("expected an integer, got {v:?}"))
}

/// A steady queue of `n` clients parked on one native lock key. Each release
/// (sent by a control connection in the name of the current holder) hands the
/// lock to the head of the queue; then the previous holder's connection parks
/// again at the tail under a new owner name, and the next release waits until
/// the queue is back to `n`. The per-release steps are the same for every `n`.
struct SteadyQueue<'a> {
    env: &'a Env,
    lock: Lock,
    srv: Server,
    control: Conn,
    conns: Vec<Conn>,
    owners: Vec<String>,
    queue: std::collections::VecDeque<usize>,
    holder: usize,
    serial: u64,
    rtts: Vec<u32>,
    releases: usize,
}

const KEY: &str = "contended";

fn park(lock: Lock, s: &crate::locks::Scripts, conn: &mut Conn, who: &str) {
    lock.queue_acquire(conn, s, KEY, who, LONG_LEASE_MS, Some(0));
    conn.flush().expect("send");
}

impl<'a> SteadyQueue<'a> {
    fn new(env: &'a Env, lock: Lock, n: usize) -> SteadyQueue<'a> {
        assert_eq!(lock.imp, Impl::Native);
        let srv = Server::start(&env.module, Some(n + 64));
        let control = srv.conn();
        let mut q = SteadyQueue {
            env,
            lock,
            srv,
            control,
            conns: Vec::with_capacity(n + 1),
            owners: Vec::with_capacity(n + 1),
            queue: Default::default(),
            holder: 0,
            serial: 0,
            rtts: Vec::new(),
            releases: 0,
        };
        // Connection 0 holds the lock; 1..=n queue behind it in order. Every
        // connection has had a reply before it parks, as a client that has
        // been talking to the server has.
        for i in 0..=n {
            let mut w = Conn::connect(q.srv.port).expect("connect");
            assert_eq!(cmd!(w; "PING").expect("PING"), Value::Simple("PONG".into()));
            let who = q.fresh_owner();
            if i == 0 {
                let s = &*env.scripts;
                lock.queue_acquire(&mut w, s, KEY, &who, LONG_LEASE_MS, None);
                w.flush().expect("send");
                assert_eq!(lock.acquire_result(&w.read().expect("reply")), Ok(None));
            } else {
                park(lock, &env.scripts, &mut w, &who);
                q.queue.push_back(i);
            }
            q.conns.push(w);
            q.owners.push(who);
        }
        q.wait_queued();
        q.srv.reset_stats(&mut q.control);
        q
    }

    fn fresh_owner(&mut self) -> String {
        self.serial += 1;
        owner(10_000 + self.serial, 1)
    }

    fn wait_queued(&self) {
        let n = self.queue.len() as i64;
        wait_until(&format!("{n} waiters"), Duration::from_secs(120), || {
            native_waiting(&self.srv) == n
        });
    }

    fn release(&mut self) {
        let s = &*self.env.scripts;
        let t = Instant::now();
        let who = self.owners[self.holder].clone();
        self.lock
            .queue_release(&mut self.control, s, KEY, &who, LONG_LEASE_MS);
        self.control.flush().expect("send");
        let v = self.control.read().expect("reply");
        self.rtts.push(t.elapsed().as_micros() as u32);
        assert!(self.lock.released(&v), "release: {v:?}");
        // FIFO: the head of the queue got the lock.
        let head = self.queue.pop_front().expect("queue");
        let v = self.conns[head].read().expect("grant");
        assert!(matches!(v, Value::Int(_)), "grant: {v:?}");
        let who = self.fresh_owner();
        park(self.lock, s, &mut self.conns[self.holder], &who);
        self.owners[self.holder] = who;
        self.queue.push_back(self.holder);
        self.holder = head;
        self.releases += 1;
        self.wait_queued();
    }

    fn finish(mut self) -> Waiters {
        let calls = self.srv.commandstats();
        // Every reply a parked client gets is a grant: besides the grants read
        // in `release`, no connection may have received anything.
        std::thread::sleep(Duration::from_millis(100));
        let mut extra = 0;
        for w in self.conns.iter_mut() {
            if w.has_data().expect("poll") {
                extra += 1;
            }
        }
        let (ncalls, usec) = calls
            .get(self.lock.release_stat())
            .copied()
            .unwrap_or((0, 0));
        assert_eq!(ncalls as usize, self.releases, "release calls counted");
        let n = self.queue.len();
        // Kill the server before closing the sockets (no mass disconnect work).
        drop(self.srv);
        Waiters {
            lock: self.lock,
            waiters: n,
            releases: self.releases,
            server_us: usec as f64 / self.releases as f64,
            rtt_p50_us: percentile(&self.rtts, 50.0),
            rtt_p99_us: percentile(&self.rtts, 99.0),
            woken: (self.releases + extra) as f64,
        }
    }
}

/// Native: release with 1 waiter and with `n` waiters, `m` releases each. The
/// two servers run side by side and take turns (`m / 10` releases at a time),
/// so that background load on the machine touches both alike.
pub fn native_release(env: &Env, lock: Lock, n: usize, m: usize) -> (Waiters, Waiters) {
    let mut one = SteadyQueue::new(env, lock, 1);
    let mut many = SteadyQueue::new(env, lock, n);
    let chunk = (m / 10).max(1);
    // One release at a time: see `apart`.
    crate::server::apart(&[one.srv.pid, many.srv.pid], || {
        while one.releases < m {
            for q in [&mut one, &mut many] {
                for _ in 0..chunk.min(m - q.releases) {
                    q.release();
                }
            }
        }
    });
    (one.finish(), many.finish())
}

/// Redisson: `n` clients subscribed to the lock's channel (Redisson's waiters),
/// then `m` acquire (EVAL, not counted) + release (EVALSHA, measured) pairs.
/// Each release publishes the unlock message to every subscriber.
pub fn lua_release(env: &Env, lock: Lock, n: usize, m: usize) -> Waiters {
    assert_eq!(lock.imp, Impl::Lua);
    let s = &*env.scripts;
    let srv = Server::start(&env.module, Some(n + 64));
    let mut c = srv.conn();
    s.load(&mut c);
    let key = "contended";
    let holder = owner(9, 1);
    let channel = lock.channel(key, &holder);
    let mut subs: Vec<Conn> = Vec::with_capacity(n);
    for _ in 0..n {
        let mut w = Conn::connect(srv.port).expect("connect");
        q!(w; "SUBSCRIBE", channel);
        w.flush().expect("send");
        subs.push(w);
    }
    let numsub = |c: &mut Conn| -> i64 {
        match cmd!(c; "PUBSUB", "NUMSUB", channel).expect("NUMSUB") {
            Value::Array(a) if a.len() == 2 => a[1].int().unwrap_or(-1),
            v => panic!("PUBSUB NUMSUB: {v:?}"),
        }
    };
    wait_until(
        &format!("{n} subscribers"),
        Duration::from_secs(120),
        || numsub(&mut c) == n as i64,
    );
    let receivers = numsub(&mut c);
    let acquire_src = match lock.fam {
        crate::locks::Family::Reentrant => &s.source["reentrant_acquire"],
        f => panic!("no Redisson waiter benchmark for {f:?}"),
    };
    srv.reset_stats(&mut c);
    let mut rtts = Vec::with_capacity(m);
    for _ in 0..m {
        let v = cmd!(c; "EVAL", acquire_src, 1, key, LONG_LEASE_MS, holder).expect("EVAL");
        assert_eq!(v, Value::Nil, "acquire: {v:?}");
        let t = Instant::now();
        lock.queue_release(&mut c, s, key, &holder, LONG_LEASE_MS);
        c.flush().expect("send");
        let v = c.read().expect("reply");
        rtts.push(t.elapsed().as_micros() as u32);
        assert_eq!(int(v), 1, "release");
    }
    let calls = srv.commandstats();
    let (ncalls, usec) = calls.get("evalsha").copied().unwrap_or((0, 0));
    assert_eq!(ncalls as usize, m, "release calls counted");
    drop(srv);
    drop(subs);
    Waiters {
        lock,
        waiters: n,
        releases: m,
        server_us: usec as f64 / m as f64,
        rtt_p50_us: percentile(&rtts, 50.0),
        rtt_p99_us: percentile(&rtts, 99.0),
        woken: receivers as f64,
    }
}
