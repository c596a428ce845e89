//! (m) Multi-key locks: K clients each lock a random pair of 8 keys (a
//! transfer between accounts, keys in from -> to order), then release.
//! Native: `RLOCK.ACQUIREALL 2 a b owner PX .. BLOCK ..` and `RLOCK.RELEASEALL`.
//! Redisson: RedissonMultiLock's protocol over its RLock Lua scripts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::contention::{percentile, ClientStats, RedissonClient, BLOCK_MS, LEASE_MS};
use crate::locks::{owner, Family, Impl, Lock, Scripts};
use crate::q;
use crate::resp::Conn;
use crate::server::Server;
use crate::{Env, Gate};

pub const KEYS: usize = 8;

pub struct MultiResult {
    pub native: bool,
    pub k: usize,
    pub secs: f64,
    pub stats: ClientStats,
    pub server_cpu_s: f64,
}

impl MultiResult {
    pub fn label(&self) -> &'static str {
        if self.native {
            "native ACQUIREALL ... BLOCK"
        } else {
            "Redisson MultiLock (Lua)"
        }
    }
    pub fn rate(&self) -> f64 {
        self.stats.acquisitions as f64 / self.secs
    }
    pub fn percentile_us(&self, p: f64) -> f64 {
        percentile(&self.stats.latencies_us, p)
    }
    pub fn commands_per_acquisition(&self) -> f64 {
        self.stats.commands as f64 / self.stats.acquisitions as f64
    }
    pub fn server_cpu_us_per_acquisition(&self) -> f64 {
        self.server_cpu_s * 1e6 / self.stats.acquisitions as f64
    }
}

/// xorshift: each client its own reproducible sequence of pairs.
struct Pairs(u64);

impl Pairs {
    fn next(&mut self) -> (String, String) {
        let mut pick = || {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            (self.0 % KEYS as u64) as usize
        };
        let from = pick();
        let mut to = pick();
        while to == from {
            to = pick();
        }
        (format!("account:{from}"), format!("account:{to}"))
    }
}

fn native_client(port: u16, seed: u64, who: &str, gate: &Gate, secs: Duration) -> ClientStats {
    let mut c = Conn::connect(port).expect("connect");
    let mut st = ClientStats::default();
    let mut pairs = Pairs(seed);
    gate.wait();
    let end = Instant::now() + secs;
    while Instant::now() < end {
        let (a, b) = pairs.next();
        let t0 = Instant::now();
        loop {
            q!(c; "RLOCK.ACQUIREALL", "2", a, b, who, "PX", LEASE_MS, "BLOCK", BLOCK_MS);
            c.flush().expect("flush");
            let v = c.read().expect("read");
            match &v {
                crate::resp::Value::Array(t) if t.len() == 2 => break,
                crate::resp::Value::Nil => st.failed_attempts += 1,
                other => panic!("ACQUIREALL: {other:?}"),
            }
        }
        st.latencies_us
            .push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
        q!(c; "RLOCK.RELEASEALL", "2", a, b, who);
        c.flush().expect("flush");
        let v = c.read().expect("read");
        assert!(!v.is_error(), "RELEASEALL: {v:?}");
        st.acquisitions += 1;
    }
    st.commands = c.sent;
    st
}

/// RedissonMultiLock.lock(): attempts of tryLock(waitTime = 1500 ms per lock);
/// an attempt takes the locks in the given order, each with
/// RLock.tryLock(remaining wait time) (subscribe, wait for the unlock message
/// or the pttl); when one is not granted in time, it unlocks those it holds
/// and starts the attempt over from the first lock while wait time remains
/// (failedLocksLimit is 0 for a MultiLock), else lock() starts a new attempt.
fn redisson_client(
    port: u16,
    scripts: &Scripts,
    seed: u64,
    who: &str,
    gate: &Gate,
    secs: Duration,
) -> ClientStats {
    let lock = Lock::new(Impl::Lua, Family::Reentrant);
    let mut rc = RedissonClient::new(port, lock);
    let mut pairs = Pairs(seed);
    gate.wait();
    let end = Instant::now() + secs;
    while Instant::now() < end {
        let (a, b) = pairs.next();
        let keys = [a.as_str(), b.as_str()];
        let t0 = Instant::now();
        'lock: loop {
            let attempt_end = Instant::now() + Duration::from_millis(1500 * keys.len() as u64);
            'attempt: loop {
                let mut held: Vec<&str> = Vec::new();
                for key in keys {
                    let granted = rc
                        .try_lock(scripts, key, who, LEASE_MS, attempt_end)
                        .expect("tryLock");
                    if !granted {
                        for h in held.drain(..) {
                            rc.release(scripts, h, who).expect("unlock");
                        }
                        if Instant::now() >= attempt_end {
                            break 'attempt;
                        }
                        continue 'attempt;
                    }
                    held.push(key);
                }
                break 'lock;
            }
        }
        rc.stats
            .latencies_us
            .push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
        for key in keys {
            rc.release(scripts, key, who).expect("unlock");
        }
        rc.stats.acquisitions += 1;
    }
    rc.finish()
}

/// One run: K clients, 8 keys, a fresh server.
pub fn run(env: &Env, native: bool, k: usize) -> MultiResult {
    let srv = Server::start(&env.module, None);
    env.scripts.load(&mut srv.conn());
    let secs = Duration::from_secs_f64(env.cfg.contention_secs);
    let gate = Arc::new(Gate::new(k + 1));
    let handles: Vec<_> = (0..k)
        .map(|i| {
            let gate = gate.clone();
            let scripts = env.scripts.clone();
            let port = srv.port;
            std::thread::spawn(move || {
                let who = owner(2000 + i as u64, 1);
                let seed = 0x9E37_79B9_7F4A_7C15 ^ (i as u64 + 1);
                if native {
                    native_client(port, seed, &who, &gate, secs)
                } else {
                    redisson_client(port, &scripts, seed, &who, &gate, secs)
                }
            })
        })
        .collect();
    let cpu0 = srv.cpu_ns();
    gate.wait();
    let t0 = Instant::now();
    let mut stats = ClientStats::default();
    for h in handles {
        stats.merge(h.join().expect("multilock client thread"));
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = (srv.cpu_ns() - cpu0) as f64 / 1e9;
    // Every hold was released: nothing may be left on any key.
    let mut c = srv.conn();
    for i in 0..KEYS {
        let v = crate::cmd!(c; "EXISTS", format!("account:{i}")).expect("EXISTS");
        assert_eq!(v.int(), Some(0), "account:{i} still held after the run");
    }
    MultiResult {
        native,
        k,
        secs: elapsed,
        stats,
        server_cpu_s: cpu,
    }
}
