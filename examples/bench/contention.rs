//! (b) Contention: K clients on one key run acquire -> release loops for a
//! fixed time. Native clients park on the server (`ACQUIRE ... BLOCK`);
//! Redisson clients run Redisson's protocol against the Lua scripts.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::locks::{owner, Impl, Lock, Scripts};
use crate::q;
use crate::resp::{Conn, Value};
use crate::server::Server;
use crate::{Env, Gate};

pub const LEASE_MS: u64 = 30_000;
/// Native BLOCK timeout: long enough never to fire in a healthy run (a timeout
/// would show up as an extra command and a retry).
pub const BLOCK_MS: u64 = 10_000;
/// Nothing may wait past the end of the run by more than this.
const GRACE: Duration = Duration::from_secs(30);

#[derive(Default, Clone)]
pub struct ClientStats {
    pub acquisitions: u64,
    pub commands: u64,
    /// Acquire attempts that did not grant (Redisson retries, native BLOCK timeouts).
    pub failed_attempts: u64,
    /// Redisson: unlock messages delivered to this client's subscription.
    pub delivered: u64,
    /// Redisson: waits ended by a message (the rest ended on the pttl).
    pub woken_by_message: u64,
    pub ttl_waits: u64,
    pub latencies_us: Vec<u32>,
}

impl ClientStats {
    pub fn merge(&mut self, o: ClientStats) {
        self.acquisitions += o.acquisitions;
        self.commands += o.commands;
        self.failed_attempts += o.failed_attempts;
        self.delivered += o.delivered;
        self.woken_by_message += o.woken_by_message;
        self.ttl_waits += o.ttl_waits;
        self.latencies_us.extend(o.latencies_us);
    }
}

pub struct ContentionResult {
    pub lock: Lock,
    pub k: usize,
    pub secs: f64,
    pub stats: ClientStats,
    /// Native: grants delivered to parked clients (INFO rlock contended_grants).
    pub parked_grants: u64,
    pub server_cpu_s: f64,
}

impl ContentionResult {
    pub fn rate(&self) -> f64 {
        self.stats.acquisitions as f64 / self.secs
    }
    pub fn percentile_us(&self, p: f64) -> f64 {
        percentile(&self.stats.latencies_us, p)
    }
    pub fn commands_per_acquisition(&self) -> f64 {
        self.stats.commands as f64 / self.stats.acquisitions as f64
    }
    /// Replies to waiting clients per release (native) or unlock messages
    /// delivered to subscribers per release (Redisson). Each acquisition is
    /// released exactly once, so releases = acquisitions.
    pub fn wakeups_per_release(&self) -> f64 {
        let w = match self.lock.imp {
            Impl::Native => self.parked_grants,
            _ => self.stats.delivered,
        };
        w as f64 / self.stats.acquisitions as f64
    }
    pub fn failed_attempts_per_acquisition(&self) -> f64 {
        self.stats.failed_attempts as f64 / self.stats.acquisitions as f64
    }
    pub fn server_cpu_us_per_acquisition(&self) -> f64 {
        self.server_cpu_s * 1e6 / self.stats.acquisitions as f64
    }
}

pub fn percentile(v: &[u32], p: f64) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    let mut s = v.to_vec();
    s.sort_unstable();
    let rank = ((p / 100.0) * s.len() as f64).ceil() as usize;
    s[rank.clamp(1, s.len()) - 1] as f64
}

/// One client of Redisson's protocol: a command connection and a pub/sub
/// connection. Acquire: try the script; if it returns the pttl, subscribe to
/// the lock's channel, then loop { try again; wait for an unlock message or the
/// pttl }; unsubscribe once granted (RedissonLock.lock()).
pub struct RedissonClient {
    pub c: Conn,
    pub p: Conn,
    lock: Lock,
    pending_unsubscribe: Option<String>,
    pub stats: ClientStats,
}

fn frame_kind(v: &Value) -> Option<&[u8]> {
    match v {
        Value::Array(items) => match items.first() {
            Some(Value::Bulk(b)) => Some(b.as_slice()),
            _ => None,
        },
        _ => None,
    }
}

impl RedissonClient {
    pub fn new(port: u16, lock: Lock) -> RedissonClient {
        RedissonClient {
            c: Conn::connect(port).expect("connect"),
            p: Conn::connect(port).expect("connect"),
            lock,
            pending_unsubscribe: None,
            stats: ClientStats::default(),
        }
    }

    fn try_acquire(
        &mut self,
        s: &Scripts,
        key: &str,
        who: &str,
        lease_ms: u64,
    ) -> Result<Option<i64>, String> {
        self.lock
            .queue_acquire(&mut self.c, s, key, who, lease_ms, None);
        self.c.flush().map_err(|e| e.to_string())?;
        let v = self.c.read().map_err(|e| e.to_string())?;
        let r = self.lock.acquire_result(&v)?;
        if r.is_some() {
            self.stats.failed_attempts += 1;
        }
        Ok(r)
    }

    /// Reads pub/sub frames until the confirmation of `kind` ("subscribe" /
    /// "unsubscribe"), counting the unlock messages met on the way.
    fn await_confirmation(&mut self, kind: &[u8]) -> Result<(), String> {
        loop {
            let v = self
                .p
                .read_timeout(Duration::from_secs(10))
                .map_err(|e| e.to_string())?
                .ok_or("no pub/sub confirmation within 10 s")?;
            match frame_kind(&v) {
                Some(b"message") => self.stats.delivered += 1,
                Some(k) if k == kind => return Ok(()),
                Some(_) => {}
                None => return Err(format!("unexpected pub/sub frame {v:?}")),
            }
        }
    }

    fn subscribe(&mut self, channel: &str) -> Result<(), String> {
        if self.pending_unsubscribe.is_some() {
            // The previous UNSUBSCRIBE's confirmation (and any message sent
            // before it took effect) is still in flight.
            self.await_confirmation(b"unsubscribe")?;
            self.pending_unsubscribe = None;
        }
        q!(self.p; "SUBSCRIBE", channel);
        self.p.flush().map_err(|e| e.to_string())?;
        self.await_confirmation(b"subscribe")
    }

    /// Redisson's lock(): returns once granted.
    pub fn acquire(
        &mut self,
        s: &Scripts,
        key: &str,
        who: &str,
        lease_ms: u64,
        give_up: Instant,
    ) -> Result<(), String> {
        if self.try_lock(s, key, who, lease_ms, give_up)? {
            Ok(())
        } else {
            Err(format!("{}: not granted in time", self.lock.label()))
        }
    }

    /// Redisson's tryLock(waitTime): the same protocol, giving up (false) once
    /// `give_up` has passed.
    pub fn try_lock(
        &mut self,
        s: &Scripts,
        key: &str,
        who: &str,
        lease_ms: u64,
        give_up: Instant,
    ) -> Result<bool, String> {
        if self.try_acquire(s, key, who, lease_ms)?.is_none() {
            return Ok(true);
        }
        let channel = self.lock.channel(key, who);
        self.subscribe(&channel)?;
        let mut granted = true;
        while let Some(ttl) = self.try_acquire(s, key, who, lease_ms)? {
            let now = Instant::now();
            if now > give_up {
                granted = false;
                break;
            }
            // latch.tryAcquire(ttl) when ttl >= 0, else latch.acquire().
            let wait = if ttl >= 0 {
                Duration::from_millis(ttl as u64).min(give_up - now)
            } else {
                give_up - now
            };
            match self.p.read_timeout(wait).map_err(|e| e.to_string())? {
                Some(v) if frame_kind(&v) == Some(b"message") => {
                    self.stats.delivered += 1;
                    self.stats.woken_by_message += 1;
                }
                Some(v) => return Err(format!("unexpected pub/sub frame {v:?}")),
                None => self.stats.ttl_waits += 1,
            }
        }
        q!(self.p; "UNSUBSCRIBE", channel);
        self.p.flush().map_err(|e| e.to_string())?;
        self.pending_unsubscribe = Some(channel);
        Ok(granted)
    }

    pub fn release(&mut self, s: &Scripts, key: &str, who: &str) -> Result<(), String> {
        self.lock.queue_release(&mut self.c, s, key, who, LEASE_MS);
        self.c.flush().map_err(|e| e.to_string())?;
        let v = self.c.read().map_err(|e| e.to_string())?;
        if self.lock.released(&v) {
            Ok(())
        } else {
            Err(format!("{}: release failed: {v:?}", self.lock.label()))
        }
    }

    /// Waits for the last UNSUBSCRIBE and totals the commands sent.
    pub fn finish(mut self) -> ClientStats {
        if self.pending_unsubscribe.take().is_some() {
            let _ = self.await_confirmation(b"unsubscribe");
        }
        self.stats.commands = self.c.sent + self.p.sent;
        self.stats
    }
}

fn native_client(
    port: u16,
    scripts: &Scripts,
    lock: Lock,
    key: &str,
    who: &str,
    gate: &Gate,
    secs: Duration,
) -> Result<ClientStats, String> {
    let mut c = Conn::connect(port).map_err(|e| e.to_string())?;
    let mut st = ClientStats::default();
    gate.wait();
    let end = Instant::now() + secs;
    while Instant::now() < end {
        let t0 = Instant::now();
        loop {
            lock.queue_acquire(&mut c, scripts, key, who, LEASE_MS, Some(BLOCK_MS));
            c.flush().map_err(|e| e.to_string())?;
            let v = c.read().map_err(|e| e.to_string())?;
            match lock.acquire_result(&v)? {
                None => break,
                Some(_) => {
                    st.failed_attempts += 1;
                    if Instant::now() > end + GRACE {
                        return Err(format!("{}: not granted in time", lock.label()));
                    }
                }
            }
        }
        st.latencies_us
            .push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
        lock.queue_release(&mut c, scripts, key, who, LEASE_MS);
        c.flush().map_err(|e| e.to_string())?;
        let v = c.read().map_err(|e| e.to_string())?;
        if !lock.released(&v) {
            return Err(format!("{}: release failed: {v:?}", lock.label()));
        }
        st.acquisitions += 1;
    }
    st.commands = c.sent;
    Ok(st)
}

fn redisson_client(
    port: u16,
    scripts: &Scripts,
    lock: Lock,
    key: &str,
    who: &str,
    gate: &Gate,
    secs: Duration,
) -> Result<ClientStats, String> {
    let mut rc = RedissonClient::new(port, lock);
    gate.wait();
    let end = Instant::now() + secs;
    while Instant::now() < end {
        let t0 = Instant::now();
        rc.acquire(scripts, key, who, LEASE_MS, end + GRACE)?;
        rc.stats
            .latencies_us
            .push(t0.elapsed().as_micros().min(u32::MAX as u128) as u32);
        rc.release(scripts, key, who)?;
        rc.stats.acquisitions += 1;
    }
    Ok(rc.finish())
}

/// One run: K clients, one key, a fresh server.
pub fn run(env: &Env, lock: Lock, k: usize) -> ContentionResult {
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
                let who = owner(1000 + i as u64, 1);
                let key = "contended";
                let r = match lock.imp {
                    Impl::Native => native_client(port, &scripts, lock, key, &who, &gate, secs),
                    _ => redisson_client(port, &scripts, lock, key, &who, &gate, secs),
                };
                r.unwrap_or_else(|e| panic!("contention client {i}: {e}"))
            })
        })
        .collect();
    let grants0 = srv.info_i64("rlock", "rlock_contended_grants");
    let cpu0 = srv.cpu_ns();
    gate.wait();
    let t0 = Instant::now();
    let mut stats = ClientStats::default();
    for h in handles {
        stats.merge(h.join().expect("contention client thread"));
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let cpu = (srv.cpu_ns() - cpu0) as f64 / 1e9;
    let grants = srv.info_i64("rlock", "rlock_contended_grants") - grants0;
    ContentionResult {
        lock,
        k,
        secs: elapsed,
        stats,
        parked_grants: grants as u64,
        server_cpu_s: cpu,
    }
}
