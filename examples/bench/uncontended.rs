//! (a) Uncontended cost: server microseconds per call (INFO commandstats after
//! CONFIG RESETSTAT) and pipelined throughput, acquire and release of free locks.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::locks::{owner, Impl, Lock, Scripts};
use crate::server::Server;
use crate::{Env, Gate};

/// Lease of every hold in this section (Redisson's default watchdog lease).
pub const LEASE_MS: u64 = 30_000;

pub struct CallCost {
    pub lock: Lock,
    /// Server µs per call, one value per round.
    pub acquire_us: Vec<f64>,
    pub release_us: Vec<f64>,
    /// Main-thread CPU µs per call over the same calls, one value per round.
    /// `INFO commandstats` times only the command itself: a module's effect is
    /// built and queued inside it, while Redis queues a native command's
    /// own propagation after the timed part; this counts both sides' whole work.
    pub acquire_cpu_us: Vec<f64>,
    pub release_cpu_us: Vec<f64>,
    /// A native lock against the floor on the lock's own server, in turns
    /// (`Turns`): per round, the lock's µs per call over the floor's
    /// in the same turns. Empty for the floor and the Lua locks.
    pub paired_acquire: Vec<f64>,
    pub paired_release: Vec<f64>,
}

/// Median over rounds of `a`'s time / `b`'s time in the same round (the rounds
/// of all locks are interleaved, so each ratio compares measurements taken
/// seconds apart, under the same background load).
pub fn ratio(a: &[f64], b: &[f64]) -> f64 {
    let r: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
    median(&r)
}

impl CallCost {
    pub fn acquire_ratio(&self, other: &CallCost) -> f64 {
        ratio(&self.acquire_us, &other.acquire_us)
    }
    pub fn release_ratio(&self, other: &CallCost) -> f64 {
        ratio(&self.release_us, &other.release_us)
    }
    pub fn acquire_cpu_ratio(&self, other: &CallCost) -> f64 {
        ratio(&self.acquire_cpu_us, &other.acquire_cpu_us)
    }
    /// Against the floor on the same server, in turns: the targets' ratio.
    pub fn paired_acquire_ratio(&self) -> f64 {
        median(&self.paired_acquire)
    }
    pub fn paired_release_ratio(&self) -> f64 {
        median(&self.paired_release)
    }
    pub fn acquire(&self) -> f64 {
        median(&self.acquire_us)
    }
    pub fn release(&self) -> f64 {
        median(&self.release_us)
    }
}

pub struct Throughput {
    pub lock: Lock,
    pub acquire_per_s: f64,
    pub release_per_s: f64,
    pub clients: usize,
    pub pipeline: usize,
}

pub fn median(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

fn key(prefix: &str, i: usize) -> String {
    format!("{prefix}lock:{i:08}")
}

/// Acquires `keys` (all free) in pipelined batches; panics on any refusal.
fn acquire_all(
    c: &mut crate::resp::Conn,
    s: &Scripts,
    lock: Lock,
    keys: &[String],
    owner: &str,
    lease_ms: u64,
    batch: usize,
) {
    for chunk in keys.chunks(batch) {
        for k in chunk {
            lock.queue_acquire(c, s, k, owner, lease_ms, None);
        }
        c.flush().expect("send");
        for v in c.read_n(chunk.len()).expect("replies") {
            match lock.acquire_result(&v) {
                Ok(None) => {}
                other => panic!("{}: acquire of a free lock failed: {other:?}", lock.label()),
            }
        }
    }
}

fn release_all(
    c: &mut crate::resp::Conn,
    s: &Scripts,
    lock: Lock,
    keys: &[String],
    owner: &str,
    batch: usize,
) {
    for chunk in keys.chunks(batch) {
        for k in chunk {
            lock.queue_release(c, s, k, owner, LEASE_MS);
        }
        c.flush().expect("send");
        for v in c.read_n(chunk.len()).expect("replies") {
            assert!(lock.released(&v), "{}: release failed: {v:?}", lock.label());
        }
    }
}

/// A fresh server for `lock` (module loaded unless it is the plain floor, AOF
/// as the lock says) and, for a lock `with_replica`, its synced replica (the
/// module loaded there too, as a deployment has it).
pub fn start_servers(env: &Env, lock: Lock) -> (Server, Option<Server>) {
    let module = lock.with_module().then_some(env.module.as_path());
    let srv = Server::start_with(module, None, lock.aof);
    let replica = lock.replica.then(|| srv.start_replica(module));
    (srv, replica)
}

/// One round of a lock on a fresh server.
struct Round {
    /// (acquire, release) µs per call by `INFO commandstats`.
    us: (f64, f64),
    /// The same by main-thread CPU.
    cpu: (f64, f64),
    /// For a native lock, (acquire, release) over the floor's in turns.
    paired: Option<(f64, f64)>,
}

/// Server time per call of one lock's acquire and release, on a fresh server;
/// then, for a native lock, the same calls again in turns with the floor's.
fn one_round(env: &Env, lock: Lock, calls: usize) -> Round {
    let (srv, replica) = start_servers(env, lock);
    let mut c = srv.conn();
    env.scripts.load(&mut c);
    let keys: Vec<String> = (0..calls).map(|i| key("", i)).collect();
    let who = owner(1, 1);
    let per_call = |name: &str| -> f64 {
        let stats = srv.commandstats();
        let (n, usec) = stats.get(name).copied().unwrap_or((0, 0));
        assert_eq!(
            n as usize,
            calls,
            "{}: commandstats counted {n} {name} calls",
            lock.label()
        );
        if let Some(replica) = &replica {
            // The replica stayed attached (effects went down the link): no
            // full or partial resync since the stats were reset.
            replica.wait_synced(&srv, std::time::Duration::from_secs(60));
            let stats = srv.info("stats");
            for f in ["sync_full", "sync_partial_ok"] {
                assert_eq!(stats.get(f).map(String::as_str), Some("0"), "{f}");
            }
        }
        usec as f64 / n as f64
    };
    let cpu_per_call = |before: f64| (srv.main_thread_cpu() - before) * 1e6 / calls as f64;
    srv.reset_stats(&mut c);
    let cpu = srv.main_thread_cpu();
    acquire_all(&mut c, &env.scripts, lock, &keys, &who, LEASE_MS, 500);
    let acquire_cpu = cpu_per_call(cpu);
    let acquire = per_call(lock.acquire_stat());
    srv.reset_stats(&mut c);
    let cpu = srv.main_thread_cpu();
    release_all(&mut c, &env.scripts, lock, &keys, &who, 500);
    let release_cpu = cpu_per_call(cpu);
    let release = per_call(lock.release_stat());
    let paired = (lock.imp == Impl::Native).then(|| {
        let floor = Lock {
            aof: lock.aof,
            replica: lock.replica,
            ..crate::FLOOR
        };
        let turns = Turns {
            pair: [
                (lock, key_list("l:", calls)),
                (floor, key_list("f:", calls)),
            ],
            who: &who,
        };
        let stat_ratio = |stats: [&str; 2]| per_call(stats[0]) / per_call(stats[1]);
        srv.reset_stats(&mut c);
        turns.run(&mut c, &env.scripts, acquire_all);
        let acquire = stat_ratio([lock.acquire_stat(), floor.acquire_stat()]);
        srv.reset_stats(&mut c);
        turns.run(&mut c, &env.scripts, |c, s, l, k, w, _, b| {
            release_all(c, s, l, k, w, b)
        });
        (
            acquire,
            stat_ratio([lock.release_stat(), floor.release_stat()]),
        )
    });
    Round {
        us: (acquire, release),
        cpu: (acquire_cpu, release_cpu),
        paired,
    }
}

fn key_list(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| key(prefix, i)).collect()
}

/// A native lock and the floor on one server, their calls in turns of
/// `TURN` each: the two share every moment of the server, which a floor
/// timed on a server of its own seconds apart does not (this machine moves a
/// server's speed from one to the next by more than the ratios differ).
/// Two commands only: each more on the server would share its caches with
/// more code, which moves every ratio.
struct Turns<'a> {
    pair: [(Lock, Vec<String>); 2],
    who: &'a str,
}

type Batch = fn(&mut crate::resp::Conn, &Scripts, Lock, &[String], &str, u64, usize);

impl Turns<'_> {
    const TURN: usize = 500;

    fn run(&self, c: &mut crate::resp::Conn, s: &Scripts, batch: Batch) {
        let [(a, a_keys), (b, b_keys)] = &self.pair;
        for (ka, kb) in a_keys.chunks(Self::TURN).zip(b_keys.chunks(Self::TURN)) {
            batch(c, s, *a, ka, self.who, LEASE_MS, Self::TURN);
            batch(c, s, *b, kb, self.who, LEASE_MS, Self::TURN);
        }
    }
}

/// Rounds are interleaved across locks so that a drift in background load
/// touches every lock alike; each lock's result is the median of its rounds.
pub fn call_costs(env: &Env, locks: &[Lock]) -> Vec<CallCost> {
    let mut out: Vec<CallCost> = locks
        .iter()
        .map(|&lock| CallCost {
            lock,
            acquire_us: vec![],
            release_us: vec![],
            acquire_cpu_us: vec![],
            release_cpu_us: vec![],
            paired_acquire: vec![],
            paired_release: vec![],
        })
        .collect();
    for round in 0..env.cfg.cost_rounds {
        for cc in out.iter_mut() {
            let Round {
                us: (a, r),
                cpu: (ac, rc),
                paired,
            } = one_round(env, cc.lock, env.cfg.cost_calls);
            let in_turns = paired.map_or(String::new(), |(pa, pr)| {
                format!("  in turns with the floor {pa:.2}x / {pr:.2}x")
            });
            crate::progress(&format!(
                "  round {} {:<44} acquire {a:6.2} us  release {r:6.2} us  (main-thread CPU {ac:6.2} / {rc:6.2} us){in_turns}",
                round + 1,
                cc.lock.label()
            ));
            cc.acquire_us.push(a);
            cc.release_us.push(r);
            cc.acquire_cpu_us.push(ac);
            cc.release_cpu_us.push(rc);
            if let Some((pa, pr)) = paired {
                cc.paired_acquire.push(pa);
                cc.paired_release.push(pr);
            }
        }
    }
    out
}

/// Pipelined throughput: `clients` connections, each acquiring distinct free
/// keys in batches of `pipeline` for the set time, then releasing them all.
pub fn throughput(env: &Env, lock: Lock) -> Throughput {
    let (srv, _replica) = start_servers(env, lock);
    env.scripts.load(&mut srv.conn());
    let clients = env.cfg.tput_clients;
    let pipeline = env.cfg.pipeline;
    let secs = Duration::from_secs_f64(env.cfg.tput_secs);
    let cap = env.cfg.tput_max_keys_per_client;
    let barrier = Arc::new(Gate::new(clients + 1));
    let handles: Vec<_> = (0..clients)
        .map(|t| {
            let barrier = barrier.clone();
            let scripts = env.scripts.clone();
            let port = srv.port;
            std::thread::spawn(move || {
                let mut c = crate::resp::Conn::connect(port).expect("connect");
                let who = owner(100 + t as u64, t as u64);
                let prefix = format!("t{t}:");
                let mut keys: Vec<String> = Vec::new();
                barrier.wait();
                let end = Instant::now() + secs;
                while Instant::now() < end && keys.len() < cap {
                    let from = keys.len();
                    keys.extend((from..from + pipeline).map(|i| key(&prefix, i)));
                    acquire_all(
                        &mut c,
                        &scripts,
                        lock,
                        &keys[from..],
                        &who,
                        LEASE_MS,
                        pipeline,
                    );
                }
                barrier.wait();
                barrier.wait();
                release_all(&mut c, &scripts, lock, &keys, &who, pipeline);
                barrier.wait();
                keys.len()
            })
        })
        .collect();
    barrier.wait();
    let t0 = Instant::now();
    barrier.wait();
    let acquire_time = t0.elapsed().as_secs_f64();
    barrier.wait();
    let t1 = Instant::now();
    barrier.wait();
    let release_time = t1.elapsed().as_secs_f64();
    let total: usize = handles
        .into_iter()
        .map(|h| h.join().expect("client thread"))
        .sum();
    Throughput {
        lock,
        acquire_per_s: total as f64 / acquire_time,
        release_per_s: total as f64 / release_time,
        clients,
        pipeline,
    }
}
