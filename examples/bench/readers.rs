//! (e) Many holders and many waiters on one key: RWLOCK READ acquire /
//! release / renew with N readers already in, with and without a replica,
//! replicated bytes per change; and one `RWLOCK.RELEASE ... WRITE` that admits
//! N queued readers. (s) runs the same ops on a semaphore with N holdings.

use std::time::{Duration, Instant};

use crate::locks::owner;
use crate::resp::{Conn, Readiness, Value};
use crate::scale::{native_waiting, wait_until, LONG_LEASE_MS};
use crate::server::{apart, Pinger, Server, Stall};
use crate::{cmd, q, Env};

const KEY: &str = "readers";

/// Per size and setup, the measurement stops after this much wall time or this many bytes
/// sent to the replica (whichever comes first), so that a per-change cost
/// that grows with the holders cannot run for minutes or swamp the link.
pub const OP_BUDGET: Duration = Duration::from_secs(3);
pub const OP_BYTES_BUDGET: i64 = 64 << 20;

pub struct OpCost {
    pub calls: u64,
    pub us_per_call: f64,
    /// `master_repl_offset` delta / calls (only with a replica).
    pub bytes_per_change: Option<f64>,
}

pub struct ReadersScale {
    pub readers: usize,
    pub replica: bool,
    /// Acquire (a new reader joins), renew (an existing reader's lease), release (a reader leaves).
    pub acquire: OpCost,
    pub renew: OpCost,
    pub release: OpCost,
    /// With a replica: `DEBUG DIGEST-VALUE` of the key equal on both once the replica has caught up.
    pub replica_digest_equal: Option<bool>,
    pub load_s: f64,
}

impl ReadersScale {
    pub fn ops(&self) -> [(&'static str, &OpCost); 3] {
        [
            ("acquire", &self.acquire),
            ("renew", &self.renew),
            ("release", &self.release),
        ]
    }
}

/// Whose many holds share the key: RWLOCK readers, or holdings of one permit
/// each of a semaphore whose limit leaves room for all of them.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Shared {
    Readers,
    Permits,
}

/// A semaphore limit above every holder count measured.
const PERMITS_LIMIT: u64 = 10_000_000;

impl Shared {
    fn queue_acquire(self, c: &mut Conn, who: &str) {
        match self {
            Shared::Readers => q!(c; "RWLOCK.ACQUIRE", KEY, "READ", who, "PX", LONG_LEASE_MS),
            Shared::Permits => q!(c; "SEMAPHORE.ACQUIRE", KEY, who, "LIMIT", PERMITS_LIMIT,
                "PX", LONG_LEASE_MS),
        }
    }

    fn queue_renew(self, c: &mut Conn, who: &str) {
        match self {
            Shared::Readers => q!(c; "RWLOCK.RENEW", KEY, who, "PX", LONG_LEASE_MS),
            Shared::Permits => q!(c; "SEMAPHORE.RENEW", KEY, who, "PX", LONG_LEASE_MS),
        }
    }

    fn queue_release(self, c: &mut Conn, who: &str) {
        match self {
            Shared::Readers => q!(c; "RWLOCK.RELEASE", KEY, "READ", who),
            Shared::Permits => q!(c; "SEMAPHORE.RELEASE", KEY, who),
        }
    }

    fn stats(self) -> [&'static str; 3] {
        match self {
            Shared::Readers => ["rwlock.acquire", "rwlock.renew", "rwlock.release"],
            Shared::Permits => ["semaphore.acquire", "semaphore.renew", "semaphore.release"],
        }
    }
}

fn reader(i: usize) -> String {
    // Distinct by the thread part; the uuid part varies too.
    owner(1_000 + i as u64, i as u64)
}

/// Rounds of `three_ops_once`; each op's cost is the median of the rounds'
/// means. One command at a time is a few µs, so a single preemption of the
/// server (client, server and replica share 2 cores) can double a round's mean:
/// the median keeps such a round from deciding the result. The sizes take
/// turns round by round (every size's servers are up at once), so a spell of
/// background load or a quiet one falls on all of them alike: the targets
/// compare the sizes, and a run once measured the 1-holder baseline at half its
/// usual time while the other sizes were as usual.
pub const ROUNDS: usize = 5;

fn median_costs(rounds: &[[OpCost; 3]], replica: bool) -> [OpCost; 3] {
    std::array::from_fn(|k| {
        let of = |f: fn(&OpCost) -> f64| -> Vec<f64> { rounds.iter().map(|r| f(&r[k])).collect() };
        OpCost {
            calls: rounds.iter().map(|r| r[k].calls).sum(),
            us_per_call: crate::uncontended::median(&of(|o| o.us_per_call)),
            bytes_per_change: replica
                .then(|| crate::uncontended::median(&of(|o| o.bytes_per_change.unwrap_or(0.0)))),
        }
    })
}

/// `ROUNDS` rounds of the ops on every server (each holding `sizes[i]`
/// holders), the servers taking turns within each round; `base` names the
/// joining readers after the ones loaded.
fn interleaved_ops(
    servers: &[(usize, Server)],
    shared: Shared,
    base: impl Fn(usize) -> usize,
    m: usize,
    replica: bool,
) -> Vec<[OpCost; 3]> {
    let mut rounds: Vec<Vec<[OpCost; 3]>> = servers.iter().map(|_| Vec::new()).collect();
    for _ in 0..ROUNDS {
        for ((n, srv), out) in servers.iter().zip(rounds.iter_mut()) {
            out.push(three_ops_once(srv, shared, base(*n), m, replica));
        }
    }
    rounds.iter().map(|r| median_costs(r, replica)).collect()
}

/// `m` times (or until the budget is spent): a new reader joins, renews its
/// lease, leaves, so the key holds N readers, N + 1 while the ops run. One
/// command at a time; with a replica, `master_repl_offset` is read after each
/// (the effect is fed to the replica before the reply is written). Server µs
/// per call from `INFO commandstats`.
fn three_ops_once(
    srv: &Server,
    shared: Shared,
    base: usize,
    m: usize,
    replica: bool,
) -> [OpCost; 3] {
    let mut c = srv.conn();
    let stats = shared.stats();
    let mut bytes = [0i64; 3];
    srv.reset_stats(&mut c);
    let mut off = srv.repl_offset();
    let off0 = off;
    let t0 = Instant::now();
    for i in base..base + m {
        let who = reader(i);
        for (k, b) in bytes.iter_mut().enumerate() {
            match k {
                0 => shared.queue_acquire(&mut c, &who),
                1 => shared.queue_renew(&mut c, &who),
                _ => shared.queue_release(&mut c, &who),
            }
            let v = c.flush().and_then(|_| c.read()).expect("reply");
            let good = match k {
                0 => matches!(v, Value::Int(_)),
                1 => v == Value::Int(1),
                _ => v == Value::Int(0),
            };
            assert!(good, "{}: unexpected reply {v:?}", stats[k]);
            if replica {
                let now = srv.repl_offset();
                *b += now - off;
                off = now;
            }
        }
        if t0.elapsed() > OP_BUDGET || off - off0 > OP_BYTES_BUDGET {
            break;
        }
    }
    let cs = srv.commandstats();
    stats.map(|st| {
        let k = stats.iter().position(|x| *x == st).expect("stat");
        let (calls, usec) = cs.get(st).copied().unwrap_or((0, 0));
        assert!(calls > 0, "commandstats counted no {st} calls");
        OpCost {
            calls,
            us_per_call: usec as f64 / calls as f64,
            bytes_per_change: replica.then(|| bytes[k] as f64 / calls as f64),
        }
    })
}

/// N readers (or semaphore holdings) on one key, for every N in `sizes`: the
/// ops without a replica, then a replica is attached to each (full sync) and
/// the same ops again. Rows in the order of `sizes`, without then with a replica.
pub fn readers_scale(env: &Env, shared: Shared, sizes: &[usize], m: usize) -> Vec<ReadersScale> {
    let mut servers = Vec::new();
    let mut load = Vec::new();
    for &n in sizes {
        let srv = Server::start(&env.module, None);
        let t0 = Instant::now();
        let mut c = srv.conn();
        for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
            for &i in chunk {
                shared.queue_acquire(&mut c, &reader(i));
            }
            c.flush().expect("send");
            for v in c.read_n(chunk.len()).expect("replies") {
                assert!(matches!(v, Value::Int(_)), "load reader: {v:?}");
            }
        }
        let load_s = t0.elapsed().as_secs_f64();
        crate::progress(&format!("  {n} {shared:?} holders loaded in {load_s:.1} s"));
        servers.push((n, srv));
        load.push(load_s);
    }
    let masters: Vec<u32> = servers.iter().map(|(_, srv)| srv.pid).collect();
    let plain = apart(&masters, || {
        interleaved_ops(&servers, shared, |n| n, m, false)
    });
    // The replicas are not pinned: they answer nobody, and apply the stream on
    // whichever CPU is free.
    let replicas: Vec<Server> = servers
        .iter()
        .map(|(_, srv)| srv.start_replica(Some(&env.module)))
        .collect();
    let linked = apart(&masters, || {
        interleaved_ops(&servers, shared, |n| n + m, m, true)
    });
    let digest = |s: &Server| {
        let mut c = s.conn();
        cmd!(c; "DEBUG", "DIGEST-VALUE", KEY).expect("DIGEST-VALUE")
    };
    let mut out = Vec::new();
    let rows = servers
        .iter()
        .zip(&replicas)
        .zip(plain.into_iter().zip(linked));
    for ((((n, srv), replica), (plain, linked)), load_s) in rows.zip(load) {
        // (Not WAIT: it waits for the offset of this connection's own writes.)
        replica.wait_caught_up(srv, Duration::from_secs(120));
        let equal = digest(srv) == digest(replica);
        for (costs, digest_equal) in [(plain, None), (linked, Some(equal))] {
            let [acquire, renew, release] = costs;
            out.push(ReadersScale {
                readers: *n,
                replica: digest_equal.is_some(),
                acquire,
                renew,
                release,
                replica_digest_equal: digest_equal,
                load_s,
            });
        }
    }
    out
}

pub struct Admit {
    pub queued: usize,
    /// Server µs of the `RWLOCK.RELEASE ... WRITE` call.
    pub release_us: f64,
    /// Client side: release sent -> the last reader's reply received.
    pub all_served_ms: f64,
    pub served: usize,
    pub stall: Stall,
}

impl Admit {
    /// Release sent -> last reader served, per admitted reader, µs: all the
    /// work the admission takes, wherever the server does it (inside the
    /// release command or in the replies to the parked clients).
    pub fn us_per_reader(&self) -> f64 {
        self.all_served_ms * 1000.0 / self.queued as f64
    }
}

/// Connects `n` clients, each PINGed once (a client that has been talking to
/// the server) then sending the command `queue(conn, i)` without reading.
pub fn park_clients(port: u16, n: usize, mut queue: impl FnMut(&mut Conn, usize)) -> Vec<Conn> {
    (0..n)
        .map(|i| {
            let mut w = Conn::connect(port).expect("connect");
            assert_eq!(cmd!(w; "PING").expect("PING"), Value::Simple("PONG".into()));
            queue(&mut w, i);
            w.flush().expect("send");
            w
        })
        .collect()
}

/// Reads one reply from each of `conns` as it arrives (`epoll` over all of
/// them), until all have one or `timeout`; returns each reply with the time
/// it was read.
pub fn collect_replies(conns: &mut [Conn], timeout: Duration) -> Vec<Option<(Instant, Value)>> {
    let mut out: Vec<Option<(Instant, Value)>> = vec![None; conns.len()];
    let all: Vec<usize> = (0..conns.len()).collect();
    let watch = Readiness::new(conns, &all).expect("epoll");
    // Replies read along with earlier ones never wake the epoll.
    let mut ready: Vec<usize> = all
        .into_iter()
        .filter(|&i| conns[i].has_buffered())
        .collect();
    let mut left = conns.len();
    let end = Instant::now() + timeout;
    while left > 0 && Instant::now() < end {
        if ready.is_empty() {
            ready = watch.wait(Duration::from_millis(5)).expect("epoll wait");
        }
        let now = Instant::now();
        for i in ready.drain(..) {
            if out[i].is_some() {
                continue;
            }
            let v = conns[i].read().expect("reply");
            out[i] = Some((now, v));
            watch.forget(&conns[i], i).expect("epoll del");
            left -= 1;
        }
    }
    out
}

/// A writer holds the key, `n` readers are parked behind it
/// (`RWLOCK.ACQUIRE ... READ ... BLOCK 0`); the writer releases, which admits
/// all of them at once. A pinger measures how long the server was deaf.
pub fn admit(env: &Env, n: usize) -> Admit {
    let srv = Server::start(&env.module, Some(n + 64));
    let mut control = srv.conn();
    let writer = owner(5, 1);
    let v =
        cmd!(control; "RWLOCK.ACQUIRE", KEY, "WRITE", writer, "PX", LONG_LEASE_MS).expect("writer");
    assert!(matches!(v, Value::Int(_)), "writer acquire: {v:?}");
    let mut conns = park_clients(
        srv.port,
        n,
        |w, i| q!(w; "RWLOCK.ACQUIRE", KEY, "READ", reader(i), "PX", LONG_LEASE_MS, "BLOCK", 0),
    );
    wait_until(&format!("{n} waiters"), Duration::from_secs(120), || {
        native_waiting(&srv) == n as i64
    });
    let pinger = Pinger::start(srv.port);
    std::thread::sleep(Duration::from_millis(50));
    srv.reset_stats(&mut control);
    let t0 = Instant::now();
    let v = cmd!(control; "RWLOCK.RELEASE", KEY, "WRITE", writer).expect("release");
    assert_eq!(v, Value::Int(0), "writer release");
    let replies = collect_replies(&mut conns, Duration::from_secs(120));
    let last = replies
        .iter()
        .flatten()
        .map(|(t, _)| *t)
        .max()
        .unwrap_or(t0);
    let served = replies
        .iter()
        .flatten()
        .filter(|(_, v)| matches!(v, Value::Int(_)))
        .count();
    std::thread::sleep(Duration::from_millis(20));
    let log = pinger.stop();
    let stats = srv.commandstats();
    let usec = |s: &str| stats.get(s).map(|x| x.1).unwrap_or(0) as f64;
    let out = Admit {
        queued: n,
        release_us: usec("rwlock.release"),
        all_served_ms: last.duration_since(t0).as_secs_f64() * 1000.0,
        served,
        stall: log.window(t0, last),
    };
    // Kill the server before closing the sockets (no mass disconnect work).
    drop(srv);
    drop(conns);
    out
}
