//! Test harness: real `redis-server` processes loading the built module, driven
//! through the `redis` crate. Each server gets its own port and directory.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::thread::sleep;
use std::time::{Duration, Instant};

pub use redis::{cmd, Connection, Value};

/// The module under test: `target/release/librlock.so`, or `RLOCK_MODULE` (a
/// path) to run the suites against another build, e.g. an older commit's.
pub fn module_path() -> PathBuf {
    if let Some(p) = std::env::var_os("RLOCK_MODULE") {
        return PathBuf::from(p);
    }
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("target/release/librlock.so");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --release` (make test does)",
        p.display()
    );
    p
}

/// The server binary every test starts: `RLOCK_SERVER` (a path or a name on
/// PATH, e.g. `.servers/redis-8.2/redis-server` or a `valkey-server`), else
/// `redis-server`. `make test` runs the suites once per server this way.
pub fn server_binary() -> String {
    std::env::var("RLOCK_SERVER")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "redis-server".to_string())
}

/// `INFO server` of a running server, as (field, value) lines.
pub fn server_info(c: &mut Connection, field_name: &str) -> Option<String> {
    let info: String = cmd("INFO").arg("server").query(c).ok()?;
    let prefix = format!("{field_name}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map(|v| v.trim().to_string())
}

/// Unix time in milliseconds (the clock the server's deadlines use).
pub fn unix_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// RESP encoding of one command, as the AOF stores it.
pub fn resp(args: &[&[u8]]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).into_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// `PING` then `INFO server` on a raw socket with timeouts: the process id
/// of a server that has loaded its data and answers. (A server stuck while
/// loading accepts connections, as it listens first, and answers nothing; the
/// `redis` crate's connection setup would wait for it for ever.)
fn probe_process_id(port: u16) -> Option<u32> {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
    s.write_all(b"PING\r\nINFO server\r\n").ok()?;
    let mut got = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if !b"+PONG\r\n".starts_with(&got[..got.len().min(7)]) {
            return None; // -LOADING, or not a Redis server
        }
        let text = String::from_utf8_lossy(&got);
        if let Some(rest) = text.split("process_id:").nth(1) {
            if let Some((id, _)) = rest.split_once("\r\n") {
                return id.trim().parse().ok();
            }
        }
        let n = s.read(&mut chunk).ok()?;
        if n == 0 {
            return None;
        }
        got.extend_from_slice(&chunk[..n]);
    }
}

/// A server's log as text, bytes that are not UTF-8 replaced. Not
/// `read_to_string`, which fails whole on such bytes: redis-check-rdb, which
/// Redis runs on an RDB file it refused, prints key names it misreads from
/// the bytes after a cut value (`Reading key '\x81'` on Redis 8.2), and a
/// test then saw an empty log.
fn read_log(path: &Path) -> String {
    String::from_utf8_lossy(&std::fs::read(path).unwrap_or_default()).into_owned()
}

/// A port no server of this process got before. A test that kills a server
/// keeps its clients pointed at the dead port, and the kernel hands a freed
/// port out again: another test's server there would answer for the dead one.
pub fn free_port() -> u16 {
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
    pub dir: PathBuf,
    args: Vec<String>,
    child: Option<Child>,
}

impl Server {
    /// A server with the module loaded, no persistence.
    pub fn start() -> Server {
        Server::start_with(&["--save", "", "--appendonly", "no"], &[])
    }

    /// `server_args` go to redis-server, `module_args` after the module path.
    pub fn start_with(server_args: &[&str], module_args: &[&str]) -> Server {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "srv-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let mut args: Vec<String> =
            vec!["--loadmodule".into(), module_path().display().to_string()];
        args.extend(module_args.iter().map(|s| s.to_string()));
        args.extend(["--enable-debug-command", "yes"].map(String::from));
        args.extend(server_args.iter().map(|s| s.to_string()));
        args.extend(extra_server_args());
        let mut server = Server {
            port: 0,
            dir,
            args,
            child: None,
        };
        server.spawn_on_a_free_port();
        server
    }

    /// Another process (a server of a test running alongside) may take the
    /// port between `free_port` and the server's bind: then another port.
    fn spawn_on_a_free_port(&mut self) {
        let mut retries = 4;
        loop {
            match self.try_spawn(free_port()) {
                Ok(()) => return,
                Err((Some(_), log)) if retries > 0 && log.contains("Address already in use") => {
                    retries -= 1
                }
                Err(failure) => Self::failed_to_start(failure),
            }
        }
    }

    fn spawn(&mut self, port: u16) {
        if let Err(failure) = self.try_spawn(port) {
            Self::failed_to_start(failure)
        }
    }

    fn failed_to_start((status, log): (Option<std::process::ExitStatus>, String)) -> ! {
        match status {
            Some(status) => panic!("redis-server exited ({status}); log:\n{log}"),
            None => panic!("redis-server did not start; log:\n{log}"),
        }
    }

    /// Starts the server; when it exits instead of answering PING, gives back
    /// its exit status and log (`None`: still running but not answering).
    fn try_spawn(&mut self, port: u16) -> Result<(), (Option<std::process::ExitStatus>, String)> {
        self.port = port;
        let log = std::fs::File::create(self.dir.join("redis.log")).unwrap();
        let mut command = if valgrind() {
            let mut v = Command::new("valgrind");
            v.arg("--leak-check=full")
                .arg("--show-leak-kinds=definite")
                .arg("--soname-synonyms=somalloc=*jemalloc*")
                .arg(format!(
                    "--suppressions={}",
                    Path::new(env!("CARGO_MANIFEST_DIR"))
                        .join("tests/valgrind.supp")
                        .display()
                ))
                .arg(format!(
                    "--log-file={}",
                    self.dir.join(format!("valgrind-{port}-%p.log")).display()
                ))
                .arg(server_binary());
            v
        } else {
            Command::new(server_binary())
        };
        let child = command
            .arg("--port")
            .arg(port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--dir")
            .arg(&self.dir)
            .args(&self.args)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| {
                panic!(
                    "cannot start {} (make deps installs it): {e}",
                    server_binary()
                )
            });
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(if valgrind() { 60 } else { 10 });
        loop {
            if self.answers_as_our_child() {
                return Ok(());
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Err((Some(status), self.log()));
            }
            if Instant::now() >= deadline {
                return Err((None, self.log()));
            }
            sleep(Duration::from_millis(20));
        }
    }

    /// The server on our port answers PING (it has loaded its data), and it
    /// is our child (not another test's server that took the port first).
    fn answers_as_our_child(&self) -> bool {
        let pid = self.child.as_ref().map(Child::id);
        pid.is_some() && probe_process_id(self.port) == pid
    }

    pub fn log(&self) -> String {
        read_log(&self.dir.join("redis.log"))
    }

    fn try_client(&self) -> redis::RedisResult<Connection> {
        redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?.get_connection()
    }

    pub fn client(&self) -> Connection {
        self.try_client().expect("connect")
    }

    pub fn client_resp3(&self) -> Connection {
        redis::Client::open(format!("redis://127.0.0.1:{}/?protocol=resp3", self.port))
            .unwrap()
            .get_connection()
            .unwrap()
    }

    /// SIGKILL: nothing is saved on the way down.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Stops (SHUTDOWN NOSAVE, so only what was already persisted survives)
    /// and starts again on the same port and directory.
    pub fn restart(&mut self) {
        let mut c = self.client();
        let _: redis::RedisResult<()> = cmd("SHUTDOWN").arg("NOSAVE").query(&mut c);
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        self.spawn(self.port);
    }

    /// Like `restart`, with extra server arguments from now on.
    pub fn restart_with(&mut self, extra: &[&str]) {
        self.args.extend(extra.iter().map(|s| s.to_string()));
        self.restart();
    }

    /// Starts after a `kill` on the same port and directory.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none());
        self.spawn(self.port);
    }

    /// Like `start_again`, for a server that may refuse to start (a corrupt
    /// RDB file): its exit status and log when it exited instead.
    pub fn try_start_again(&mut self) -> Result<(), (Option<std::process::ExitStatus>, String)> {
        assert!(self.child.is_none());
        self.try_spawn(self.port)
    }

    /// A server that starts by loading `aof` (RESP commands) as its append-only file.
    pub fn start_on_aof(aof: &[u8]) -> Server {
        let mut s = Server::start_with(
            &[
                "--save",
                "",
                "--appendonly",
                "no",
                "--aof-use-rdb-preamble",
                "no",
            ],
            &[],
        );
        s.kill();
        std::fs::write(s.dir.join("appendonly.aof"), aof).unwrap();
        s.start_again_with(&["--appendonly", "yes"]);
        s
    }

    /// Like `start_again`, with extra server arguments from now on.
    pub fn start_again_with(&mut self, extra: &[&str]) {
        self.args.extend(extra.iter().map(|s| s.to_string()));
        self.start_again();
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("server is running").id()
    }

    /// SIGSTOP: the process stops dead (no replies, no acks, no timers) until `thaw`.
    pub fn freeze(&self) {
        signal(self.pid(), "STOP");
    }

    /// SIGCONT after `freeze`.
    pub fn thaw(&self) {
        signal(self.pid(), "CONT");
    }

    pub fn is_running(&mut self) -> bool {
        matches!(self.child.as_mut().map(|c| c.try_wait()), Some(Ok(None)))
    }

    /// Makes this server a replica of `master` and waits for the first sync.
    pub fn replicate_from(&self, master: &Server) {
        let mut c = self.client();
        let _: () = cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(master.port)
            .query(&mut c)
            .unwrap();
        wait_until(Duration::from_secs(10), || {
            let info: String = cmd("INFO").arg("replication").query(&mut c).unwrap();
            info.contains("master_link_status:up")
        });
    }
}

/// Sends a signal (`STOP`, `CONT`, `KILL`...) to a process.
pub fn signal(pid: u32, sig: &str) {
    let ok = Command::new("kill")
        .arg(format!("-{sig}"))
        .arg(pid.to_string())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "kill -{sig} {pid} failed");
}

/// `master_repl_offset` (master) or `slave_repl_offset` (replica) from INFO replication.
pub fn repl_offset(c: &mut Connection) -> i64 {
    let info: String = cmd("INFO").arg("replication").query(c).unwrap();
    info.lines()
        .find_map(|l| {
            l.strip_prefix("master_repl_offset:")
                .or_else(|| l.strip_prefix("slave_repl_offset:"))
        })
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no replication offset in:\n{info}"))
}

/// `RLOCK_SERVER_ARGS="--io-threads 4"`: arguments every test server gets
/// after its own (whitespace-separated), e.g. to run a suite with IO threads.
fn extra_server_args() -> Vec<String> {
    std::env::var("RLOCK_SERVER_ARGS")
        .map(|a| a.split_whitespace().map(String::from).collect())
        .unwrap_or_default()
}

/// `RLOCK_VALGRIND=1` runs every server under valgrind's memcheck; each server
/// is then shut down cleanly and its report checked (see `make test-valgrind`).
pub fn valgrind() -> bool {
    std::env::var_os("RLOCK_VALGRIND").is_some_and(|v| v == "1")
}

impl Server {
    /// Shuts a valgrind-run server down cleanly and fails on a definite leak or
    /// any memory error whose stack passes through the module.
    fn check_valgrind(&mut self) {
        if let Ok(mut c) = self.try_client() {
            let _: redis::RedisResult<()> = cmd("SHUTDOWN").arg("NOSAVE").query(&mut c);
        }
        if let Some(mut child) = self.child.take() {
            let _ = child.wait();
        }
        for entry in std::fs::read_dir(&self.dir).unwrap().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if !name.starts_with("valgrind-") {
                continue;
            }
            let report = std::fs::read_to_string(entry.path()).unwrap();
            let definite_leak = report
                .lines()
                .any(|l| l.contains("definitely lost:") && !l.contains("definitely lost: 0 bytes"));
            let module_error = valgrind_errors(&report)
                .iter()
                .any(|block| is_memory_error(block) && block.contains("librlock"));
            assert!(
                !definite_leak && !module_error,
                "valgrind found a problem ({name}):\n{report}"
            );
        }
    }
}

/// The error blocks of a valgrind report: a headline ("Invalid read of size 8")
/// followed by its indented stack lines.
fn valgrind_errors(report: &str) -> Vec<String> {
    let mut blocks: Vec<String> = Vec::new();
    for line in report.lines() {
        let body = line.split_once("== ").map(|(_, b)| b).unwrap_or("");
        if body.is_empty() {
            continue;
        }
        if body.starts_with(' ') {
            if let Some(b) = blocks.last_mut() {
                b.push_str(body);
                b.push('\n');
            }
        } else {
            blocks.push(format!("{body}\n"));
        }
    }
    blocks
}

fn is_memory_error(block: &str) -> bool {
    const HEADLINES: [&str; 6] = [
        "Invalid",
        "uninitialised",
        "Conditional jump",
        "Mismatched",
        "overlap",
        "Syscall param",
    ];
    let headline = block.lines().next().unwrap_or("");
    HEADLINES.iter().any(|h| headline.contains(h))
}

impl Drop for Server {
    fn drop(&mut self) {
        if valgrind() && !std::thread::panicking() && self.child.is_some() {
            self.check_valgrind();
        }
        self.kill();
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

pub fn wait_until(limit: Duration, mut cond: impl FnMut() -> bool) {
    // Under valgrind the server runs ~20x slower: stretch waits, not assertions.
    let limit = if valgrind() { limit * 10 } else { limit };
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "condition not met within {limit:?}"
        );
        sleep(Duration::from_millis(5));
    }
}

/// Sends a command and returns the raw reply (errors as `Err`).
pub fn call(c: &mut Connection, args: &[&str]) -> redis::RedisResult<Value> {
    let mut command = cmd(args[0]);
    for a in &args[1..] {
        command.arg(*a);
    }
    command.query(c)
}

pub fn int(c: &mut Connection, args: &[&str]) -> i64 {
    match call(c, args) {
        Ok(Value::Int(v)) => v,
        other => panic!("{args:?}: expected an integer, got {other:?}"),
    }
}

pub fn is_nil(c: &mut Connection, args: &[&str]) -> bool {
    match call(c, args) {
        Ok(Value::Nil) => true,
        Ok(Value::Int(_)) => false,
        other => panic!("{args:?}: expected integer or nil, got {other:?}"),
    }
}

/// The error text of a command that must fail.
pub fn error(c: &mut Connection, args: &[&str]) -> String {
    match call(c, args) {
        Err(e) => {
            let code = e.code().unwrap_or("");
            let detail = e.detail().unwrap_or("");
            format!("{code} {detail}").trim().to_string()
        }
        Ok(v) => panic!("{args:?}: expected an error, got {v:?}"),
    }
}

/// `*.INFO` as field -> value, from a RESP2 flat array or a RESP3 map.
pub fn info_map(c: &mut Connection, args: &[&str]) -> Option<Vec<(String, Value)>> {
    parse_info(call(c, args).unwrap())
}

/// A `*.INFO` reply as field -> value (`None` for nil).
pub fn parse_info(reply: Value) -> Option<Vec<(String, Value)>> {
    match reply {
        Value::Nil => None,
        Value::Array(items) => Some(
            items
                .chunks(2)
                .map(|kv| (as_string(&kv[0]), kv[1].clone()))
                .collect(),
        ),
        Value::Map(items) => Some(items.into_iter().map(|(k, v)| (as_string(&k), v)).collect()),
        other => panic!("unexpected INFO reply {other:?}"),
    }
}

/// `used_memory` from INFO memory: every byte the server and module allocated.
pub fn used_memory(c: &mut Connection) -> i64 {
    let info: String = cmd("INFO").arg("memory").query(c).unwrap();
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// `dataset.bytes` from MEMORY STATS: what the keyspace and the module hold
/// (the module allocates through Redis), without the server's overheads. Unlike
/// `used_memory` it leaves out client buffers: a connection that sent a large
/// payload keeps its grown query buffer until Redis's cron trims it, which a
/// leak check must not count.
pub fn dataset_bytes(c: &mut Connection) -> i64 {
    let stats = parse_info(call(c, &["MEMORY", "STATS"]).unwrap()).unwrap();
    match field(&stats, "dataset.bytes") {
        Value::Int(n) => n,
        other => panic!("dataset.bytes: {other:?}"),
    }
}

pub fn field(info: &[(String, Value)], name: &str) -> Value {
    info.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.clone())
        .unwrap_or_else(|| panic!("no field {name} in {info:?}"))
}

pub fn as_string(v: &Value) -> String {
    match v {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        Value::Int(i) => i.to_string(),
        other => panic!("not a string: {other:?}"),
    }
}

pub fn as_int(v: &Value) -> i64 {
    match v {
        Value::Int(i) => *i,
        other => panic!("not an integer: {other:?}"),
    }
}

/// A field of `INFO rlock` (without the `rlock_` prefix).
pub fn stat(c: &mut Connection, name: &str) -> i64 {
    let info: String = cmd("INFO").arg("rlock").query(c).unwrap();
    let prefix = format!("rlock_{name}:");
    info.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("INFO rlock has no {name}:\n{info}"))
        .trim()
        .parse()
        .unwrap()
}

/// `DEBUG DIGEST` of the server `c` is connected to.
pub fn digest(c: &mut Connection) -> String {
    cmd("DEBUG").arg("DIGEST").query(c).unwrap()
}

/// `CLIENT PAUSE ms WRITE`: no change is made (no lease ends, no renewal),
/// so a master and its copies can be compared.
pub fn pause_writes(c: &mut Connection, ms: u64) {
    let _: () = cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query(c)
        .unwrap();
}

/// Acquires `keys` as RLOCKs of `owner` with `PX lease_ms KEEPALIVE`, in one
/// pipeline on `c`, the connection they are then bound to; their tokens.
pub fn acquire_keepalive(
    c: &mut Connection,
    keys: &[String],
    owner: &str,
    lease_ms: u64,
) -> Vec<i64> {
    let mut p = redis::pipe();
    for k in keys {
        p.cmd("RLOCK.ACQUIRE")
            .arg(k)
            .arg(owner)
            .arg("PX")
            .arg(lease_ms)
            .arg("KEEPALIVE");
    }
    p.query(c).unwrap()
}

/// Runs a blocking command on its own connection and thread.
pub fn spawn_call(
    server: &Server,
    args: &[&str],
) -> std::thread::JoinHandle<(redis::RedisResult<Value>, Duration)> {
    let mut c = server.client();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || {
        let start = Instant::now();
        let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        let r = call(&mut c, &refs);
        (r, start.elapsed())
    })
}

/// A blocking command on its own connection and thread, and that
/// connection's client id (to `CLIENT KILL` or `CLIENT UNBLOCK` it).
pub fn spawn_call_with_id(
    server: &Server,
    args: &[&str],
) -> (String, std::thread::JoinHandle<redis::RedisResult<Value>>) {
    let mut c = server.client();
    let id = client_id(&mut c).to_string();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let handle = std::thread::spawn(move || {
        let refs: Vec<&str> = args.iter().map(|s| s.as_str()).collect();
        call(&mut c, &refs)
    });
    (id, handle)
}

/// The memory of a client just freed (744 bytes on Redis 7.0) taken by values
/// full of 'A', then a lease ending under a waiter, which the module's timer
/// hands over and propagates (a DEL and a delta): a server still pointing at
/// the freed client as its current one crashes here.
pub fn reuse_freed_client_then_hand_over_on_lease_end(s: &Server, c: &mut Connection) {
    let filler = "A".repeat(720);
    for i in 0..200 {
        call(c, &["SET", &format!("fill{i}"), &filler]).unwrap();
    }
    int(c, &["RLOCK.ACQUIRE", "x", "hx", "PX", "200"]);
    let wx = spawn_call(s, &["RLOCK.ACQUIRE", "x", "wx", "BLOCK", "0"]);
    let (r, _) = wx.join().unwrap();
    assert!(
        matches!(r, Ok(Value::Int(_))),
        "wx: {r:?}; server log:\n{}",
        s.log()
    );
}

/// Waits until `n` clients are parked on the server.
pub fn wait_parked(c: &mut Connection, n: i64) {
    wait_until(Duration::from_secs(5), || stat(c, "waiters") == n);
}

pub fn client_id(c: &mut Connection) -> i64 {
    cmd("CLIENT").arg("ID").query(c).unwrap()
}

/// A `redis-sentinel` process (Debian's `redis-sentinel` package) watching one
/// master, on its own port and directory; killed when dropped.
pub struct Sentinel {
    pub port: u16,
    dir: PathBuf,
    child: Option<Child>,
}

impl Sentinel {
    /// Monitors `master_port` on 127.0.0.1 as `name`.
    pub fn start(name: &str, master_port: u16, quorum: u32, down_after_ms: u64) -> Sentinel {
        // Another test's process may take the port between `free_port` and
        // the bind: then another port.
        for _ in 0..5 {
            if let Some(s) = Sentinel::try_start(name, master_port, quorum, down_after_ms) {
                return s;
            }
        }
        panic!("no free port for a sentinel");
    }

    /// `None` when its port was taken; panics when it fails otherwise.
    fn try_start(
        name: &str,
        master_port: u16,
        quorum: u32,
        down_after_ms: u64,
    ) -> Option<Sentinel> {
        let port = free_port();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "sentinel-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor {name} 127.0.0.1 {master_port} {quorum}\n\
                 sentinel down-after-milliseconds {name} {down_after_ms}\n\
                 sentinel failover-timeout {name} 6000\n\
                 sentinel parallel-syncs {name} 2\n",
                dir.display()
            ),
        )
        .unwrap();
        let log = std::fs::File::create(dir.join("sentinel.log")).unwrap();
        // The sentinel of the server under test (`redis-server conf --sentinel`
        // is what Debian's redis-sentinel runs; Valkey's works the same way).
        let child = Command::new(server_binary())
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {} --sentinel: {e}", server_binary()));
        let pid = child.id();
        let mut s = Sentinel {
            port,
            dir,
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Our child answering, not a process that had the port first.
            if probe_process_id(port) == Some(pid) {
                return Some(s);
            }
            if s.child.as_mut().unwrap().try_wait().unwrap().is_some() {
                s.child = None;
                let log = s.log();
                if log.contains("Address already in use") {
                    return None;
                }
                panic!("sentinel exited; log:\n{log}");
            }
            assert!(
                Instant::now() < deadline,
                "sentinel did not start:\n{}",
                s.log()
            );
            sleep(Duration::from_millis(20));
        }
    }

    fn try_client(&self) -> redis::RedisResult<Connection> {
        let c = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        let c = c.get_connection_with_timeout(Duration::from_millis(500))?;
        c.set_read_timeout(Some(Duration::from_secs(2)))?;
        Ok(c)
    }

    /// The master's port as this sentinel sees it (`SENTINEL get-master-addr-by-name`).
    pub fn master_port(&self, name: &str) -> Option<u16> {
        let mut c = self.try_client().ok()?;
        let addr: Option<(String, u16)> = cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(name)
            .query(&mut c)
            .ok()?;
        addr.map(|(_, port)| port)
    }

    /// How many other sentinels and replicas this one knows of.
    pub fn known(&self, name: &str) -> (usize, usize) {
        let Ok(mut c) = self.try_client() else {
            return (0, 0);
        };
        let count = |what: &str, c: &mut Connection| -> usize {
            cmd("SENTINEL")
                .arg(what)
                .arg(name)
                .query::<Vec<Value>>(c)
                .map(|v| v.len())
                .unwrap_or(0)
        };
        (count("sentinels", &mut c), count("replicas", &mut c))
    }

    pub fn log(&self) -> String {
        read_log(&self.dir.join("sentinel.log"))
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A seeded PRNG (splitmix64) for the randomized suites: a seed printed by a
/// failing run replays its choices.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// 0 .. n-1 (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
