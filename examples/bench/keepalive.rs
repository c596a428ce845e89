//! (k) KEEPALIVE at scale: N holdings bound to their connections, renewed by
//! the server every third of the lease; against the same N holdings renewed
//! by a client sending RLOCK.RENEW at the same rate, and against N holdings
//! nobody renews (the idle floor). A replica is attached, so every renewal is
//! an effect sent down the link.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
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
    /// The measuring windows, in order (the same windows for every setup).
    pub rounds: Vec<Window>,
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
    /// Server CPU per renewal (µs) in each window, above the floor's CPU in the
    /// same window.
    pub fn us_per_renewal(&self, floor: &KeepAlive) -> Vec<f64> {
        self.rounds
            .iter()
            .zip(&floor.rounds)
            .map(|(w, f)| {
                let above = w.cpu_secs / w.secs - f.cpu_secs / f.secs;
                above.max(0.0) / (w.renewals / w.secs) * 1e6
            })
            .collect()
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

/// Renews every holding once per third of the lease, in batches every 100 ms,
/// until `stop`; `renewed` counts the renewals the server has answered.
fn client_renewals(mut c: Conn, n: usize, lease_ms: u64, stop: &AtomicBool, renewed: &AtomicU64) {
    let period = Duration::from_millis(100);
    let per_tick = ((3 * n) as f64 / (lease_ms as f64 / 1000.0) / 10.0).ceil() as usize;
    let (mut next, mut i) = (Instant::now(), 0usize);
    while !stop.load(Ordering::Relaxed) {
        for _ in 0..per_tick {
            q!(c; "RLOCK.RENEW", format!("ka:{i}"), owner(i as u64, 1), "PX", lease_ms);
            i = (i + 1) % n;
        }
        c.flush().expect("flush");
        for v in c.read_n(per_tick).expect("read") {
            assert_eq!(v.int(), Some(1), "RENEW: {v:?}");
        }
        renewed.fetch_add(per_tick as u64, Ordering::Relaxed);
        next += period;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
    }
}

/// One of the three setups: a master with its replica and its holdings.
struct Setup {
    renewal: Renewal,
    lease_ms: u64,
    srv: Server,
    /// Follows `srv` until the setup is dropped.
    _replica: Server,
    conns: Vec<Conn>,
}

impl Setup {
    fn start(env: &Env, renewal: Renewal) -> Setup {
        // The floor's holdings must not end during the run either.
        let lease_ms = match renewal {
            Renewal::None => 3_600_000,
            _ => env.cfg.keepalive_lease_ms,
        };
        let srv = Server::start(&env.module, None);
        let replica = srv.start_replica(Some(&env.module));
        let mut conns: Vec<Conn> = (0..CONNECTIONS).map(|_| srv.conn()).collect();
        let n = env.cfg.keepalive_holdings;
        acquire_all(&mut conns, n, lease_ms, renewal == Renewal::Server);
        Setup {
            renewal,
            lease_ms,
            srv,
            _replica: replica,
            conns,
        }
    }

    /// Its counters now; `client_renewed`: what the client thread has renewed.
    fn sample(&self, client_renewed: &AtomicU64) -> Sample {
        let renewals = match self.renewal {
            Renewal::None => 0,
            Renewal::Server => self.srv.info_i64("rlock", "rlock_keepalive_renewals") as u64,
            Renewal::Client => client_renewed.load(Ordering::Relaxed),
        };
        Sample {
            cpu_ns: self.srv.cpu_ns(),
            repl_offset: self.srv.repl_offset(),
            renewals,
            at: Instant::now(),
        }
    }
}

/// A setup's counters at one moment.
struct Sample {
    cpu_ns: u64,
    repl_offset: i64,
    renewals: u64,
    at: Instant,
}

/// What one setup did over one window.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub secs: f64,
    pub cpu_secs: f64,
    pub renewals: f64,
    pub repl_bytes: f64,
}

impl Window {
    fn between(b: &Sample, a: &Sample) -> Window {
        Window {
            secs: (a.at - b.at).as_secs_f64(),
            cpu_secs: (a.cpu_ns - b.cpu_ns) as f64 / 1e9,
            renewals: (a.renewals - b.renewals) as f64,
            repl_bytes: (a.repl_offset - b.repl_offset) as f64,
        }
    }
}

/// The three setups side by side: all up at once, the client renewing from a
/// thread of its own, and the windows measured on all three at the same
/// time, so that background load on this shared machine falls on each alike
/// (measured one after another, the per-renewal ratio moved by 0.3x between
/// runs). Each window is one renewal period (a third of the lease): the
/// holdings are bound in a burst, so the server renews them in bursts, and a
/// shorter window would hold a burst or none.
pub fn run(env: &Env) -> Vec<KeepAlive> {
    let period = Duration::from_millis(env.cfg.keepalive_lease_ms / 3);
    let rounds = ((env.cfg.keepalive_secs / period.as_secs_f64()).round() as usize).max(1);
    let n = env.cfg.keepalive_holdings;
    let mut setups: Vec<Setup> = [Renewal::None, Renewal::Server, Renewal::Client]
        .into_iter()
        .map(|r| Setup::start(env, r))
        .collect();
    let (stop, renewed) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let client = {
        let c = setups[2].conns.pop().expect("a connection");
        let (stop, renewed, lease_ms) = (stop.clone(), renewed.clone(), setups[2].lease_ms);
        std::thread::spawn(move || client_renewals(c, n, lease_ms, &stop, &renewed))
    };
    // A full renewal cycle before measuring, so both schedules are steady.
    std::thread::sleep(Duration::from_millis(env.cfg.keepalive_lease_ms / 3 + 500));
    let mut windows = vec![Vec::new(); setups.len()];
    for _ in 0..rounds {
        let before: Vec<_> = setups.iter().map(|s| s.sample(&renewed)).collect();
        std::thread::sleep(period);
        let after: Vec<_> = setups.iter().map(|s| s.sample(&renewed)).collect();
        for (i, (b, a)) in before.iter().zip(&after).enumerate() {
            windows[i].push(Window::between(b, a));
        }
    }
    stop.store(true, Ordering::Relaxed);
    client.join().expect("client renewals");
    setups
        .iter()
        .zip(windows)
        .map(|(s, rounds)| {
            if s.renewal != Renewal::None {
                // Every holding is still there: renewed in time.
                let locks = s.srv.info_i64("rlock", "rlock_locks");
                assert_eq!(locks as usize, n, "holdings lost their lease");
            }
            let sum = |f: fn(&Window) -> f64| rounds.iter().map(f).sum::<f64>();
            KeepAlive {
                renewal: s.renewal,
                holdings: n,
                lease_ms: s.lease_ms,
                secs: sum(|w| w.secs),
                cpu_pct: sum(|w| w.cpu_secs) / sum(|w| w.secs) * 100.0,
                renewals_per_s: sum(|w| w.renewals) / sum(|w| w.secs),
                repl_bytes_per_s: sum(|w| w.repl_bytes) / sum(|w| w.secs),
                rounds,
            }
        })
        .collect()
}
