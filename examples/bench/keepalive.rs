//! (k) KEEPALIVE at scale: N holdings bound to their connections, renewed by
//! the server every third of the lease; against the same N holdings renewed
//! by a client sending RLOCK.RENEW at the same rate, and against N holdings
//! nobody renews (the idle floor). A replica is attached, so every renewal is
//! an effect sent down the link.

use std::time::{Duration, Instant};

use crate::locks::owner;
use crate::q;
use crate::resp::Conn;
use crate::server::Server;
use crate::Env;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Renewal {
    /// Nobody renews during the window (the idle floor).
    None,
    /// The server renews (KEEPALIVE).
    Server,
    /// A client sends RLOCK.RENEW at the rate KEEPALIVE would.
    Client,
}

pub struct KeepAlive {
    pub renewal: Renewal,
    pub holdings: usize,
    pub lease_ms: u64,
    pub secs: f64,
    pub cpu_pct: f64,
    pub renewals_per_s: f64,
    pub repl_bytes_per_s: f64,
}

impl KeepAlive {
    pub fn label(&self) -> &'static str {
        match self.renewal {
            Renewal::None => "holdings, no renewals (floor)",
            Renewal::Server => "KEEPALIVE (server renews)",
            Renewal::Client => "client RLOCK.RENEW, same rate",
        }
    }
    /// What KEEPALIVE is expected to do: 3 renewals per lease per holding.
    pub fn expected_per_s(&self) -> f64 {
        3.0 * self.holdings as f64 / (self.lease_ms as f64 / 1000.0)
    }
}

const CONNECTIONS: usize = 8;
const BATCH: usize = 1000;

fn acquire_all(conns: &mut [Conn], n: usize, lease_ms: u64, keepalive: bool) {
    for start in (0..n).step_by(BATCH * CONNECTIONS) {
        for (j, c) in conns.iter_mut().enumerate() {
            let from = start + j * BATCH;
            for i in from..(from + BATCH).min(n) {
                let (key, who) = (format!("ka:{i}"), owner(i as u64, 1));
                if keepalive {
                    q!(c; "RLOCK.ACQUIRE", key, who, "PX", lease_ms, "KEEPALIVE");
                } else {
                    q!(c; "RLOCK.ACQUIRE", key, who, "PX", lease_ms);
                }
            }
            c.flush().expect("flush");
        }
        for (j, c) in conns.iter_mut().enumerate() {
            let from = start + j * BATCH;
            for v in c
                .read_n((from + BATCH).min(n).saturating_sub(from))
                .expect("read")
            {
                assert!(v.int().is_some(), "ACQUIRE: {v:?}");
            }
        }
    }
}

/// Renews every holding once per third of the lease, in batches every 100 ms.
fn client_renewals(c: &mut Conn, n: usize, lease_ms: u64, secs: f64) -> u64 {
    let period = Duration::from_millis(100);
    let per_tick = ((3 * n) as f64 / (lease_ms as f64 / 1000.0) / 10.0).ceil() as usize;
    let end = Instant::now() + Duration::from_secs_f64(secs);
    let (mut next, mut sent, mut i) = (Instant::now(), 0u64, 0usize);
    while Instant::now() < end {
        for _ in 0..per_tick {
            q!(c; "RLOCK.RENEW", format!("ka:{i}"), owner(i as u64, 1), "PX", lease_ms);
            i = (i + 1) % n;
        }
        c.flush().expect("flush");
        for v in c.read_n(per_tick).expect("read") {
            assert_eq!(v.int(), Some(1), "RENEW: {v:?}");
        }
        sent += per_tick as u64;
        next += period;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
    sent
}

pub fn run(env: &Env, renewal: Renewal) -> KeepAlive {
    let (n, secs) = (env.cfg.keepalive_holdings, env.cfg.keepalive_secs);
    // The floor's holdings must not end during the run either.
    let lease_ms = match renewal {
        Renewal::None => 3_600_000,
        _ => env.cfg.keepalive_lease_ms,
    };
    let srv = Server::start(&env.module, None);
    let replica = srv.start_replica(Some(&env.module));
    let mut conns: Vec<Conn> = (0..CONNECTIONS).map(|_| srv.conn()).collect();
    acquire_all(&mut conns, n, lease_ms, renewal == Renewal::Server);
    // A full renewal cycle before measuring, so the schedule is steady.
    std::thread::sleep(Duration::from_millis(env.cfg.keepalive_lease_ms / 3 + 500));
    let renewed0 = srv.info_i64("rlock", "rlock_keepalive_renewals");
    let (off0, cpu0, t0) = (srv.repl_offset(), srv.cpu_ns(), Instant::now());
    let sent = match renewal {
        Renewal::Client => client_renewals(&mut conns[0], n, lease_ms, secs),
        _ => {
            std::thread::sleep(Duration::from_secs_f64(secs));
            0
        }
    };
    let wall = t0.elapsed().as_secs_f64();
    let cpu = (srv.cpu_ns() - cpu0) as f64 / 1e9;
    let bytes = (srv.repl_offset() - off0) as f64;
    let renewals = match renewal {
        Renewal::Client => sent as f64,
        _ => (srv.info_i64("rlock", "rlock_keepalive_renewals") - renewed0) as f64,
    };
    if renewal != Renewal::None {
        // Every holding is still there: renewed in time.
        let locks = srv.info_i64("rlock", "rlock_locks");
        assert_eq!(locks as usize, n, "holdings lost their lease");
    }
    drop(replica);
    KeepAlive {
        renewal,
        holdings: n,
        lease_ms,
        secs: wall,
        cpu_pct: cpu / wall * 100.0,
        renewals_per_s: renewals / wall,
        repl_bytes_per_s: bytes / wall,
    }
}
