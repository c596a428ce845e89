//! The lock implementations under test and how to call each one: the native
//! commands, the `SET NX PX` floor, and the Redisson-style Lua scripts of
//! `bench/lua/` (read from disk, loaded with SCRIPT LOAD, called with EVALSHA).

use std::collections::HashMap;
use std::path::Path;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::cmd;
use crate::q;
use crate::resp::{Conn, Value};

/// Redisson's unlock message (LockPubSub.UNLOCK_MESSAGE).
pub const UNLOCK_MESSAGE: &str = "0";

/// Redisson fair lock's thread wait time (ms), as in the seed articles.
pub const FAIR_THREAD_WAIT_MS: u64 = 300_000;

/// Permits of every semaphore in the benchmark (K = 64 clients share 8).
pub const SEMAPHORE_LIMIT: u64 = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    Reentrant,
    Fair,
    Write,
    Read,
    /// One permit of a semaphore of `SEMAPHORE_LIMIT`.
    Semaphore,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Impl {
    /// `SET key owner NX PX` + compare-and-delete Lua release.
    Floor,
    /// The floor again, on a server without the module loaded: whatever the
    /// module's presence costs other commands shows as a difference.
    PlainFloor,
    /// The module's commands.
    Native,
    /// Redisson's algorithm as Lua scripts.
    Lua,
}

pub const SCRIPT_NAMES: [&str; 11] = [
    "floor_release",
    "reentrant_acquire",
    "reentrant_release",
    "fair_acquire",
    "fair_release",
    "rw_read_acquire",
    "rw_read_release",
    "rw_write_acquire",
    "rw_write_release",
    "semaphore_acquire",
    "semaphore_release",
];

pub struct Scripts {
    pub source: HashMap<&'static str, String>,
    sha: OnceLock<HashMap<&'static str, String>>,
}

impl Scripts {
    pub fn read(dir: &Path) -> Scripts {
        let mut source = HashMap::new();
        for name in SCRIPT_NAMES {
            let path = dir.join(format!("{name}.lua"));
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            source.insert(name, text);
        }
        Scripts {
            source,
            sha: OnceLock::new(),
        }
    }

    /// SCRIPT LOADs every script on a server (the SHA is the same everywhere).
    pub fn load(&self, c: &mut Conn) {
        let mut loaded = HashMap::new();
        for name in SCRIPT_NAMES {
            let reply = cmd!(c; "SCRIPT", "LOAD", self.source[name]).expect("SCRIPT LOAD");
            let Value::Bulk(sha) = reply else {
                panic!("SCRIPT LOAD {name}.lua failed: {reply:?}");
            };
            loaded.insert(name, String::from_utf8(sha).expect("sha"));
        }
        assert_eq!(self.sha.get_or_init(|| loaded.clone()), &loaded);
    }

    pub fn sha(&self, name: &str) -> &str {
        self.sha
            .get()
            .and_then(|m| m.get(name))
            .unwrap_or_else(|| panic!("script {name} not loaded"))
    }
}

pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_millis() as u64
}

pub fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_micros() as i64
}

/// Redisson-style owner name: `<client uuid>:<thread id>`.
pub fn owner(client: u64, thread: u64) -> String {
    let mut x = client
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(0xD1B5_4A32_D192_ED03);
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (a, b, c) = (next(), next(), next());
    format!(
        "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}:{}",
        a as u32,
        (a >> 32) as u16,
        (b & 0xfff) as u16,
        ((b >> 16) & 0xfff) as u16,
        c & 0xffff_ffff_ffff,
        thread
    )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lock {
    pub imp: Impl,
    pub fam: Family,
    /// Run on a server with AOF on (`appendfsync no`), so that replicated
    /// effects are built and written out.
    pub aof: bool,
    /// Run on a master with a replica attached (a second redis-server with
    /// the module, synced before the measurement), so that effects are built
    /// and sent down the replication link.
    pub replica: bool,
}

impl Lock {
    pub const fn new(imp: Impl, fam: Family) -> Lock {
        Lock {
            imp,
            fam,
            aof: false,
            replica: false,
        }
    }

    pub const fn with_aof(self) -> Lock {
        Lock { aof: true, ..self }
    }

    pub const fn with_replica(self) -> Lock {
        Lock {
            replica: true,
            ..self
        }
    }

    /// The server this lock runs on loads the module (all but `PlainFloor`).
    pub fn with_module(&self) -> bool {
        self.imp != Impl::PlainFloor
    }

    pub fn label(&self) -> String {
        let base = match (self.imp, self.fam) {
            (Impl::Floor, _) => "SET NX PX + Lua compare-and-delete (floor)",
            (Impl::PlainFloor, _) => "the floor, on a server without the module",
            (Impl::Native, Family::Reentrant) => "RLOCK (native)",
            (Impl::Native, Family::Fair) => "FAIRLOCK (native)",
            (Impl::Native, Family::Write) => "RWLOCK WRITE (native)",
            (Impl::Native, Family::Read) => "RWLOCK READ (native)",
            (Impl::Native, Family::Semaphore) => "SEMAPHORE, 1 of 8 (native)",
            (Impl::Lua, Family::Reentrant) => "Redisson RLock (Lua)",
            (Impl::Lua, Family::Fair) => "Redisson FairLock (Lua)",
            (Impl::Lua, Family::Write) => "Redisson WriteLock (Lua)",
            (Impl::Lua, Family::Read) => "Redisson ReadLock (Lua)",
            (Impl::Lua, Family::Semaphore) => "Redisson PermitExpirableSemaphore (Lua)",
        };
        match (self.aof, self.replica) {
            (true, true) => format!("{base}, AOF on, with a replica"),
            (true, false) => format!("{base}, AOF on"),
            (false, true) => format!("{base}, with a replica"),
            (false, false) => base.to_string(),
        }
    }

    fn native_prefix(&self) -> &'static str {
        match self.fam {
            Family::Reentrant => "RLOCK",
            Family::Fair => "FAIRLOCK",
            Family::Write | Family::Read => "RWLOCK",
            Family::Semaphore => "SEMAPHORE",
        }
    }

    /// Command names as `INFO commandstats` shows them.
    pub fn acquire_stat(&self) -> &'static str {
        match (self.imp, self.fam) {
            (Impl::Floor | Impl::PlainFloor, _) => "set",
            (Impl::Native, Family::Reentrant) => "rlock.acquire",
            (Impl::Native, Family::Fair) => "fairlock.acquire",
            (Impl::Native, Family::Semaphore) => "semaphore.acquire",
            (Impl::Native, _) => "rwlock.acquire",
            (Impl::Lua, _) => "evalsha",
        }
    }

    pub fn release_stat(&self) -> &'static str {
        match (self.imp, self.fam) {
            (Impl::Floor | Impl::PlainFloor | Impl::Lua, _) => "evalsha",
            (Impl::Native, Family::Reentrant) => "rlock.release",
            (Impl::Native, Family::Fair) => "fairlock.release",
            (Impl::Native, Family::Semaphore) => "semaphore.release",
            (Impl::Native, _) => "rwlock.release",
        }
    }

    /// Redisson's pub/sub channel a waiter of `owner` listens on.
    pub fn channel(&self, key: &str, owner: &str) -> String {
        match self.fam {
            Family::Reentrant => format!("redisson_lock__channel:{{{key}}}"),
            Family::Fair => format!("redisson_lock__channel:{{{key}}}:{owner}"),
            Family::Write | Family::Read => format!("redisson_rwlock:{{{key}}}"),
            Family::Semaphore => format!("redisson_sc:{{{key}}}"),
        }
    }

    /// The timeout zset of Redisson's permit-expirable semaphore.
    fn permits_zset(key: &str) -> String {
        format!("redisson__timeout__set:{{{key}}}")
    }

    /// Queues one acquisition attempt. `block`: native BLOCK ms.
    pub fn queue_acquire(
        &self,
        c: &mut Conn,
        s: &Scripts,
        key: &str,
        owner: &str,
        lease_ms: u64,
        block: Option<u64>,
    ) {
        match self.imp {
            Impl::Floor | Impl::PlainFloor => q!(c; "SET", key, owner, "NX", "PX", lease_ms),
            Impl::Native => {
                let cmd = format!("{}.ACQUIRE", self.native_prefix());
                match (self.fam, block) {
                    (Family::Write | Family::Read, b) => {
                        let mode = if self.fam == Family::Write {
                            "WRITE"
                        } else {
                            "READ"
                        };
                        match b {
                            Some(ms) => {
                                q!(c; cmd, key, mode, owner, "PX", lease_ms, "BLOCK", ms)
                            }
                            None => q!(c; cmd, key, mode, owner, "PX", lease_ms),
                        }
                    }
                    (Family::Semaphore, Some(ms)) => q!(c; cmd, key, owner,
                        "LIMIT", SEMAPHORE_LIMIT, "PX", lease_ms, "BLOCK", ms),
                    (Family::Semaphore, None) => {
                        q!(c; cmd, key, owner, "LIMIT", SEMAPHORE_LIMIT, "PX", lease_ms)
                    }
                    (_, Some(ms)) => q!(c; cmd, key, owner, "PX", lease_ms, "BLOCK", ms),
                    (_, None) => q!(c; cmd, key, owner, "PX", lease_ms),
                }
            }
            Impl::Lua => match self.fam {
                Family::Reentrant => {
                    q!(c; "EVALSHA", s.sha("reentrant_acquire"), 1, key, lease_ms, owner)
                }
                Family::Fair => q!(c; "EVALSHA", s.sha("fair_acquire"), 3, key,
                    format!("redisson_lock_queue:{{{key}}}"),
                    format!("redisson_lock_timeout:{{{key}}}"),
                    lease_ms, owner, FAIR_THREAD_WAIT_MS, now_ms()),
                Family::Write => q!(c; "EVALSHA", s.sha("rw_write_acquire"), 1, key,
                    lease_ms, format!("{owner}:write")),
                Family::Read => q!(c; "EVALSHA", s.sha("rw_read_acquire"), 2, key,
                    format!("{{{key}}}:{owner}:rwlock_timeout"),
                    lease_ms, owner, format!("{owner}:write")),
                Family::Semaphore => {
                    let now = now_ms();
                    q!(c; "EVALSHA", s.sha("semaphore_acquire"), 3, key,
                        Self::permits_zset(key), self.channel(key, owner),
                        1, owner, now + lease_ms, now, SEMAPHORE_LIMIT)
                }
            },
        }
    }

    /// Queues a release of one hold.
    pub fn queue_release(&self, c: &mut Conn, s: &Scripts, key: &str, owner: &str, lease_ms: u64) {
        match self.imp {
            Impl::Floor | Impl::PlainFloor => {
                q!(c; "EVALSHA", s.sha("floor_release"), 1, key, owner)
            }
            Impl::Native => {
                let cmd = format!("{}.RELEASE", self.native_prefix());
                match self.fam {
                    Family::Write => q!(c; cmd, key, "WRITE", owner),
                    Family::Read => q!(c; cmd, key, "READ", owner),
                    _ => q!(c; cmd, key, owner),
                }
            }
            Impl::Lua => match self.fam {
                Family::Reentrant => q!(c; "EVALSHA", s.sha("reentrant_release"), 2, key,
                    self.channel(key, owner), UNLOCK_MESSAGE, lease_ms, owner),
                Family::Fair => q!(c; "EVALSHA", s.sha("fair_release"), 4, key,
                    format!("redisson_lock_queue:{{{key}}}"),
                    format!("redisson_lock_timeout:{{{key}}}"),
                    format!("redisson_lock__channel:{{{key}}}"),
                    UNLOCK_MESSAGE, lease_ms, owner, now_ms()),
                Family::Write => q!(c; "EVALSHA", s.sha("rw_write_release"), 2, key,
                    self.channel(key, owner), UNLOCK_MESSAGE, lease_ms, format!("{owner}:write")),
                Family::Read => q!(c; "EVALSHA", s.sha("rw_read_release"), 4, key,
                    self.channel(key, owner),
                    format!("{{{key}}}:{owner}:rwlock_timeout"),
                    format!("{{{key}}}"),
                    UNLOCK_MESSAGE, owner),
                Family::Semaphore => q!(c; "EVALSHA", s.sha("semaphore_release"), 3, key,
                    self.channel(key, owner), Self::permits_zset(key), 1, owner, now_ms()),
            },
        }
    }

    /// `Ok(None)`: granted; `Ok(Some(ttl))`: busy (ttl is Redisson's wait hint,
    /// -1 for the native/floor null); `Err`: anything unexpected.
    pub fn acquire_result(&self, v: &Value) -> Result<Option<i64>, String> {
        match (self.imp, v) {
            (Impl::Floor | Impl::PlainFloor, Value::Simple(s)) if s == "OK" => Ok(None),
            (Impl::Floor | Impl::PlainFloor, Value::Nil) => Ok(Some(-1)),
            (Impl::Native, Value::Int(_)) => Ok(None),
            (Impl::Native, Value::Nil) => Ok(Some(-1)),
            (Impl::Lua, Value::Nil) => Ok(None),
            (Impl::Lua, Value::Int(ttl)) => Ok(Some(*ttl)),
            _ => Err(format!("{}: unexpected acquire reply {v:?}", self.label())),
        }
    }

    /// Whether a release reply says the hold ended.
    pub fn released(&self, v: &Value) -> bool {
        match self.imp {
            Impl::Floor | Impl::PlainFloor | Impl::Lua => *v == Value::Int(1),
            Impl::Native => *v == Value::Int(0),
        }
    }
}
