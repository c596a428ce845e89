//! Client library for the rlock Redis module (`RLOCK.*`, `FAIRLOCK.*`,
//! `RWLOCK.*`, `SEMAPHORE.*`) on the synchronous [`redis`] crate, plus
//! [`RedLock`] over independent servers.
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
//! - [`Lock::keepalive`]: `KEEPALIVE` — the server renews the lease while the
//!   connection that was granted the lock stays open, and releases it when
//!   that connection closes; no renewal thread runs.
//! - [`MultiLock`]: several RLOCK keys, all or nothing (`RLOCK.ACQUIREALL`).
//! - [`Lock::semaphore`] (`SEMAPHORE.*`): at most `limit` permits held at
//!   once, a lease and a token per holding.
//! - [`Error::Deadlock`]: a parked wait that closed a wait-for cycle.
//! - A wait the server does not answer within its timeout plus the
//!   [`Lock::wait_margin`] (default 2 s, also the bound on opening its
//!   connection) returns `Err(Error::Redis(e))` with [`Error::is_timeout`]
//!   true, and that connection is closed; `acquire(None)` (`BLOCK 0`) waits
//!   without a limit once connected.
//! - [`RedLock`]: quorum over independent servers; its per-server tokens are
//!   not one fencing token.

mod multi;
mod redlock;

pub use multi::{MultiLock, MultiLockGuard};
pub use redlock::{RedLock, RedLockGuard};

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redis::{Client, Connection, ConnectionLike, FromRedisValue, Value};

/// The module's default lease.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// How much longer than its own timeout an acquisition gives the server to
/// answer, and how long opening its connection may take (see
/// [`Lock::wait_margin`]).
pub const DEFAULT_WAIT_MARGIN: Duration = Duration::from_secs(2);

/// What can go wrong.
#[derive(Debug)]
pub enum Error {
    /// The server or the connection said so.
    Redis(redis::RedisError),
    /// The server no longer knows this owner as a holder (`NOTOWNER`): the
    /// lease ran out or the lock was forced free.
    Lost(String),
    /// The server answered a parked wait with `DEADLOCK`: this waiter lies on
    /// a cycle of the wait-for graph and was the latest on it to start
    /// waiting, so it left the queue holding nothing new. Give up what this
    /// owner holds (that breaks the cycle) and retry.
    Deadlock {
        /// The owners on the cycle, starting and ending with this one.
        cycle: Vec<String>,
    },
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::Redis(e) => write!(f, "{e}"),
            Error::Lost(why) => write!(f, "lock lost: {why}"),
            Error::Deadlock { cycle } => {
                write!(f, "deadlock: wait-for cycle: {}", cycle.join(" -> "))
            }
        }
    }
}

impl Error {
    /// Whether the server did not answer in time: an acquisition's reply did
    /// not come within its timeout plus the wait margin, or its connection's
    /// set-up took longer than the margin (an `Error::Redis` whose
    /// [`redis::RedisError::is_timeout`] is true). The connection was closed;
    /// whether the server granted the lock is unknown (see
    /// [`Lock::acquire`]).
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Redis(e) if e.is_timeout())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Redis(e) => Some(e),
            Error::Lost(_) | Error::Deadlock { .. } => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Error {
        match e.code() {
            Some("NOTOWNER") => Error::Lost(e.to_string()),
            Some("DEADLOCK") => {
                // "DEADLOCK wait-for cycle: a -> b -> a"
                let detail = e.detail().unwrap_or_default();
                let owners = detail.split_once("cycle:").map_or("", |(_, o)| o);
                let cycle = owners
                    .split(" -> ")
                    .map(|o| o.trim().to_string())
                    .filter(|o| !o.is_empty())
                    .collect();
                Error::Deadlock { cycle }
            }
            _ => Error::Redis(e),
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

/// The lock family (command prefix) and, for RWLOCK, the mode; for a
/// semaphore, its limit and the permits one acquisition takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Reentrant,
    Fair,
    Read,
    Write,
    Semaphore { limit: u32, permits: u32 },
}

impl Family {
    fn prefix(self) -> &'static str {
        match self {
            Family::Reentrant => "RLOCK",
            Family::Fair => "FAIRLOCK",
            Family::Read | Family::Write => "RWLOCK",
            Family::Semaphore { .. } => "SEMAPHORE",
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
    wait_margin: Duration,
    /// Some: KEEPALIVE, through this connection (shared by the clones).
    pin: Option<Arc<Pin>>,
}

impl fmt::Debug for Lock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lock")
            .field("key", &self.key)
            .field("owner", &self.owner)
            .field("lease", &self.lease)
            .field("family", &self.family)
            .field("keepalive", &self.pin.is_some())
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

    /// A semaphore (`SEMAPHORE.*`): at most `limit` permits held at once on
    /// the key, `permits` of them taken by each acquisition of this owner
    /// (one holding with one token and lease; a second guard adds `permits`
    /// under the same token). The latest acquisition's `limit` is in force.
    /// Waiters are served in arrival order, a large request before smaller
    /// ones behind it. `release` returns the owner's remaining permits. The
    /// server refuses `limit` or `permits` of 0, or `permits > limit`
    /// (`Error::Redis`).
    pub fn semaphore(client: &Client, key: impl Into<String>, limit: u32, permits: u32) -> Lock {
        Lock::of(client, key, Family::Semaphore { limit, permits })
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
            wait_margin: DEFAULT_WAIT_MARGIN,
            pin: None,
        }
    }

    /// Holds under this owner string (default: random).
    pub fn owner(mut self, owner: impl Into<String>) -> Lock {
        self.owner = owner.into();
        if self.pin.is_some() {
            self.pin = Some(Pin::new(&self.client)); // another holder, another connection
        }
        self
    }

    /// `KEEPALIVE`: the server renews the lease while the connection that was
    /// granted the lock stays open and releases the lock when it closes, so
    /// the guards run no renewal thread.
    ///
    /// The lock (and its clones: the same owner) then sends its acquisitions
    /// through one connection of its own, one at a time, opened for the first
    /// acquisition and closed when its last guard is released (a second guard
    /// of the same owner shares it: the binding belongs to the owner's tenure,
    /// and closing the connection ends all of it). Releases and renewals go
    /// through a second connection of the lock (the server keeps the binding
    /// whatever connection the owner's RELEASE or RENEW comes on), so they
    /// never wait behind a clone's parked acquisition. Do not mix keepalive and
    /// plain locks of one owner on one key. Loss shows at `release`/`renew`
    /// (`Error::Lost`); no thread watches for it. A guard granted before the
    /// pinned connection failed (or a clone's wait on it was abandoned: both
    /// end every holding bound to it) gets `Error::Lost` there without
    /// anything being sent, so it cannot release a new tenure a clone
    /// acquired since. Use it where a connection may
    /// be dedicated to the holder; keep the renewal thread otherwise.
    pub fn keepalive(mut self, on: bool) -> Lock {
        self.pin = on.then(|| Pin::new(&self.client));
        self
    }

    pub fn is_keepalive(&self) -> bool {
        self.pin.is_some()
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

    /// How much longer than its timeout an acquisition waits for the
    /// server's answer before it gives up (default [`DEFAULT_WAIT_MARGIN`],
    /// at least 1 ms); also the bound on opening its connection. See
    /// [`Lock::acquire`].
    pub fn wait_margin(mut self, margin: Duration) -> Lock {
        self.wait_margin = margin.max(Duration::from_millis(1));
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
        if let Family::Semaphore { limit, permits } = self.family {
            c.arg("LIMIT").arg(limit).arg("PERMITS").arg(permits);
        }
        if let Some(block) = block {
            c.arg("BLOCK").arg(millis(block));
        }
        if self.pin.is_some() {
            c.arg("KEEPALIVE");
        }
        c
    }

    /// One try: `Ok(None)` when the lock is busy.
    pub fn try_acquire(&self) -> Result<Option<LockGuard>> {
        self.acquire_with(None)
    }

    /// Waits on the server (`BLOCK`) until granted, or until `timeout` (None:
    /// no limit); `Ok(None)` when the time ran out. `Err(Error::Deadlock)`
    /// when the server found this wait on a wait-for cycle.
    ///
    /// The wait occupies one connection, opened within the wait margin, and
    /// gives the server `timeout` + the margin to answer (`None`: no limit
    /// once connected). Past that — a frozen, overloaded or cut-off server —
    /// it returns `Err(Error::Redis(e))` with [`Error::is_timeout`] true and
    /// closes the connection (a late answer must not reach a later command).
    /// A grant the server made before it saw the close stays until its lease
    /// ends (with keepalive: until the server sees the close); no release is
    /// sent for it, since the owner may already hold the lock. The same holds
    /// for [`Lock::try_acquire`], bounded by the margin alone.
    pub fn acquire(&self, timeout: Option<Duration>) -> Result<Option<LockGuard>> {
        self.acquire_with(Some(block_arg(timeout)))
    }

    fn acquire_with(&self, block: Option<Duration>) -> Result<Option<LockGuard>> {
        let granted = grant::<i64>(
            &self.client,
            self.pin.as_ref(),
            &self.acquire_cmd(block),
            block,
            self.wait_margin,
        )?;
        Ok(granted.map(|(token, channel)| self.guard(channel, token)))
    }

    /// Acquires without parking a connection on the server: subscribes to the
    /// unlock channel first (so no release is missed), tries without BLOCK,
    /// and tries again on each end-of-hold message and when the holder's lease
    /// (`PTTL`) runs out, since a lease that ends with nobody parked may be
    /// announced only when Redis expires the key. `safety_poll` bounds each
    /// wait (a flush publishes nothing). Holds no place in a FAIRLOCK queue.
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
            let cmd = self.acquire_cmd(None);
            let token: Option<(i64, u64)> = match &self.pin {
                Some(pin) => pin.acquire(&cmd, None, self.wait_margin)?,
                None => cmd.query::<Option<i64>>(&mut conn)?.map(|t| (t, 0)),
            };
            if let Some((token, generation)) = token {
                let channel = match &self.pin {
                    Some(pin) => Channel::Pinned(pin.clone(), generation),
                    None => Channel::Own(conn),
                };
                return Ok(Some(self.guard(channel, token)));
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

    fn guard(&self, channel: Channel, token: i64) -> LockGuard {
        let renew = RenewSpec {
            client: self.client.clone(),
            cmd: self.renew_cmd(),
            lease: self.lease,
            name: self.key.clone(),
            on_lost: self.on_lost.clone(),
        };
        LockGuard {
            lock: self.clone(),
            token,
            held: Held::new(channel, renew),
        }
    }

    fn release_cmd(&self) -> redis::Cmd {
        let mut c = self.family.command("RELEASE");
        c.arg(&self.key);
        if let Some(mode) = self.family.mode() {
            c.arg(mode);
        }
        c.arg(&self.owner);
        if let Family::Semaphore { permits, .. } = self.family {
            c.arg("PERMITS").arg(permits);
        }
        c
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
        let keepalive = self.read.pin.is_some();
        ReadWriteLock {
            read: self.read.owner(owner.clone()),
            write: self.write.owner(owner),
        }
        .keepalive(keepalive)
    }

    /// Both views with `KEEPALIVE` (see [`Lock::keepalive`]), through one
    /// connection: the owner's tenure has one binding, and closing the
    /// connection when one view is released would end the other's holding.
    pub fn keepalive(mut self, on: bool) -> ReadWriteLock {
        let pin = on.then(|| Pin::new(&self.read.client));
        self.read.pin = pin.clone();
        self.write.pin = pin;
        self
    }

    /// Both views with this lease.
    pub fn lease(self, lease: Duration) -> ReadWriteLock {
        ReadWriteLock {
            read: self.read.lease(lease),
            write: self.write.lease(lease),
        }
    }

    /// Both views with this wait margin (see [`Lock::wait_margin`]).
    pub fn wait_margin(self, margin: Duration) -> ReadWriteLock {
        ReadWriteLock {
            read: self.read.wait_margin(margin),
            write: self.write.wait_margin(margin),
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

/// What a guard's renewal thread sends, and to whom it reports.
pub(crate) struct RenewSpec {
    pub(crate) client: Client,
    pub(crate) cmd: redis::Cmd,
    pub(crate) lease: Duration,
    pub(crate) name: String,
    pub(crate) on_lost: Option<LostCallback>,
}

/// The renewal thread of one guard.
struct Renewer {
    stop: Sender<()>,
    thread: JoinHandle<()>,
}

impl Renewer {
    fn start(spec: RenewSpec, lost: Arc<AtomicBool>) -> Option<Renewer> {
        let (stop, stopped) = mpsc::channel::<()>();
        let interval = (spec.lease / 3).max(Duration::from_millis(1));
        let thread = std::thread::Builder::new()
            .name(format!("rlock-renew:{}", spec.name))
            .spawn(move || {
                let mut conn: Option<Connection> = None;
                let mut connector = Connector::new(spec.client.clone(), interval);
                let mut last_ok = Instant::now();
                // A message or a dropped sender both mean "stop".
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    let renewed = renew_once(&spec.cmd, &mut conn, &mut connector);
                    let why = match renewed {
                        Ok(()) => {
                            last_ok = Instant::now();
                            continue;
                        }
                        Err(Error::Lost(why)) => why,
                        Err(e) => {
                            conn = None; // reconnect on the next tick
                            if last_ok.elapsed() < spec.lease {
                                continue;
                            }
                            format!("no renewal reached the server for a whole lease ({e})")
                        }
                    };
                    lost.store(true, Ordering::SeqCst);
                    if let Some(f) = &spec.on_lost {
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
fn renew_once(
    cmd: &redis::Cmd,
    conn: &mut Option<Connection>,
    connector: &mut Connector,
) -> Result<()> {
    if conn.is_none() {
        *conn = Some(connector.connect()?);
    }
    let c = conn.as_mut().expect("just connected");
    let _: i64 = cmd.query(c)?;
    Ok(())
}

/// The BLOCK argument for a wait of `timeout`: 0 waits forever, and a
/// timeout rounds up to at least 1 ms.
pub(crate) fn block_arg(timeout: Option<Duration>) -> Duration {
    timeout.map_or(Duration::ZERO, |t| t.max(Duration::from_millis(1)))
}

/// When an acquisition sent now with this `BLOCK` gives up waiting for its
/// answer: BLOCK + `margin` (no BLOCK: `margin`); never for `BLOCK 0`.
pub(crate) fn wait_deadline(block: Option<Duration>, margin: Duration) -> Option<Instant> {
    match block {
        Some(b) if b.is_zero() => None,
        b => Some(Instant::now() + b.unwrap_or_default() + margin),
    }
}

/// Opens a connection for an acquisition, its set-up bounded by `margin`.
fn connect_for_wait(client: &Client, margin: Duration) -> redis::RedisResult<Connection> {
    Connector::new(client.clone(), margin).connect()
}

/// Sends `cmd` on `conn` and reads its answer by `deadline` (None: no
/// limit). On a timeout the error says so (`is_timeout()`); the caller must
/// drop the connection on any error but a server's answer (`is_broken`).
fn exchange<T: FromRedisValue>(
    conn: &mut Connection,
    cmd: &redis::Cmd,
    deadline: Option<Instant>,
) -> redis::RedisResult<T> {
    let read_timeout = deadline.map(|d| {
        d.saturating_duration_since(Instant::now())
            .max(Duration::from_millis(1))
    });
    conn.set_read_timeout(read_timeout)?;
    cmd.query(conn).map_err(|e| {
        if e.is_timeout() {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!(
                    "the server did not answer within the wait's timeout + margin ({e}); \
                     the connection was closed"
                ),
            )
            .into()
        } else {
            e
        }
    })
}

/// The connection `KEEPALIVE` holdings are bound to, shared by the clones of
/// a lock (one owner) and by the two views of a keepalive [`ReadWriteLock`].
///
/// The server renews a keepalive holding while the connection that was
/// granted it is open and releases it when that connection closes. A
/// `KEEPALIVE` acquisition binds the connection it comes on, so every
/// acquisition of the lock goes through this one connection, one at a time:
/// it is opened (within the wait margin) for the first acquisition, kept
/// while any guard on it lives, and closed (dropped) once no acquisition is
/// under way and the last guard was released. A failed or abandoned
/// connection is dropped too: the server then ends every holding bound to
/// it. The pin's generation then goes up and its guard count restarts at
/// zero: a guard granted in an earlier generation is stale, and its renew or
/// release returns `Error::Lost` without sending anything (a clone may hold
/// a new tenure since, which a RELEASE of the owner would drop).
///
/// Releases and renewals do not need it (the server keeps the binding
/// whatever connection the owner's RELEASE or RENEW comes on): they go
/// through a second connection, `side`, so that they never wait behind an
/// acquisition parked on the pinned one.
pub(crate) struct Pin {
    client: Client,
    /// One acquisition at a time on the pinned connection.
    acquiring: Mutex<()>,
    state: Mutex<PinState>,
    side: Mutex<Option<Connection>>,
}

#[derive(Default)]
struct PinState {
    /// The pinned connection while no acquisition has it out.
    conn: Option<Connection>,
    /// Guards granted in the current generation and not released.
    guards: usize,
    /// Goes up each time the connection is dropped after a failure (which
    /// ended every holding bound to it).
    generation: u64,
    /// An acquisition has the connection out.
    busy: bool,
}

fn locked<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Pin {
    pub(crate) fn new(client: &Client) -> Arc<Pin> {
        Arc::new(Pin {
            client: client.clone(),
            acquiring: Mutex::new(()),
            state: Mutex::new(PinState::default()),
            side: Mutex::new(None),
        })
    }

    /// An acquisition through the pinned connection (opened within `margin`
    /// if needed), its answer awaited for `block` + `margin` from when it is
    /// sent (after any acquisition of a clone ahead of it on the connection):
    /// a grant adds a guard and comes with the generation it was granted in.
    /// The connection is closed when it failed or timed out (a new
    /// generation), or when no guard is left.
    pub(crate) fn acquire<T: FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
        block: Option<Duration>,
        margin: Duration,
    ) -> redis::RedisResult<Option<(T, u64)>> {
        let _one = locked(&self.acquiring);
        let deadline = wait_deadline(block, margin);
        let existing = {
            let mut st = locked(&self.state);
            st.busy = true;
            st.conn.take()
        };
        let opened = match existing {
            Some(c) => Ok(c),
            None => connect_for_wait(&self.client, margin),
        };
        let (conn, reply) = match opened {
            Ok(mut c) => {
                let r = exchange::<Option<T>>(&mut c, cmd, deadline);
                (Some(c), r)
            }
            Err(e) => (None, Err(e)),
        };
        let mut st = locked(&self.state);
        st.busy = false;
        let broken = match &reply {
            Err(e) => is_broken(e) || conn.as_ref().is_some_and(|c| !c.is_open()),
            Ok(_) => false,
        };
        if broken {
            // Dropped below (closed): the server ends every holding bound to
            // it, so the guards granted on it are stale.
            st.generation += 1;
            st.guards = 0;
        }
        if let Ok(Some(_)) = &reply {
            st.guards += 1;
        }
        if !broken && st.guards > 0 {
            st.conn = conn; // else dropped: closed
        }
        if st.guards == 0 {
            *locked(&self.side) = None;
        }
        let generation = st.generation;
        reply.map(|r| r.map(|t| (t, generation)))
    }

    /// Whether a guard granted in `generation` is stale: the connection it
    /// was granted on failed since.
    fn is_stale(&self, generation: u64) -> bool {
        locked(&self.state).generation != generation
    }

    /// `f` on the side connection (opened if needed; dropped when broken).
    fn side<R>(
        &self,
        f: impl FnOnce(&mut Connection) -> redis::RedisResult<R>,
    ) -> redis::RedisResult<R> {
        let mut side = locked(&self.side);
        if side.is_none() {
            *side = Some(self.client.get_connection()?);
        }
        let c = side.as_mut().expect("just opened");
        let r = f(c);
        if let Err(e) = &r {
            if is_broken(e) || !c.is_open() {
                *side = None;
            }
        }
        r
    }

    /// A guard's release, on the side connection; then, when no guard is
    /// left and no acquisition is under way, both connections are closed
    /// (after the RELEASE: closing first would end the holding under it).
    fn release<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let r = self.side(|c| cmd.query(c));
        let mut st = locked(&self.state);
        st.guards = st.guards.saturating_sub(1);
        if st.guards == 0 && !st.busy {
            st.conn = None;
            *locked(&self.side) = None;
        }
        r
    }
}

/// Whether an error means the connection is gone (not a server's answer).
fn is_broken(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_unrecoverable_error()
}

/// Sends an acquisition: through the pinned connection for a keepalive lock,
/// else through a new connection, which the guard then keeps. Its set-up is
/// bounded by `margin`, its answer awaited for `block` + `margin` (no limit
/// for `BLOCK 0`).
pub(crate) fn grant<T: FromRedisValue>(
    client: &Client,
    pin: Option<&Arc<Pin>>,
    cmd: &redis::Cmd,
    block: Option<Duration>,
    margin: Duration,
) -> Result<Option<(T, Channel)>> {
    Ok(match pin {
        Some(pin) => pin
            .acquire(cmd, block, margin)?
            .map(|(t, generation)| (t, Channel::Pinned(pin.clone(), generation))),
        None => {
            let deadline = wait_deadline(block, margin);
            // Dropped (closed) on any error: a late answer must reach nobody.
            let mut conn = connect_for_wait(client, margin)?;
            let reply: Option<T> = exchange(&mut conn, cmd, deadline)?;
            match reply {
                Some(t) => {
                    // The guard's connection (its release): no timeouts, as
                    // a connection of the client's own.
                    conn.set_read_timeout(None)?;
                    conn.set_write_timeout(None)?;
                    Some((t, Channel::Own(conn)))
                }
                None => None,
            }
        }
    })
}

/// Where a guard sends its commands.
pub(crate) enum Channel {
    /// The connection it was granted on.
    Own(Connection),
    /// The lock's keepalive connection, and the generation the hold was
    /// granted in.
    Pinned(Arc<Pin>, u64),
}

impl Channel {
    /// A keepalive hold whose pinned connection failed since it was granted.
    fn is_stale(&self) -> bool {
        matches!(self, Channel::Pinned(p, generation) if p.is_stale(*generation))
    }

    fn query<T: FromRedisValue>(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self {
            Channel::Own(c) => cmd.query(c),
            Channel::Pinned(p, _) => p.side(|c| cmd.query(c)),
        }
    }

    /// The release of this guard's hold (the last one closes a pinned connection).
    fn release<T: FromRedisValue>(&mut self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match self {
            Channel::Own(c) => cmd.query(c),
            Channel::Pinned(p, _) => p.release(cmd),
        }
    }
}

/// The state of one hold, shared by [`LockGuard`] and [`MultiLockGuard`]:
/// its channel, its renewal thread (none with keepalive) and its lost flag.
pub(crate) struct Held {
    channel: Channel,
    lost: Arc<AtomicBool>,
    renewer: Option<Renewer>,
    released: bool,
}

impl Held {
    pub(crate) fn new(channel: Channel, renew: RenewSpec) -> Held {
        let lost = Arc::new(AtomicBool::new(false));
        // With KEEPALIVE the server renews: no thread.
        let renewer = match channel {
            Channel::Pinned(..) => None,
            Channel::Own(_) => Renewer::start(renew, lost.clone()),
        };
        Held {
            channel,
            lost,
            renewer,
            released: false,
        }
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    pub(crate) fn is_renewing(&self) -> bool {
        self.renewer
            .as_ref()
            .is_some_and(|r| !r.thread.is_finished())
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released
    }

    fn lost_on<T>(&self, r: redis::RedisResult<T>) -> Result<T> {
        r.map_err(|e| {
            // A keepalive holding whose pinned connection failed shows here
            // as NOTOWNER: releases and renewals come on another connection.
            let e = Error::from(e);
            if matches!(e, Error::Lost(_)) {
                self.lost.store(true, Ordering::SeqCst);
            }
            e
        })
    }

    /// `Err(Error::Lost)` for a keepalive hold whose pinned connection
    /// failed since it was granted: the server ended it, and a clone may
    /// hold a new tenure of the same owner, which a RELEASE or RENEW sent
    /// now would act on. Nothing is sent then.
    fn check_stale(&self) -> Result<()> {
        if self.channel.is_stale() {
            self.lost.store(true, Ordering::SeqCst);
            return Err(Error::Lost(
                "the keepalive connection this hold was granted on failed \
                 (the server ended its holdings); nothing was sent"
                    .into(),
            ));
        }
        Ok(())
    }

    pub(crate) fn renew(&mut self, cmd: &redis::Cmd) -> Result<()> {
        self.check_stale()?;
        let r: redis::RedisResult<i64> = self.channel.query(cmd);
        self.lost_on(r).map(|_| ())
    }

    pub(crate) fn release<T: FromRedisValue>(&mut self, cmd: &redis::Cmd) -> Result<T> {
        // Stop (and join) the renewer first: no RENEW can follow the RELEASE.
        if let Some(r) = self.renewer.take() {
            r.stop();
        }
        self.released = true;
        // A stale guard is not counted by the pin any more (its generation
        // ended): nothing to give back either.
        self.check_stale()?;
        let r = self.channel.release(cmd);
        self.lost_on(r)
    }
}

/// One hold of a lock. Renewed while it lives (in the background, or by the
/// server for a keepalive lock); dropping it releases the hold.
pub struct LockGuard {
    lock: Lock,
    token: i64,
    held: Held,
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
        self.held.is_lost()
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

    /// Whether the renewal thread is running (never for a keepalive lock:
    /// the server renews).
    pub fn is_renewing(&self) -> bool {
        self.held.is_renewing()
    }

    /// Renews the lease now (the renewal thread does this every lease/3).
    pub fn renew(&mut self) -> Result<()> {
        self.held.renew(&self.lock.renew_cmd())
    }

    /// Releases the hold; returns the owner's remaining holds (0: free).
    /// `Err(Error::Lost)` when the server says the owner held nothing.
    pub fn release(mut self) -> Result<i64> {
        self.held.release(&self.lock.release_cmd())
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.held.is_released() {
            // Nothing to report to from Drop: a lost lock or a dead connection
            // both mean the lease ends on the server anyway.
            let _ = self.held.release::<i64>(&self.lock.release_cmd());
        }
    }
}
