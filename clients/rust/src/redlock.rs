//! RedLock: one lock over N independent servers (masters that do not
//! replicate to each other), each with the rlock module.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use redis::{Client, Connection};

use crate::{millis, random_owner, random_u64, Connector, Error, Result, DEFAULT_LEASE};

/// One server's cached connection and its connector.
struct Slot {
    conn: Option<Connection>,
    connector: Connector,
}

fn slots(servers: &[Client], timeout: Duration) -> Vec<Mutex<Slot>> {
    servers
        .iter()
        .map(|c| {
            Mutex::new(Slot {
                conn: None,
                connector: Connector::new(c.clone(), timeout),
            })
        })
        .collect()
}

/// The address of a server listed twice (another db of it is the same
/// server): it would count twice towards the quorum.
fn listed_twice(servers: &[Client]) -> Option<String> {
    let mut seen = std::collections::HashSet::new();
    servers
        .iter()
        .map(|c| c.get_connection_info().addr.to_string())
        .find(|addr| !seen.insert(addr.clone()))
}

/// Quorum lock over independent servers.
///
/// [`RedLock::try_acquire`] sends `RLOCK.ACQUIRE key owner PX lease` (never
/// `BLOCK`) to each server in turn, each bounded by the per-server timeout
/// (connect, write and read), so a dead or frozen server costs at most that.
/// The lock is held when at least N/2+1 servers granted and the validity —
/// lease − time spent − drift (lease × `drift_factor` + 2 ms) — is positive;
/// otherwise the attempt is released on every server. A server listed twice
/// (by address) makes every acquisition an error: it would count twice.
///
/// Each acquisition uses a fresh owner string (not reentrant). The tokens are
/// per server: **they are not one fencing token** (each server counts on its
/// own), so do not compare them across servers.
pub struct RedLock {
    servers: Vec<Client>,
    /// A server listed twice (its address): refused by every acquisition.
    listed_twice: Option<String>,
    conns: Vec<Mutex<Slot>>,
    key: String,
    lease: Duration,
    server_timeout: Duration,
    retry_delay: Duration,
    drift_factor: f64,
}

impl RedLock {
    /// A RedLock over `servers` with a 30 s lease, a 100 ms per-server
    /// timeout, 200 ms between attempts and a 1 % drift factor.
    pub fn new(servers: &[Client], key: impl Into<String>) -> RedLock {
        RedLock {
            servers: servers.to_vec(),
            listed_twice: listed_twice(servers),
            conns: slots(servers, Duration::from_millis(100)),
            key: key.into(),
            lease: DEFAULT_LEASE,
            server_timeout: Duration::from_millis(100),
            retry_delay: Duration::from_millis(200),
            drift_factor: 0.01,
        }
    }

    pub fn lease(mut self, lease: Duration) -> RedLock {
        self.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// The longest one server may take to answer (connect, send, reply).
    pub fn server_timeout(mut self, t: Duration) -> RedLock {
        self.server_timeout = t.max(Duration::from_millis(1));
        self.conns = slots(&self.servers, self.server_timeout);
        self
    }

    /// Attempts are spaced by a random delay in [retry_delay/2, retry_delay].
    pub fn retry_delay(mut self, d: Duration) -> RedLock {
        self.retry_delay = d;
        self
    }

    pub fn drift_factor(mut self, f: f64) -> RedLock {
        self.drift_factor = f;
        self
    }

    /// ⌊N/2⌋ + 1.
    pub fn quorum(&self) -> usize {
        self.servers.len() / 2 + 1
    }

    /// The clock-drift allowance: lease × drift_factor + 2 ms.
    pub fn drift(&self) -> Duration {
        Duration::from_secs_f64(self.lease.as_secs_f64() * self.drift_factor)
            + Duration::from_millis(2)
    }

    /// Sends `cmd` to server `i` on its cached connection (reconnecting with
    /// the per-server timeout). `None`: no answer (down, frozen, reset).
    fn ask(&self, i: usize, cmd: &redis::Cmd) -> Option<redis::RedisResult<redis::Value>> {
        let mut slot = self.conns[i].lock().unwrap_or_else(|p| p.into_inner());
        if slot.conn.is_none() {
            slot.conn = Some(slot.connector.connect().ok()?);
        }
        let conn = slot.conn.as_mut()?;
        match cmd.query::<redis::Value>(conn) {
            Err(e) if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() => {
                slot.conn = None; // its reply may still come: never reuse it
                None
            }
            other => Some(other),
        }
    }

    fn each(&self, cmd: &redis::Cmd) -> Vec<Option<redis::RedisResult<redis::Value>>> {
        (0..self.servers.len()).map(|i| self.ask(i, cmd)).collect()
    }

    fn release_cmd(&self, owner: &str) -> redis::Cmd {
        let mut c = redis::cmd("RLOCK.RELEASE");
        c.arg(&self.key).arg(owner);
        c
    }

    /// One round over all servers: `Some(guard)` when a quorum granted within
    /// the validity, else `None` (after releasing on every server).
    pub fn try_acquire(&self) -> Result<Option<RedLockGuard<'_>>> {
        if let Some(addr) = &self.listed_twice {
            let e = (
                redis::ErrorKind::InvalidClientConfig,
                "RedLock needs distinct servers, one is listed twice",
                addr.clone(),
            );
            return Err(Error::Redis(e.into()));
        }
        let owner = format!("{}:redlock", random_owner());
        let mut acquire = redis::cmd("RLOCK.ACQUIRE");
        acquire
            .arg(&self.key)
            .arg(&owner)
            .arg("PX")
            .arg(millis(self.lease));
        let start = Instant::now();
        let replies = self.each(&acquire);
        let elapsed = start.elapsed();
        let tokens: Vec<Option<i64>> = replies
            .iter()
            .map(|r| match r {
                Some(Ok(redis::Value::Int(t))) => Some(*t),
                _ => None,
            })
            .collect();
        let granted = tokens.iter().filter(|t| t.is_some()).count();
        let validity = self.lease.checked_sub(elapsed + self.drift());
        match validity {
            Some(v) if granted >= self.quorum() && !v.is_zero() => Ok(Some(RedLockGuard {
                redlock: self,
                owner,
                tokens,
                validity: v,
                acquired_at: start,
                released: false,
            })),
            _ => {
                self.each(&self.release_cmd(&owner));
                Ok(None)
            }
        }
    }

    /// [`try_acquire`](Self::try_acquire) until it succeeds or `timeout`
    /// (None: no limit) passes, with a random delay between attempts.
    pub fn acquire(&self, timeout: Option<Duration>) -> Result<Option<RedLockGuard<'_>>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            if let Some(g) = self.try_acquire()? {
                return Ok(Some(g));
            }
            let half = millis(self.retry_delay / 2);
            let mut delay = Duration::from_millis(half + random_u64() % (half + 1));
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                delay = delay.min(left);
            }
            std::thread::sleep(delay);
        }
    }
}

/// A held RedLock; dropping it releases on every server.
pub struct RedLockGuard<'a> {
    redlock: &'a RedLock,
    owner: String,
    tokens: Vec<Option<i64>>,
    validity: Duration,
    acquired_at: Instant,
    released: bool,
}

impl RedLockGuard<'_> {
    /// Server i's fencing token, or None where it did not grant. Not one
    /// fencing token: each server counts on its own.
    pub fn tokens(&self) -> &[Option<i64>] {
        &self.tokens
    }

    /// How many servers granted.
    pub fn granted(&self) -> usize {
        self.tokens.iter().filter(|t| t.is_some()).count()
    }

    /// How long the lock is known to be held from [`acquired_at`](Self::acquired_at):
    /// lease − time spent acquiring − drift.
    pub fn validity(&self) -> Duration {
        self.validity
    }

    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// The instant past which the lock may have ended.
    pub fn valid_until(&self) -> Instant {
        self.acquired_at + self.validity
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Renews the lease on every server; true when a quorum renewed within the
    /// new validity (which then replaces the old one). False: take the lock as
    /// lost (dropping the guard still cleans up).
    pub fn extend(&mut self) -> Result<bool> {
        let mut renew = redis::cmd("RLOCK.RENEW");
        renew
            .arg(&self.redlock.key)
            .arg(&self.owner)
            .arg("PX")
            .arg(millis(self.redlock.lease));
        let start = Instant::now();
        let replies = self.redlock.each(&renew);
        let elapsed = start.elapsed();
        let renewed: Vec<bool> = replies
            .iter()
            .map(|r| matches!(r, Some(Ok(redis::Value::Int(1)))))
            .collect();
        let count = renewed.iter().filter(|r| **r).count();
        match self
            .redlock
            .lease
            .checked_sub(elapsed + self.redlock.drift())
        {
            Some(v) if count >= self.redlock.quorum() && !v.is_zero() => {
                for (t, ok) in self.tokens.iter_mut().zip(renewed) {
                    if !ok {
                        *t = None;
                    }
                }
                self.validity = v;
                self.acquired_at = start;
                Ok(true)
            }
            _ => Ok(false),
        }
    }

    /// Releases on every server (also those that did not grant: their answer
    /// may have been lost); returns how many servers answered.
    pub fn release(mut self) -> usize {
        self.release_now()
    }

    fn release_now(&mut self) -> usize {
        self.released = true;
        let cmd = self.redlock.release_cmd(&self.owner);
        self.redlock
            .each(&cmd)
            .iter()
            .filter(|r| r.is_some())
            .count()
    }
}

impl Drop for RedLockGuard<'_> {
    fn drop(&mut self) {
        if !self.released {
            self.release_now();
        }
    }
}
