//! Real servers for the client's tests: `RLOCK_SERVER` (default
//! `redis-server`) with the module `RLOCK_MODULE` (default: the workspace's
//! `target/release/librlock.so`, built by `cargo build --release`).
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub fn server_binary() -> String {
    std::env::var("RLOCK_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".into())
}

pub fn module_path() -> PathBuf {
    let p = std::env::var_os("RLOCK_MODULE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/release/librlock.so")
        });
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --release`",
        p.display()
    );
    p
}

/// A port no server of this process got before. A test that kills a server
/// keeps its clients pointed at the dead port, and the kernel hands a freed
/// port out again: another test's server there would answer for the dead one.
fn free_port() -> u16 {
    static HANDED_OUT: Mutex<BTreeSet<u16>> = Mutex::new(BTreeSet::new());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if HANDED_OUT
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(port)
        {
            return port;
        }
    }
}

static SEQ: AtomicUsize = AtomicUsize::new(0);

pub struct Server {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
    frozen: bool,
}

impl Server {
    pub fn start() -> Server {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "client-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // Another test's server may take the port between `free_port` and the
        // bind: then another port.
        for _ in 0..5 {
            if let Some(s) = Server::try_start(&dir, free_port()) {
                return s;
            }
        }
        panic!("{} found no free port", server_binary());
    }

    /// `None` when the port was taken; panics when the server fails otherwise.
    fn try_start(dir: &Path, port: u16) -> Option<Server> {
        // A failed try's drop removed the directory.
        std::fs::create_dir_all(dir).unwrap();
        let log = std::fs::File::create(dir.join("server.log")).unwrap();
        let child = Command::new(server_binary())
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(dir)
            .args(["--save", "", "--appendonly", "no", "--loadmodule"])
            .arg(module_path())
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", server_binary()));
        let pid = child.id();
        let mut s = Server {
            port,
            dir: dir.to_path_buf(),
            child: Some(child),
            frozen: false,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Our child answering, not a server that had the port first.
            let info = s.client().get_connection().and_then(|mut c| {
                redis::cmd("PING").query::<String>(&mut c)?;
                redis::cmd("INFO").arg("server").query::<String>(&mut c)
            });
            if info.is_ok_and(|i| i.contains(&format!("process_id:{pid}\r\n"))) {
                return Some(s);
            }
            if let Some(status) = s.child.as_mut().unwrap().try_wait().unwrap() {
                s.child = None;
                // Lossy: a log may hold bytes that are not UTF-8.
                let log = String::from_utf8_lossy(
                    &std::fs::read(dir.join("server.log")).unwrap_or_default(),
                )
                .into_owned();
                if log.contains("Address already in use") {
                    return None;
                }
                panic!("{} exited ({status}); log:\n{log}", server_binary());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not start",
                server_binary()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port)).unwrap()
    }

    pub fn conn(&self) -> redis::Connection {
        self.client().get_connection().unwrap()
    }

    /// Running and answering (not killed, not frozen).
    pub fn alive(&self) -> bool {
        self.child.is_some() && !self.frozen
    }

    /// SIGKILL: gone, its port refuses connections.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    fn signal(&self, sig: &str) {
        if let Some(c) = &self.child {
            let ok = Command::new("kill")
                .arg(sig)
                .arg(c.id().to_string())
                .status()
                .unwrap();
            assert!(ok.success());
        }
    }

    /// SIGSTOP: connections are accepted by the kernel, nothing is answered.
    pub fn freeze(&mut self) {
        self.signal("-STOP");
        self.frozen = true;
    }

    pub fn thaw(&mut self) {
        self.signal("-CONT");
        self.frozen = false;
    }

    /// Whether this (live, answering) server has `key`.
    pub fn has(&self, key: &str) -> bool {
        self.alive()
            && redis::cmd("EXISTS")
                .arg(key)
                .query::<i64>(&mut self.conn())
                .unwrap()
                == 1
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.frozen {
            self.thaw();
        }
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

pub fn stat(c: &mut redis::Connection, name: &str) -> i64 {
    let info: String = redis::cmd("INFO").arg("rlock").query(c).unwrap();
    let prefix = format!("rlock_{name}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

pub fn renew_calls(c: &mut redis::Connection) -> i64 {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_rlock.renew:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}
