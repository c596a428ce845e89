//! A private redis-server with the module loaded: free loopback port, temp
//! dir, no persistence; killed when dropped. Plus the server-side readings the
//! benchmark takes: INFO sections, commandstats, the process's CPU time.

use std::collections::HashMap;
use std::io;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::cmd;
use crate::contention::percentile;
use crate::resp::{Conn, Value};

static SEQ: AtomicUsize = AtomicUsize::new(0);

pub struct Server {
    pub port: u16,
    pub pid: u32,
    dir: PathBuf,
    child: Child,
}

fn free_port() -> io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Server {
    /// Starts redis-server with the module; `maxclients` when many connections are needed.
    pub fn start(module: &Path, maxclients: Option<usize>) -> Server {
        Self::start_with(Some(module), maxclients, false)
    }

    /// `module: None` starts a plain redis-server (a reference point).
    /// `aof`: AOF on with `appendfsync no` (effects are propagated and written,
    /// without waiting for the disk).
    pub fn start_with(module: Option<&Path>, maxclients: Option<usize>, aof: bool) -> Server {
        Self::start_binary("redis-server", module, maxclients, aof)
    }

    /// As `start_with`, on another server binary (Redis 8.2, Valkey 8.1).
    pub fn start_binary(
        binary: &str,
        module: Option<&Path>,
        maxclients: Option<usize>,
        aof: bool,
    ) -> Server {
        let mut last_err = String::new();
        for _ in 0..5 {
            match Self::try_start(binary, module, maxclients, aof) {
                Ok(s) => return s,
                Err(e) => last_err = e,
            }
        }
        panic!("could not start redis-server: {last_err}");
    }

    fn try_start(
        binary: &str,
        module: Option<&Path>,
        maxclients: Option<usize>,
        aof: bool,
    ) -> Result<Server, String> {
        let port = free_port().map_err(|e| e.to_string())?;
        let dir = std::env::temp_dir().join(format!(
            "rlock-bench-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let log = std::fs::File::create(dir.join("redis.log")).map_err(|e| e.to_string())?;
        let mut command = Command::new(binary);
        command
            .arg("--port")
            .arg(port.to_string())
            .args(["--bind", "127.0.0.1"])
            .arg("--dir")
            .arg(&dir)
            .args(["--save", ""])
            // DEBUG RELOAD and DEBUG DIGEST-VALUE (Redis 7 refuses DEBUG by default).
            .args(["--enable-debug-command", "yes"])
            // A replica's full sync starts at once (the default waits 5 s for
            // more replicas to join the same transfer).
            .args(["--repl-diskless-sync-delay", "0"])
            // A large replicated effect never disconnects a replica mid-measurement.
            .args(["--client-output-buffer-limit", "replica 0 0 0"]);
        if aof {
            command.args(["--appendonly", "yes", "--appendfsync", "no"]);
        } else {
            command.args(["--appendonly", "no"]);
        }
        if let Some(module) = module {
            command.arg("--loadmodule").arg(module);
        }
        if let Some(n) = maxclients {
            command.args(["--maxclients", &n.to_string()]);
        }
        let child = command
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone().map_err(|e| e.to_string())?))
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("{binary}: {e} (is it installed? `make deps`)"))?;
        let pid = child.id();
        let mut server = Server {
            port,
            pid,
            dir,
            child,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Ok(mut c) = Conn::connect(port) {
                if let Ok(Value::Simple(s)) = cmd!(c; "PING") {
                    if s == "PONG" {
                        return Ok(server);
                    }
                }
            }
            if let Ok(Some(status)) = server.child.try_wait() {
                return Err(format!("redis-server exited ({status}):\n{}", server.log()));
            }
            if Instant::now() > deadline {
                return Err(format!("redis-server did not answer:\n{}", server.log()));
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// The server's working directory (its RDB and AOF files).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts a second redis-server (the module loaded when `module` is given)
    /// as this one's replica, and waits until the link is up, the initial sync
    /// is done and the master sees the replica online.
    pub fn start_replica(&self, module: Option<&Path>) -> Server {
        let replica = Self::start_with(module, None, false);
        let mut c = replica.conn();
        let r = cmd!(c; "REPLICAOF", "127.0.0.1", self.port.to_string()).expect("REPLICAOF");
        assert!(!r.is_error(), "REPLICAOF: {r:?}");
        replica.wait_synced(self, Duration::from_secs(300));
        replica
    }

    /// Waits until this replica's link to `master` is up and synced.
    pub fn wait_synced(&self, master: &Server, timeout: Duration) {
        let end = Instant::now() + timeout;
        loop {
            let r = self.info("replication");
            let m = master.info("replication");
            let up = r.get("master_link_status").is_some_and(|v| v == "up")
                && r.get("master_sync_in_progress").is_some_and(|v| v == "0")
                && m.get("slave0").is_some_and(|v| v.contains("state=online"));
            if up {
                return;
            }
            assert!(
                Instant::now() < end,
                "replica did not sync within {timeout:?}:\n{}",
                self.log()
            );
            sleep(Duration::from_millis(10));
        }
    }

    /// Waits until this replica has processed everything `master` had sent
    /// when the call began (its `master_repl_offset` is the stream it applied).
    pub fn wait_caught_up(&self, master: &Server, timeout: Duration) {
        let target = master.repl_offset();
        let end = Instant::now() + timeout;
        while self.repl_offset() < target {
            assert!(
                Instant::now() < end,
                "replica did not catch up within {timeout:?}"
            );
            sleep(Duration::from_millis(5));
        }
    }

    /// `master_repl_offset`: bytes this master has sent down its replication
    /// stream (on a replica: the bytes of it applied so far).
    pub fn repl_offset(&self) -> i64 {
        self.info_i64("replication", "master_repl_offset")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }

    pub fn conn(&self) -> Conn {
        Conn::connect(self.port).expect("connect to the benchmark server")
    }

    /// `INFO <section>` as field -> value.
    pub fn info(&self, section: &str) -> HashMap<String, String> {
        let mut c = self.conn();
        let text = cmd!(c; "INFO", section).expect("INFO").text();
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.trim().to_string()))
            .collect()
    }

    pub fn info_i64(&self, section: &str, field: &str) -> i64 {
        self.info(section)
            .get(field)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("INFO {section} has no integer field {field}"))
    }

    /// CPU seconds of the server's main thread so far (`INFO cpu`): all its
    /// work, command execution and what Redis does around it (reading requests,
    /// writing replies, feeding the replica link and the AOF buffer).
    pub fn main_thread_cpu(&self) -> f64 {
        let cpu = self.info("cpu");
        ["used_cpu_user_main_thread", "used_cpu_sys_main_thread"]
            .iter()
            .map(|f| {
                cpu.get(*f)
                    .and_then(|v| v.parse::<f64>().ok())
                    .unwrap_or_else(|| panic!("INFO cpu has no {f}"))
            })
            .sum()
    }

    pub fn reset_stats(&self, c: &mut Conn) {
        let r = cmd!(c; "CONFIG", "RESETSTAT").expect("CONFIG RESETSTAT");
        assert!(!r.is_error(), "CONFIG RESETSTAT: {r:?}");
    }

    /// `INFO commandstats`: command -> (calls, total usec).
    pub fn commandstats(&self) -> HashMap<String, (u64, u64)> {
        let mut out = HashMap::new();
        for (k, v) in self.info("commandstats") {
            let Some(name) = k.strip_prefix("cmdstat_") else {
                continue;
            };
            let field = |f: &str| -> u64 {
                v.split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .find(|(n, _)| *n == f)
                    .and_then(|(_, x)| x.parse().ok())
                    .unwrap_or(0)
            };
            out.insert(name.to_string(), (field("calls"), field("usec")));
        }
        out
    }

    /// CPU time the server process used so far (all threads), in nanoseconds.
    pub fn cpu_ns(&self) -> u64 {
        process_cpu_ns(self.pid)
    }
}

/// Sum of the per-thread `schedstat` run times (ns precision); falls back to
/// `stat` utime + stime (clock ticks).
pub fn process_cpu_ns(pid: u32) -> u64 {
    let mut total = 0u64;
    let mut found = false;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            if let Ok(s) = std::fs::read_to_string(t.path().join("schedstat")) {
                if let Some(ns) = s
                    .split_whitespace()
                    .next()
                    .and_then(|x| x.parse::<u64>().ok())
                {
                    total += ns;
                    found = true;
                }
            }
        }
    }
    if found {
        return total;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the ")" that closes the command name; utime and stime are 14 and 15.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<u64> = rest
        .split_whitespace()
        .map(|x| x.parse().unwrap_or(0))
        .collect();
    let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    ticks * 1_000_000_000 / hz
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A connection that PINGs a server in a tight loop on its own thread and
/// records every round trip: how long the server left clients unanswered.
pub struct Pinger {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<Vec<(Instant, u32)>>,
}

/// The round trips a `Pinger` recorded: (time sent, round trip µs).
pub struct PingLog {
    pub samples: Vec<(Instant, u32)>,
}

/// Worst and p99 PING round trip over a window.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stall {
    pub pings: usize,
    pub worst_ms: f64,
    pub p99_ms: f64,
}

impl Pinger {
    pub fn start(port: u16) -> Pinger {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let mut c = Conn::connect(port).expect("connect the pinger");
        let handle = std::thread::spawn(move || {
            let mut out = Vec::with_capacity(1 << 16);
            while !flag.load(Ordering::Relaxed) {
                let t = Instant::now();
                let v = cmd!(c; "PING").expect("PING");
                assert_eq!(v, Value::Simple("PONG".into()), "PING");
                out.push((t, t.elapsed().as_micros() as u32));
            }
            out
        });
        Pinger { stop, handle }
    }

    pub fn stop(self) -> PingLog {
        self.stop.store(true, Ordering::Relaxed);
        PingLog {
            samples: self.handle.join().expect("pinger thread"),
        }
    }
}

impl PingLog {
    /// Round trips of the PINGs that were in flight at any time in `[from, to]`.
    pub fn window(&self, from: Instant, to: Instant) -> Stall {
        self.stall(|sent, done| sent <= to && done >= from)
    }

    /// Round trips of the PINGs sent and answered within `[from, to]` (a
    /// quiet stretch before an event, without the PING the event delays).
    pub fn within(&self, from: Instant, to: Instant) -> Stall {
        self.stall(|sent, done| sent >= from && done <= to)
    }

    fn stall(&self, keep: impl Fn(Instant, Instant) -> bool) -> Stall {
        let rtts: Vec<u32> = self
            .samples
            .iter()
            .filter(|(t, rtt)| keep(*t, *t + Duration::from_micros(*rtt as u64)))
            .map(|&(_, rtt)| rtt)
            .collect();
        Stall {
            pings: rtts.len(),
            worst_ms: percentile(&rtts, 100.0) / 1000.0,
            p99_ms: percentile(&rtts, 99.0) / 1000.0,
        }
    }
}

/// Runs `f` with the main threads of the servers `pids` on the last CPU and the calling
/// thread (the benchmark's client) on the first, then puts both back on every
/// CPU. For measurements of one command at a time: a server's time per call
/// then depends on whether the scheduler happened to put it on the client's
/// core (request and reply buffers hot in the shared caches) or on the other
/// one, and that stays so for a process's life. Measured in section (e) on
/// this machine with 1 reader in: 0.74-0.77 µs per acquire on the client's
/// core, 1.94-1.97 µs on the other, and unpinned runs gave either. Apart is
/// how a server meets its clients in production (the request comes from the
/// network, not from the core's cache). Runs `f` as it is on one CPU.
pub fn apart<R>(pids: &[u32], f: impl FnOnce() -> R) -> R {
    let cpus = allowed_cpus(0);
    let (Some(&client), Some(&server)) = (cpus.first(), cpus.last()) else {
        return f();
    };
    if client == server {
        return f();
    }
    pids.iter().for_each(|&p| pin(p as libc::pid_t, &[server]));
    pin(0, &[client]);
    let out = f();
    pin(0, &cpus);
    pids.iter().for_each(|&p| pin(p as libc::pid_t, &cpus));
    out
}

/// The CPUs `pid` (0: the calling thread) may run on.
fn allowed_cpus(pid: libc::pid_t) -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is an empty set; the kernel fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Best effort: a measurement on an unpinned server is still a measurement.
fn pin(pid: libc::pid_t, cpus: &[usize]) {
    // SAFETY: as above; the set lives across the call.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        cpus.iter().for_each(|&c| libc::CPU_SET(c, &mut set));
        libc::sched_setaffinity(pid, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}
