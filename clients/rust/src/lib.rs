//! Client library for the rlock Redis module (`RLOCK.*`, `FAIRLOCK.*`,
//! `RWLOCK.*`) on the synchronous [`redis`] crate, plus [`RedLock`] over
//! independent servers.
//!
//! ```no_run
//! use std::time::Duration;
//! use rlock_client::Lock;
//!
//! # fn main() -> Result<(), rlock_client::Error> {
//! let client = redis::Client::open("redis://127.0.0.1:6379/")?;
//! let lock = Lock::new(&client, "orders:42").lease(Duration::from_secs(10));
//! if let Some(guard) = lock.acquire(Some(Duration::from_secs(5)))? {
//!     // guard.token() is this tenure's fencing token: pass it to the resource.
//!     println!("held with token {}", guard.token());
//!     guard.release()?; // or drop it
//! }
//! # Ok(()) }
//! ```
//!
//! - [`Lock::acquire`] parks on the server (`BLOCK`) until the lock is handed
//!   over or the timeout runs out (`Ok(None)`); [`Lock::try_acquire`] is one try.
//! - The [`LockGuard`] renews the lease every lease/3 on its own thread while
//!   it lives and releases the hold when dropped. When the server says the
//!   owner no longer holds the lock (or no renewal got through for a whole
//!   lease), [`LockGuard::is_lost`] turns true and the `on_lost` callback runs.
//! - [`Lock::acquire_via_pubsub`] waits without parking a connection: it
//!   subscribes to `__rlock@<db>__:<key>` and retries on each message and when
//!   the holder's lease (`PTTL`) runs out.
//! - [`Lock::fair`] (`FAIRLOCK.*`), [`ReadWriteLock`] (`RWLOCK.*`, with
//!   [`ReadWriteLock::read`] / [`ReadWriteLock::write`] views).
//! - [`RedLock`]: quorum over independent servers; its per-server tokens are
//!   not one fencing token.

mod redlock;

pub use redlock::{RedLock, RedLockGuard};

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redis::{Client, Connection, Value};

/// The module's default lease.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// What can go wrong.
#[derive(Debug)]
pub enum Error {
    /// The server or the connection said so.
    Redis(redis::RedisError),
    /// The server no longer knows this owner as a holder (`NOTOWNER`): the
    /// lease ran out or the lock was forced free.
    Lost(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Redis(e) => write!(f, "{e}"),
            Error::Lost(why) => write!(f, "lock lost: {why}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            Error::Lost(_) => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Error {
        if e.code() == Some("NOTOWNER") {
            Error::Lost(e.to_string())
        } else {
            Error::Redis(e)
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;

/// A random owner string: `<128 random bits in hex>:<thread id>`.
pub fn random_owner() -> String {
    format!(
        "{:016x}{:016x}:{:?}",
        random_u64(),
        random_u64(),
        std::thread::current().id()
    )
}

pub(crate) fn random_u64() -> u64 {
    // RandomState is seeded from the OS once per thread and varied per call.
    let mut h = RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// The channel the module publishes on when a hold of `key` ends.
pub fn unlock_channel(db: i64, key: &str) -> String {
    format!("__rlock@{db}__:{key}")
}

const END_MESSAGES: [&[u8]; 3] = [b"released", b"expired", b"forced"];

/// The lock family (command prefix) and, for RWLOCK, the mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Reentrant,
    Fair,
    Read,
    Write,
}

impl Family {
    fn prefix(self) -> &'static str {
        match self {
            Family::Reentrant => "RLOCK",
            Family::Fair => "FAIRLOCK",
            Family::Read | Family::Write => "RWLOCK",
        }
    }

    fn mode(self) -> Option<&'static str> {
        match self {
            Family::Read => Some("READ"),
            Family::Write => Some("WRITE"),
            _ => None,
        }
    }

    fn command(self, verb: &str) -> redis::Cmd {
        redis::cmd(&format!("{}.{verb}", self.prefix()))
    }
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

type LostCallback = Arc<dyn Fn(&str) + Send + Sync>;

/// A lock on one key for one owner string. Cheap to clone (clones share the
/// owner: they are the same holder). Acquiring while holding adds a hold and
/// returns the same token.
#[derive(Clone)]
pub struct Lock {
    client: Client,
    key: String,
    owner: String,
    lease: Duration,
    family: Family,
    on_lost: Option<LostCallback>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("lease", &self.lease)
            .field("family", &self.family)
            .finish()
    }
}

/// `*.INFO` as (field, value) pairs.
pub type Info = Vec<(String, Value)>;

impl Lock {
    /// A reentrant lock (`RLOCK.*`) with a random owner and a 30 s lease.
    pub fn new(client: &Client, key: impl Into<String>) -> Lock {
        Lock::of(client, key, Family::Reentrant)
    }

    /// A fair lock (`FAIRLOCK.*`): parked waiters are served in arrival order.
    pub fn fair(client: &Client, key: impl Into<String>) -> Lock {
        Lock::of(client, key, Family::Fair)
    }

    /// A lock of any family (see also [`ReadWriteLock`]).
    pub fn of(client: &Client, key: impl Into<String>, family: Family) -> Lock {
        Lock {
            client: client.clone(),
            key: key.into(),
            owner: random_owner(),
            lease: DEFAULT_LEASE,
            family,
            on_lost: None,
        }
    }

    /// Holds under this owner string (default: random).
    pub fn owner(mut self, owner: impl Into<String>) -> Lock {
        self.owner = owner.into();
        self
    }

    /// The lease of each hold (renewed every lease/3 while a guard lives).
    pub fn lease(mut self, lease: Duration) -> Lock {
        self.lease = lease.max(Duration::from_millis(1));
        self
    }

    /// Called (from the renewal thread) when a guard finds the lock lost.
    pub fn on_lost(mut self, f: impl Fn(&str) + Send + Sync + 'static) -> Lock {
        self.on_lost = Some(Arc::new(f));
        self
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn owner_name(&self) -> &str {
        &self.owner
    }

    pub fn family(&self) -> Family {
        self.family
    }

    fn acquire_cmd(&self, block: Option<Duration>) -> redis::Cmd {
        let mut c = self.family.command("ACQUIRE");
        c.arg(&self.key);
        if let Some(mode) = self.family.mode() {
            c.arg(mode);
        }
        c.arg(&self.owner).arg("PX").arg(millis(self.lease));
        if let Some(block) = block {
            c.arg("BLOCK").arg(millis(block));
        }
        c
    }

    /// One try: `Ok(None)` when the lock is busy.
    pub fn try_acquire(&self) -> Result<Option<LockGuard>> {
        let mut conn = self.client.get_connection()?;
        let token: Option<i64> = self.acquire_cmd(None).query(&mut conn)?;
        Ok(token.map(|t| self.guard(conn, t)))
    }

    /// Waits on the server (`BLOCK`) until granted, or until `timeout` (None:
    /// no limit); `Ok(None)` when the time ran out. The wait occupies one
    /// connection without a read timeout: the server answers when BLOCK ends.
    pub fn acquire(&self, timeout: Option<Duration>) -> Result<Option<LockGuard>> {
        let mut conn = self.client.get_connection()?;
        // BLOCK 0 waits forever; a timeout rounds up to at least 1 ms.
        let block = timeout.map_or(Duration::ZERO, |t| t.max(Duration::from_millis(1)));
        let token: Option<i64> = self.acquire_cmd(Some(block)).query(&mut conn)?;
        Ok(token.map(|t| self.guard(conn, t)))
    }

    /// Acquires without parking a connection on the server: subscribes to the
    /// unlock channel first (so no release is missed), tries without BLOCK,
    /// and tries again on each end-of-hold message and when the holder's lease
    /// (`PTTL`) runs out, since a lease that ends with nobody parked may be
    /// announced only when Redis expires the key. `safety_poll` bounds each
    /// wait (a `DEL` publishes nothing). Holds no place in a FAIRLOCK queue.
    pub fn acquire_via_pubsub(
        &self,
        timeout: Option<Duration>,
        safety_poll: Duration,
    ) -> Result<Option<LockGuard>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut sub_conn = self.client.get_connection()?;
        let mut sub = sub_conn.as_pubsub();
        let db = self.client.get_connection_info().redis.db;
        sub.subscribe(unlock_channel(db, &self.key))?;
        let mut conn = self.client.get_connection()?;
        loop {
            let token: Option<i64> = self.acquire_cmd(None).query(&mut conn)?;
            if let Some(token) = token {
                return Ok(Some(self.guard(conn, token)));
            }
            let pttl: i64 = redis::cmd("PTTL").arg(&self.key).query(&mut conn)?;
            let mut wait = match pttl {
                -2 => Duration::from_millis(1), // freed meanwhile: try again now
                p if p < 0 => safety_poll,
                p => safety_poll.min(Duration::from_millis(p as u64 + 2)),
            };
            if let Some(d) = deadline {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(None);
                }
                wait = wait.min(left);
            }
            let until = Instant::now() + wait;
            loop {
                let left = until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                sub.set_read_timeout(Some(left))?;
                match sub.get_message() {
                    Ok(msg) if END_MESSAGES.contains(&msg.get_payload_bytes()) => break,
                    Ok(_) => {}
                    Err(e) if e.is_timeout() => break,
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }

    fn guard(&self, conn: Connection, token: i64) -> LockGuard {
        let lost = Arc::new(AtomicBool::new(false));
        let renewer = Renewer::start(self.clone(), lost.clone());
        LockGuard {
            lock: self.clone(),
            conn,
            token,
            lost,
            renewer,
            released: false,
        }
    }

    fn renew_cmd(&self) -> redis::Cmd {
        let mut c = self.family.command("RENEW");
        c.arg(&self.key)
            .arg(&self.owner)
            .arg("PX")
            .arg(millis(self.lease));
        c
    }

    /// `*.INFO` as field/value pairs (None when the key holds no lock).
    pub fn info(&self) -> Result<Option<Info>> {
        let mut conn = self.client.get_connection()?;
        let reply: Value = self
            .family
            .command("INFO")
            .arg(&self.key)
            .query(&mut conn)?;
        Ok(parse_info(reply))
    }
}

/// A `*.INFO` reply (RESP2 flat array or RESP3 map) as pairs; None for nil.
pub fn parse_info(reply: Value) -> Option<Info> {
    let pairs: Vec<(Value, Value)> = match reply {
        Value::Map(pairs) => pairs,
        Value::Array(items) => {
            let mut it = items.into_iter();
            let mut out = Vec::new();
            while let (Some(k), Some(v)) = (it.next(), it.next()) {
                out.push((k, v));
            }
            out
        }
        _ => return None,
    };
    Some(
        pairs
            .into_iter()
            .filter_map(|(k, v)| redis::from_redis_value::<String>(&k).ok().map(|k| (k, v)))
            .collect(),
    )
}

/// The value of `field` in an INFO reply.
pub fn info_field<'a>(info: &'a Info, field: &str) -> Option<&'a Value> {
    info.iter().find(|(k, _)| k == field).map(|(_, v)| v)
}

/// A read-write lock (`RWLOCK.*`): two views sharing one owner.
#[derive(Clone, Debug)]
pub struct ReadWriteLock {
    read: Lock,
    write: Lock,
}

impl ReadWriteLock {
    pub fn new(client: &Client, key: impl Into<String>) -> ReadWriteLock {
        let key = key.into();
        let owner = random_owner();
        ReadWriteLock {
            read: Lock::of(client, key.clone(), Family::Read).owner(owner.clone()),
            write: Lock::of(client, key, Family::Write).owner(owner),
        }
    }

    /// Both views under this owner string.
    pub fn owner(self, owner: impl Into<String>) -> ReadWriteLock {
        let owner = owner.into();
        ReadWriteLock {
            read: self.read.owner(owner.clone()),
            write: self.write.owner(owner),
        }
    }

    /// Both views with this lease.
    pub fn lease(self, lease: Duration) -> ReadWriteLock {
        ReadWriteLock {
            read: self.read.lease(lease),
            write: self.write.lease(lease),
        }
    }

    /// The READ view: shared with other readers.
    pub fn read(&self) -> &Lock {
        &self.read
    }

    /// The WRITE view: exclusive. Asking for it while holding only READ is
    /// refused by the server (an upgrade would deadlock).
    pub fn write(&self) -> &Lock {
        &self.write
    }
}

/// The renewal thread of one guard.
struct Renewer {
    stop: Sender<()>,
    thread: JoinHandle<()>,
}

impl Renewer {
    fn start(lock: Lock, lost: Arc<AtomicBool>) -> Option<Renewer> {
        let (stop, stopped) = mpsc::channel::<()>();
        let interval = (lock.lease / 3).max(Duration::from_millis(1));
        let thread = std::thread::Builder::new()
            .name(format!("rlock-renew:{}", lock.key))
            .spawn(move || {
                let mut conn: Option<Connection> = None;
                let mut connector = Connector::new(lock.client.clone(), interval);
                let mut last_ok = Instant::now();
                // A message or a dropped sender both mean "stop".
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    let renewed = renew_once(&lock, &mut conn, &mut connector);
                    let why = match renewed {
                        Ok(()) => {
                            last_ok = Instant::now();
                            continue;
                        }
                        Err(Error::Lost(why)) => why,
                        Err(Error::Redis(e)) => {
                            conn = None; // reconnect on the next tick
                            if last_ok.elapsed() < lock.lease {
                                continue;
                            }
                            format!("no renewal reached the server for a whole lease ({e})")
                        }
                    };
                    lost.store(true, Ordering::SeqCst);
                    if let Some(f) = &lock.on_lost {
                        f(&why);
                    }
                    return;
                }
            })
            .ok()?;
        Some(Renewer { stop, thread })
    }

    fn stop(self) {
        let _ = self.stop.send(());
        let _ = self.thread.join();
    }
}

/// Opens connections whose whole set-up is bounded by a timeout.
///
/// `redis` bounds the TCP connect, but then reads the replies of its
/// connection set-up (`CLIENT SETINFO`, `AUTH`, `SELECT`) with no read
/// timeout: against a frozen server (SIGSTOP, a stalled VM) that never returns.
/// So the connect runs on a helper thread; if it has not finished within the
/// timeout the caller goes on without a connection, and the pending attempt
/// is picked up by the next call (at most one pending attempt per connector).
pub(crate) struct Connector {
    client: Client,
    timeout: Duration,
    pending: Option<mpsc::Receiver<redis::RedisResult<Connection>>>,
}

impl Connector {
    pub(crate) fn new(client: Client, timeout: Duration) -> Connector {
        Connector {
            client,
            timeout,
            pending: None,
        }
    }

    /// A connection with read and write timeouts set, or `Err` (timed out,
    /// refused...).
    pub(crate) fn connect(&mut self) -> redis::RedisResult<Connection> {
        let rx = match self.pending.take() {
            Some(rx) => rx,
            None => {
                let (tx, rx) = mpsc::channel();
                let (client, t) = (self.client.clone(), self.timeout);
                std::thread::Builder::new()
                    .name("rlock-connect".into())
                    .spawn(move || {
                        let c = client.get_connection_with_timeout(t).and_then(|c| {
                            c.set_read_timeout(Some(t))?;
                            c.set_write_timeout(Some(t))?;
                            Ok(c)
                        });
                        let _ = tx.send(c);
                    })?;
                rx
            }
        };
        match rx.recv_timeout(self.timeout) {
            Ok(c) => c,
            Err(RecvTimeoutError::Timeout) => {
                self.pending = Some(rx);
                Err(timed_out())
            }
            Err(RecvTimeoutError::Disconnected) => Err(timed_out()),
        }
    }
}

fn timed_out() -> redis::RedisError {
    std::io::Error::new(std::io::ErrorKind::TimedOut, "connection set-up timed out").into()
}

/// One RENEW on the renewal connection, opened with timeouts of at most
/// lease/3 so that a dead server is noticed while the lease may still run.
fn renew_once(lock: &Lock, conn: &mut Option<Connection>, connector: &mut Connector) -> Result<()> {
    if conn.is_none() {
        *conn = Some(connector.connect()?);
    }
    let c = conn.as_mut().expect("just connected");
    let _: i64 = lock.renew_cmd().query(c)?;
    Ok(())
}

/// One hold of a lock. Renewed in the background while it lives; dropping it
/// stops the renewal and releases the hold.
pub struct LockGuard {
    lock: Lock,
    conn: Connection,
    token: i64,
    lost: Arc<AtomicBool>,
    renewer: Option<Renewer>,
    released: bool,
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("lock", &self.lock)
            .field("token", &self.token)
            .field("lost", &self.is_lost())
            .finish()
    }
}

impl LockGuard {
    /// The fencing token of this tenure: pass it to the protected resource.
    pub fn token(&self) -> i64 {
        self.token
    }

    pub fn lock(&self) -> &Lock {
        &self.lock
    }

    /// True once the lock was found lost (NOTOWNER, or no renewal got through
    /// for a whole lease): stop working on the protected resource.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// `Err(Error::Lost)` once the lock was found lost.
    pub fn check(&self) -> Result<()> {
        if self.is_lost() {
            return Err(Error::Lost(format!(
                "{} {}",
                self.lock.family.prefix(),
                self.lock.key
            )));
        }
        Ok(())
    }

    /// Whether the renewal thread is running.
    pub fn is_renewing(&self) -> bool {
        self.renewer
            .as_ref()
            .is_some_and(|r| !r.thread.is_finished())
    }

    /// Renews the lease now (the renewal thread does this every lease/3).
    pub fn renew(&mut self) -> Result<()> {
        let r: redis::RedisResult<i64> = self.lock.renew_cmd().query(&mut self.conn);
        match r {
            Ok(_) => Ok(()),
            Err(e) => {
                let e = Error::from(e);
                if matches!(e, Error::Lost(_)) {
                    self.lost.store(true, Ordering::SeqCst);
                }
                Err(e)
            }
        }
    }

    /// Releases the hold; returns the owner's remaining holds (0: free).
    /// `Err(Error::Lost)` when the server says the owner held nothing.
    pub fn release(mut self) -> Result<i64> {
        self.release_now()
    }

    fn release_now(&mut self) -> Result<i64> {
        // Stop (and join) the renewer first: no RENEW can follow the RELEASE.
        if let Some(r) = self.renewer.take() {
            r.stop();
        }
        self.released = true;
        let mut c = self.lock.family.command("RELEASE");
        c.arg(&self.lock.key);
        if let Some(mode) = self.lock.family.mode() {
            c.arg(mode);
        }
        let r: redis::RedisResult<i64> = c.arg(&self.lock.owner).query(&mut self.conn);
        r.map_err(|e| {
            let e = Error::from(e);
            if matches!(e, Error::Lost(_)) {
                self.lost.store(true, Ordering::SeqCst);
            }
            e
        })
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            // Nothing to report to from Drop: a lost lock or a dead connection
            // both mean the lease ends on the server anyway.
            let _ = self.release_now();
        }
    }
}
