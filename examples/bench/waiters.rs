//! (w) What a parked waiter costs each server: N clients parked on one held
//! lock (`RLOCK.ACQUIRE ... BLOCK 0`) against N clients in `BLPOP` on an empty
//! list, in `used_memory` bytes per parked client (the connection included);
//! then every client disconnects, and the memory still held 1 s and 10 s
//! later is read (a module's blocked client keeps a reply client that Redis
//! frees lazily). Runs on every server `make deps` provides.

use std::path::Path;
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

use crate::q;
use crate::resp::Conn;
use crate::server::Server;
use crate::Env;

/// The servers `make test` runs on, where present: (label, binary).
pub fn servers() -> Vec<(&'static str, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut out = vec![("Redis 7.0 (Debian)", "redis-server".to_string())];
    for (label, rel) in [
        ("Redis 8.2", ".servers/redis-8.2/redis-server"),
        ("Valkey 8.1", ".servers/valkey-8.1/valkey-server"),
    ] {
        let path = root.join(rel);
        if path.exists() {
            out.push((label, path.display().to_string()));
        }
    }
    out
}

pub struct WaiterMemory {
    pub server: &'static str,
    pub native: bool,
    pub waiters: usize,
    /// `used_memory` growth per parked client.
    pub bytes_per_waiter: f64,
    /// Per client that was parked: what is still held 1 s and 10 s after
    /// every one of them disconnected.
    pub left_after_1s: f64,
    pub left_after_10s: f64,
}

impl WaiterMemory {
    pub fn label(&self) -> &'static str {
        if self.native {
            "RLOCK.ACQUIRE ... BLOCK 0"
        } else {
            "BLPOP (reference)"
        }
    }
}

fn used_memory(srv: &Server) -> f64 {
    srv.info_i64("memory", "used_memory") as f64
}

fn parked(srv: &Server, native: bool) -> i64 {
    if native {
        srv.info_i64("rlock", "rlock_waiters")
    } else {
        srv.info_i64("clients", "blocked_clients")
    }
}

/// A server whose parked clients have all left, until its 10 s reading. A
/// thread of its own takes that reading on time while the next servers are
/// measured (memory, not time: the servers need not run alone), which takes
/// the section's six 10 s waits down to about one.
pub struct Leaving {
    server: &'static str,
    native: bool,
    waiters: usize,
    base: f64,
    with_waiters: f64,
    after_1s: f64,
    after_10s: JoinHandle<f64>,
}

/// Parks the clients, reads the memory they hold, disconnects them all and
/// reads what is left 1 s later.
pub fn park_and_leave(env: &Env, server: &'static str, binary: &str, native: bool) -> Leaving {
    let n = env.cfg.parked_waiters;
    let srv = Server::start_binary(binary, Some(&env.module), Some(n + 100), false);
    let mut admin = srv.conn();
    if native {
        let r = crate::cmd!(admin; "RLOCK.ACQUIRE", "held", "holder", "PX", 3_600_000)
            .expect("ACQUIRE");
        assert!(r.int().is_some(), "ACQUIRE: {r:?}");
    }
    sleep(Duration::from_millis(200));
    let base = used_memory(&srv);
    let mut conns: Vec<Conn> = (0..n).map(|_| srv.conn()).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        if native {
            q!(c; "RLOCK.ACQUIRE", "held", format!("w{i}"), "BLOCK", 0);
        } else {
            q!(c; "BLPOP", "empty", 0);
        }
        c.flush().expect("flush");
    }
    let end = Instant::now() + Duration::from_secs(60);
    while parked(&srv, native) < n as i64 {
        assert!(Instant::now() < end, "{server}: waiters did not park");
        sleep(Duration::from_millis(20));
    }
    let with_waiters = used_memory(&srv);
    drop(conns);
    let gone = Instant::now();
    while parked(&srv, native) > 0 {
        assert!(
            gone.elapsed() < Duration::from_secs(60),
            "{server}: waiters did not leave"
        );
        sleep(Duration::from_millis(5));
    }
    sleep(Duration::from_secs(1).saturating_sub(gone.elapsed()));
    let after_1s = used_memory(&srv);
    let after_10s = std::thread::spawn(move || {
        sleep(Duration::from_secs(10).saturating_sub(gone.elapsed()));
        let bytes = used_memory(&srv);
        drop(admin); // a client in `base` until the last reading
        bytes
    });
    Leaving {
        server,
        native,
        waiters: n,
        base,
        with_waiters,
        after_1s,
        after_10s,
    }
}

impl Leaving {
    /// The readings, once the one 10 s after the clients left is taken (the
    /// server stops then).
    pub fn finish(self) -> WaiterMemory {
        let after_10s = self.after_10s.join().expect("the 10 s reading");
        let per = |bytes: f64| (bytes - self.base).max(0.0) / self.waiters as f64;
        WaiterMemory {
            server: self.server,
            native: self.native,
            waiters: self.waiters,
            bytes_per_waiter: per(self.with_waiters),
            left_after_1s: per(self.after_1s),
            left_after_10s: per(after_10s),
        }
    }
}
