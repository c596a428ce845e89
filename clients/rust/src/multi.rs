//! MultiLock: several RLOCK keys held together, all or nothing
//! (`RLOCK.ACQUIREALL` / `RELEASEALL` / `RENEWALL`).

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::Client;

use crate::{
    block_arg, grant, millis, parse_info, random_owner, Error, Held, Info, LostCallback, Pin,
    RenewSpec, Result, DEFAULT_LEASE, DEFAULT_WAIT_MARGIN,
};

/// A lock on several RLOCK keys for one owner string, taken all or nothing
/// (Redisson's MultiLock, atomic on the server).
///
/// ```no_run
/// # use std::time::Duration;
/// # fn main() -> Result<(), rlock_client::Error> {
/// # let client = redis::Client::open("redis://127.0.0.1:6379/")?;
/// use rlock_client::MultiLock;
/// let lock = MultiLock::new(&client, ["{acct}:1", "{acct}:2"]);
/// if let Some(guard) = lock.acquire(Some(Duration::from_secs(5)))? {
///     println!("tokens {:?}", guard.tokens()); // one per key, in order
/// } // dropped: every key released
/// # Ok(()) }
/// ```
///
/// A `BLOCK` wait holds nothing while it waits and takes its place in the
/// queue of each key, so it is never starved and cannot deadlock with another
/// multi-key waiter. The keys are plain RLOCK keys (a [`crate::Lock`] with the
/// same owner shares their tenures); in a cluster they must hash to one slot
/// (hash tags). Cheap to clone: clones are the same holder.
#[derive(Clone)]
pub struct MultiLock {
    client: Client,
    keys: Vec<String>,
    owner: String,
    lease: Duration,
    on_lost: Option<LostCallback>,
    wait_margin: Duration,
    pin: Option<Arc<Pin>>,
}

impl fmt::Debug for MultiLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLock")
            .field("keys", &self.keys)
            .field("owner", &self.owner)
            .field("lease", &self.lease)
            .field("keepalive", &self.pin.is_some())
            .finish()
    }
}

impl MultiLock {
    /// A multi-key lock with a random owner and a 30 s lease.
    pub fn new<K: Into<String>>(client: &Client, keys: impl IntoIterator<Item = K>) -> MultiLock {
        MultiLock {
            client: client.clone(),
            keys: keys.into_iter().map(Into::into).collect(),
            owner: random_owner(),
            lease: DEFAULT_LEASE,
            on_lost: None,
            wait_margin: DEFAULT_WAIT_MARGIN,
            pin: None,
        }
    }

    /// Holds under this owner string (default: random).
    pub fn owner(mut self, owner: impl Into<String>) -> MultiLock {
        self.owner = owner.into();
        if self.pin.is_some() {
            self.pin = Some(Pin::new(&self.client));
        }
        self
    }

    /// The lease of each key's hold (renewed with `RENEWALL` every lease/3
    /// while a guard lives, unless keepalive).
    pub fn lease(mut self, lease: Duration) -> MultiLock {
        self.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// `KEEPALIVE` on every key (see [`crate::Lock::keepalive`]): the server
    /// renews while the granted connection is open; no renewal thread.
    pub fn keepalive(mut self, on: bool) -> MultiLock {
        self.pin = on.then(|| Pin::new(&self.client));
        self
    }

    /// Called (from the renewal thread) when a guard finds the lock lost:
    /// `RENEWALL` said NOTOWNER (the owner no longer holds every key), or no
    /// renewal got through for a whole lease.
    pub fn on_lost(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> MultiLock {
        self.on_lost = Some(Arc::new(f));
        self
    }

    /// How much longer than its timeout an acquisition waits for the
    /// server's answer (see [`crate::Lock::wait_margin`] and
    /// [`crate::Lock::acquire`]).
    pub fn wait_margin(mut self, margin: Duration) -> MultiLock {
        self.wait_margin = margin.max(Duration::from_millis(1));
        self
    }

    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    pub fn owner_name(&self) -> &str {
        &self.owner
    }

    fn with_keys(&self, verb: &str) -> redis::Cmd {
        let mut c = redis::cmd(&format!("RLOCK.{verb}"));
        c.arg(self.keys.len()).arg(&self.keys).arg(&self.owner);
        c
    }

    fn acquire_cmd(&self, block: Option<Duration>) -> redis::Cmd {
        let mut c = self.with_keys("ACQUIREALL");
        c.arg("PX").arg(millis(self.lease));
        if let Some(block) = block {
            c.arg("BLOCK").arg(millis(block));
        }
        if self.pin.is_some() {
            c.arg("KEEPALIVE");
        }
        c
    }

    fn renew_cmd(&self) -> redis::Cmd {
        let mut c = self.with_keys("RENEWALL");
        c.arg("PX").arg(millis(self.lease));
        c
    }

    fn release_cmd(&self) -> redis::Cmd {
        self.with_keys("RELEASEALL")
    }

    /// One try: `Ok(None)` unless every key could be granted now (then none
    /// was taken).
    pub fn try_acquire(&self) -> Result<Option<MultiLockGuard>> {
        self.acquire_with(None)
    }

    /// Waits on the server (`BLOCK`, holding nothing) until every key can be
    /// granted at once, or until `timeout` (None: no limit): `Ok(None)`.
    /// `Err(Error::Deadlock)` when the server found the wait on a wait-for
    /// cycle (possible when this owner holds other locks). A server that does
    /// not answer within `timeout` + the wait margin: an error with
    /// [`Error::is_timeout`] (see [`crate::Lock::acquire`]).
    pub fn acquire(&self, timeout: Option<Duration>) -> Result<Option<MultiLockGuard>> {
        self.acquire_with(Some(block_arg(timeout)))
    }

    fn acquire_with(&self, block: Option<Duration>) -> Result<Option<MultiLockGuard>> {
        let granted = grant::<Vec<i64>>(
            &self.client,
            self.pin.as_ref(),
            &self.acquire_cmd(block),
            block,
            self.wait_margin,
        )?;
        Ok(granted.map(|(tokens, channel)| {
            let renew = RenewSpec {
                client: self.client.clone(),
                cmd: self.renew_cmd(),
                lease: self.lease,
                name: self.keys.join(","),
                on_lost: self.on_lost.clone(),
            };
            MultiLockGuard {
                lock: self.clone(),
                tokens,
                held: Held::new(channel, renew),
            }
        }))
    }

    /// `RLOCK.INFO` of each key, in key order.
    pub fn info(&self) -> Result<Vec<Option<Info>>> {
        let mut conn = self.client.get_connection()?;
        self.keys
            .iter()
            .map(|k| {
                let reply: redis::Value = redis::cmd("RLOCK.INFO").arg(k).query(&mut conn)?;
                Ok(parse_info(reply))
            })
            .collect()
    }
}

/// One hold of every key of a [`MultiLock`]. Renewed while it lives (with
/// `RENEWALL` on its own thread, or by the server for a keepalive lock);
/// dropping it releases every key.
pub struct MultiLockGuard {
    lock: MultiLock,
    tokens: Vec<i64>,
    held: Held,
}

impl fmt::Debug for MultiLockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MultiLockGuard")
            .field("lock", &self.lock)
            .field("tokens", &self.tokens)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl MultiLockGuard {
    /// The fencing token of each key's tenure, in key order.
    pub fn tokens(&self) -> &[i64] {
        &self.tokens
    }

    pub fn lock(&self) -> &MultiLock {
        &self.lock
    }

    /// True once the lock was found lost (the owner no longer holds every
    /// key, or no renewal got through for a whole lease).
    pub fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// `Err(Error::Lost)` once the lock was found lost.
    pub fn check(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::Lost(format!("RLOCK {}", self.lock.keys.join(" "))));
        }
        Ok(())
    }

    /// Whether the renewal thread is running (never for a keepalive lock).
    pub fn is_renewing(&self) -> bool {
        self.held.is_renewing()
    }

    /// Renews every key's lease now (`RENEWALL`).
    pub fn renew(&mut self) -> Result<()> {
        self.held.renew(&self.lock.renew_cmd())
    }

    /// Releases one hold of every key (`RELEASEALL`); returns the owner's
    /// remaining holds per key. `Err(Error::Lost)` (and nothing released)
    /// unless the owner held every key.
    pub fn release(mut self) -> Result<Vec<i64>> {
        self.held.release(&self.lock.release_cmd())
    }
}

impl Drop for MultiLockGuard {
    fn drop(&mut self) {
        if !self.held.is_released() {
            let _ = self.held.release::<Vec<i64>>(&self.lock.release_cmd());
        }
    }
}
