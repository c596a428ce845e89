//! A client helper for the rlock module on the synchronous `redis` crate, and a
//! short demonstration.
//!
//! ```text
//! cargo run --release --example rust_client -- <port>
//! ```
//!
//! - [`Lock::acquire`] sends `RLOCK.ACQUIRE key owner PX lease [BLOCK ms]`: the
//!   wait happens on the server, which hands the lock over when it is freed.
//! - The returned [`LockGuard`] holds one hold of the lock. A thread renews its
//!   lease every lease/3 (`RLOCK.RENEW`) while it lives; dropping the guard
//!   stops that thread and releases the hold.
//! - [`LockGuard::token`] is the fencing token of the tenure.
//! - [`Lock::acquire_via_pubsub`] is for callers that must not park a
//!   connection on the server: it subscribes to `__rlock@<db>__:<key>` and
//!   retries the non-blocking acquire on each `released`/`expired`/`forced`.
//!
//! The same type drives FAIRLOCK ([`Kind::Fair`]) and RWLOCK
//! ([`Kind::ReadWrite`] with [`Lock::mode`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use redis::{Client, Connection, RedisResult};

/// The lock family: the command prefix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Reentrant,
    Fair,
    ReadWrite,
}

impl Kind {
    fn prefix(self) -> &'static str {
        match self {
            Kind::Reentrant => "RLOCK",
            Kind::Fair => "FAIRLOCK",
            Kind::ReadWrite => "RWLOCK",
        }
    }
}

/// RWLOCK access mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
}

impl Mode {
    fn word(self) -> &'static str {
        match self {
            Mode::Read => "READ",
            Mode::Write => "WRITE",
        }
    }
}

/// The channel the module publishes on when a hold of `key` ends.
pub fn unlock_channel(db: i64, key: &str) -> String {
    format!("__rlock@{db}__:{key}")
}

/// A lock on one key for one owner. Cheap to clone; each acquisition returns
/// a [`LockGuard`]. Acquiring again while holding adds a hold (same token).
#[derive(Clone, Debug)]
pub struct Lock {
    client: Client,
    key: String,
    owner: String,
    lease: Duration,
    kind: Kind,
    mode: Option<Mode>,
}

impl Lock {
    /// A reentrant lock with the module's usual 30 s lease.
    pub fn new(client: &Client, key: impl Into<String>, owner: impl Into<String>) -> Lock {
        Lock {
            client: client.clone(),
            key: key.into(),
            owner: owner.into(),
            lease: Duration::from_secs(30),
            kind: Kind::Reentrant,
            mode: None,
        }
    }

    pub fn lease(mut self, lease: Duration) -> Lock {
        self.lease = lease.max(Duration::from_millis(1));
        self
    }

    pub fn kind(mut self, kind: Kind) -> Lock {
        self.kind = kind;
        if kind == Kind::ReadWrite && self.mode.is_none() {
            self.mode = Some(Mode::Write);
        }
        self
    }

    /// RWLOCK only: the access mode (WRITE unless set).
    pub fn mode(mut self, mode: Mode) -> Lock {
        self.kind = Kind::ReadWrite;
        self.mode = Some(mode);
        self
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    fn command(&self, verb: &str) -> redis::Cmd {
        redis::cmd(&format!("{}.{verb}", self.kind.prefix()))
    }

    fn acquire_cmd(&self, block: Option<Duration>) -> redis::Cmd {
        let mut c = self.command("ACQUIRE");
        c.arg(&self.key);
        if let Some(mode) = self.mode {
            c.arg(mode.word());
        }
        c.arg(&self.owner).arg("PX").arg(millis(self.lease));
        if let Some(block) = block {
            c.arg("BLOCK").arg(millis(block));
        }
        c
    }

    /// One try: `Ok(None)` when the lock is busy.
    pub fn try_acquire(&self) -> RedisResult<Option<LockGuard>> {
        let mut conn = self.client.get_connection()?;
        let token: Option<i64> = self.acquire_cmd(None).query(&mut conn)?;
        Ok(token.map(|t| self.guard(conn, t)))
    }

    /// Waits on the server until granted, or until `timeout` (None: forever).
    /// `Ok(None)` when the time ran out.
    pub fn acquire(&self, timeout: Option<Duration>) -> RedisResult<Option<LockGuard>> {
        let mut conn = self.client.get_connection()?;
        // BLOCK 0 waits forever; a timeout rounds up to at least 1 ms.
        let block = timeout.map_or(Duration::ZERO, |t| t.max(Duration::from_millis(1)));
        let token: Option<i64> = self.acquire_cmd(Some(block)).query(&mut conn)?;
        Ok(token.map(|t| self.guard(conn, t)))
    }

    /// Acquires without parking a connection on the server: subscribes to the
    /// unlock channel first (so no release is missed), then retries the
    /// non-blocking acquire on each end-of-hold message. `safety_poll` bounds
    /// each wait for a message (a lock key removed by DEL publishes nothing).
    pub fn acquire_via_pubsub(
        &self,
        timeout: Option<Duration>,
        safety_poll: Duration,
    ) -> RedisResult<Option<LockGuard>> {
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
            let wait_until = match deadline {
                Some(d) if d <= Instant::now() => return Ok(None),
                Some(d) => d.min(Instant::now() + safety_poll),
                None => Instant::now() + safety_poll,
            };
            // Wait for an end-of-hold message (other payloads: keep waiting).
            loop {
                let left = wait_until.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    break;
                }
                sub.set_read_timeout(Some(left))?;
                match sub.get_message() {
                    Ok(msg) => {
                        let word = msg.get_payload_bytes();
                        if [&b"released"[..], b"expired", b"forced"].contains(&word) {
                            break;
                        }
                    }
                    Err(e) if e.is_timeout() => break,
                    Err(e) => return Err(e),
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

    /// `*.INFO` as field/value pairs (None when nobody holds the lock).
    pub fn info(&self) -> RedisResult<Option<Vec<(String, redis::Value)>>> {
        let mut conn = self.client.get_connection()?;
        let reply: redis::Value = self.command("INFO").arg(&self.key).query(&mut conn)?;
        Ok(match reply {
            redis::Value::Nil => None,
            redis::Value::Map(pairs) => Some(
                pairs
                    .into_iter()
                    .filter_map(|(k, v)| redis::from_redis_value(&k).ok().map(|k| (k, v)))
                    .collect(),
            ),
            redis::Value::Array(items) => Some(
                items
                    .chunks(2)
                    .filter_map(|kv| match kv {
                        [k, v] => redis::from_redis_value(k).ok().map(|k| (k, v.clone())),
                        _ => None,
                    })
                    .collect(),
            ),
            _ => None,
        })
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

fn is_notowner(e: &redis::RedisError) -> bool {
    e.code() == Some("NOTOWNER")
}

/// The renewal thread of one guard: renews every lease/3 until told to stop.
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
                let mut conn = None;
                // A message or a dropped sender both mean "stop".
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    if conn.is_none() {
                        conn = lock.client.get_connection().ok();
                    }
                    let Some(c) = conn.as_mut() else { continue };
                    let renewed: RedisResult<i64> = lock
                        .command("RENEW")
                        .arg(&lock.key)
                        .arg(&lock.owner)
                        .arg("PX")
                        .arg(millis(lock.lease))
                        .query(c);
                    match renewed {
                        Ok(_) => {}
                        Err(e) if is_notowner(&e) => {
                            lost.store(true, Ordering::SeqCst);
                            return;
                        }
                        // Connection trouble: reconnect on the next tick.
                        Err(_) => conn = None,
                    }
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

impl LockGuard {
    /// The fencing token of this tenure: pass it to the protected resource.
    pub fn token(&self) -> i64 {
        self.token
    }

    /// True once the server said the owner no longer holds the lock (lease
    /// ran out, or FORCERELEASE): stop working on the protected resource.
    pub fn is_lost(&self) -> bool {
        self.lost.load(Ordering::SeqCst)
    }

    /// Whether the renewal thread is running.
    pub fn is_renewing(&self) -> bool {
        self.renewer
            .as_ref()
            .is_some_and(|r| !r.thread.is_finished())
    }

    /// Renews the lease now (the renewal thread does this on its own).
    pub fn renew(&mut self) -> RedisResult<()> {
        let r: RedisResult<i64> = self
            .lock
            .command("RENEW")
            .arg(&self.lock.key)
            .arg(&self.lock.owner)
            .arg("PX")
            .arg(millis(self.lock.lease))
            .query(&mut self.conn);
        if matches!(&r, Err(e) if is_notowner(e)) {
            self.lost.store(true, Ordering::SeqCst);
        }
        r.map(|_| ())
    }

    /// Releases the hold and returns the owner's remaining holds (0: free).
    /// `NOTOWNER` comes back as an error when the lock was already lost.
    pub fn release(mut self) -> RedisResult<i64> {
        self.release_now()
    }

    fn release_now(&mut self) -> RedisResult<i64> {
        if let Some(r) = self.renewer.take() {
            r.stop();
        }
        self.released = true;
        let mut c = self.lock.command("RELEASE");
        c.arg(&self.lock.key);
        if let Some(mode) = self.lock.mode {
            c.arg(mode.word());
        }
        c.arg(&self.lock.owner).query(&mut self.conn)
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

/// What `main` shows: a guarded critical section, renewal, contention between
/// two threads served by the server in turn, and the pub/sub path.
pub fn demo(port: u16) -> RedisResult<Vec<String>> {
    let client = Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut log = Vec::new();

    // 1. A guard: acquired, renewed past its 300 ms lease, released on drop.
    {
        let lock = Lock::new(&client, "demo:job", "demo-main").lease(Duration::from_millis(300));
        let guard = lock.acquire(None)?.expect("BLOCK 0 waits until granted");
        log.push(format!("acquired demo:job, token {}", guard.token()));
        std::thread::sleep(Duration::from_millis(700));
        let alive = lock.info()?.is_some();
        log.push(format!(
            "still held after 700 ms with a 300 ms lease: {alive}"
        ));
    }
    let mut conn = client.get_connection()?;
    let exists: bool = redis::cmd("EXISTS").arg("demo:job").query(&mut conn)?;
    log.push(format!("released on drop: {}", !exists));

    // 2. Two threads, two owners, one lock: the server hands it over in turn.
    let workers: Vec<_> = ["worker-a", "worker-b"]
        .into_iter()
        .map(|owner| {
            let lock = Lock::new(&client, "demo:shared", owner);
            std::thread::spawn(move || -> RedisResult<(String, i64)> {
                let guard = lock
                    .acquire(Some(Duration::from_secs(5)))?
                    .expect("granted within 5 s");
                std::thread::sleep(Duration::from_millis(100));
                Ok((lock.owner().to_string(), guard.token()))
            })
        })
        .collect();
    for w in workers {
        let (owner, token) = w.join().expect("worker thread")?;
        log.push(format!("{owner} held demo:shared with token {token}"));
    }

    // 3. The pub/sub path: wait for a release without a parked connection.
    let holder = Lock::new(&client, "demo:ps", "holder")
        .acquire(None)?
        .expect("free");
    let waiter = Lock::new(&client, "demo:ps", "subscriber");
    let handle = std::thread::spawn(move || {
        waiter
            .acquire_via_pubsub(Some(Duration::from_secs(5)), Duration::from_secs(1))
            .map(|g| g.map(|g| g.token()))
    });
    std::thread::sleep(Duration::from_millis(100));
    drop(holder);
    let token = handle.join().expect("pub/sub thread")?;
    log.push(format!(
        "pub/sub waiter acquired after release: {}",
        token.is_some()
    ));
    Ok(log)
}

#[allow(dead_code)] // the entry point of the example, not of the tests that include this file
fn main() {
    let port = std::env::args()
        .nth(1)
        .and_then(|p| p.parse::<u16>().ok())
        .unwrap_or(6379);
    match demo(port) {
        Ok(lines) => lines.iter().for_each(|l| println!("{l}")),
        Err(e) => {
            eprintln!("rust_client: {e}");
            std::process::exit(1);
        }
    }
}
