//! Failover with real `redis-sentinel` processes: a master and two replicas
//! loading the module, three sentinels (quorum 2, down-after 2 s), and
//! clients that find the master through Sentinel and loop ACQUIRE (BLOCK) ->
//! WAIT 1 -> hold -> RELEASE while faults are injected. Every grant is
//! recorded (owner, key, token, server, WAIT result, times) and checked:
//!
//! - kill -9 of the master: no overlap among grants acknowledged by WAIT;
//!   tokens strictly increase per key in grant order; the killed node,
//!   restarted, becomes a replica and converges (same `DEBUG DIGEST`);
//! - SIGSTOP of the master past down-after (split brain): every token of the
//!   new master outranks every token of the deposed one, no token is issued
//!   twice; with `min-replicas-to-write 1`, no overlapping holders at all
//!   and no grant made by the deposed master after it woke. A reply that
//!   arrives after the wake can be for a grant made just before the stop
//!   (`kill -STOP` takes effect a few ms after it is started; Redis writes
//!   replies at the end of its event-loop turn): the holder asks
//!   `RLOCK.INFO` right after each reply, and a lease already over dates it.
//!
//! Sentinel may also fail over on its own when a node stalls for down-after
//! on a loaded machine; the tests follow such a failover as a tenure of its
//! own, and a kill run it disturbs is run again (a stalled master is deposed
//! alive, so the kill-only checks would not hold).
//!
//! The short runs are part of `make test`; the `#[ignore]`d long ones (more
//! clients, several rounds of each fault) run in `make test-full`.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

use common::*;

const NAME: &str = "rlockmaster";
const LEASE_MS: u64 = 2000;
const DOWN_AFTER_MS: u64 = 2000;

// ---------------------------------------------------------------------------
// The deployment

struct Deployment {
    servers: Vec<Server>,
    sentinels: Vec<Sentinel>,
}

impl Deployment {
    fn start(extra: &[&str]) -> Deployment {
        let mut args = vec![
            "--save",
            "",
            "--appendonly",
            "no",
            "--repl-diskless-sync-delay",
            "0",
        ];
        args.extend_from_slice(extra);
        let servers: Vec<Server> = (0..3).map(|_| Server::start_with(&args, &[])).collect();
        for replica in &servers[1..] {
            replica.replicate_from(&servers[0]);
        }
        // Not 1 s: a sentinel that switches to a new master resets the
        // master's ping clock but reconnects only 1 s after its last attempt
        // (it kept trying the dead master), so with down-after 1 s the new
        // master's first PONG, a few ms late on a loaded machine, marked it
        // down and Sentinel failed over a second time (CI, 3 runs of 3).
        let sentinels: Vec<Sentinel> = (0..3)
            .map(|_| Sentinel::start(NAME, servers[0].port, 2, DOWN_AFTER_MS))
            .collect();
        // Sentinels find each other (hello channel) and the replicas (INFO).
        wait_until(Duration::from_secs(20), || {
            sentinels.iter().all(|s| s.known(NAME) == (2, 2))
        });
        Deployment { servers, sentinels }
    }

    fn ports(&self) -> Vec<u16> {
        self.sentinels.iter().map(|s| s.port).collect()
    }

    fn server(&mut self, port: u16) -> &mut Server {
        self.servers.iter_mut().find(|s| s.port == port).unwrap()
    }

    /// The master a majority of sentinels agree on.
    fn master(&self) -> Option<u16> {
        let mut votes: HashMap<u16, usize> = HashMap::new();
        for s in &self.sentinels {
            if let Some(p) = s.master_port(NAME) {
                *votes.entry(p).or_default() += 1;
            }
        }
        votes.into_iter().find(|(_, n)| *n >= 2).map(|(p, _)| p)
    }

    /// Waits until the sentinels name a master other than `old` and it says
    /// it is a master; returns its port and when that was seen.
    fn wait_failover(&self, old: u16) -> (u16, Instant) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(p) = self.master().filter(|p| *p != old) {
                if role_of(p).as_deref() == Some("master") {
                    return (p, Instant::now());
                }
            }
            if Instant::now() > deadline {
                panic!("no failover within 30 s; {}", self.logs());
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// Waits until the server on `port` replicates the master the sentinels
    /// agree on, with its link up (or is that master itself), following any
    /// failover Sentinel makes meanwhile. Sentinel reconfigures a node that
    /// comes back; a Sentinel that saw its timer stall (a loaded machine)
    /// stays in TILT mode for 30 s and acts on nothing, so the wait allows
    /// for one TILT on top of `limit`.
    fn wait_replica(&self, port: u16, limit: Duration, tenures: &mut Tenures) {
        let deadline = Instant::now() + limit + Duration::from_secs(30);
        loop {
            let master = tenures.follow(self.master());
            if master == port {
                return;
            }
            let info = info_replication(port);
            let replicating = info.as_deref().is_some_and(|info| {
                info.contains("role:slave")
                    && info.contains(&format!("master_port:{master}\r"))
                    && info.contains("master_link_status:up")
            });
            if replicating {
                tenures.ended(port);
                return;
            }
            if Instant::now() > deadline {
                panic!(
                    "{port} is not a replica of {master} after {limit:?} (+30 s for a TILT); its INFO replication:\n{info:?}\n{}",
                    self.logs()
                );
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every node replicates the master the sentinels agree on
    /// and that master stayed the same throughout; returns it.
    fn wait_settled(&self, limit: Duration, tenures: &mut Tenures) -> u16 {
        loop {
            let master = tenures.current();
            for s in &self.servers {
                self.wait_replica(s.port, limit, tenures);
            }
            if tenures.current() == master {
                return master;
            }
        }
    }

    /// The sentinels' logs and the end of every server's log.
    fn logs(&self) -> String {
        let sentinels: Vec<String> = self.sentinels.iter().map(|s| s.log()).collect();
        let servers: Vec<String> = self
            .servers
            .iter()
            .map(|s| {
                let log = s.log();
                let lines: Vec<&str> = log.lines().collect();
                let tail = lines[lines.len().saturating_sub(40)..].join("\n");
                format!("server {}:\n{tail}", s.port)
            })
            .collect();
        format!(
            "sentinel logs:\n{}\n\nserver logs (last 40 lines):\n{}",
            sentinels.join("\n---\n"),
            servers.join("\n---\n")
        )
    }

    /// All three nodes hold the same data: some long locks are taken on the
    /// master, every replica acknowledges them, and `DEBUG DIGEST` agrees.
    fn assert_converged(&self, master: u16) -> String {
        let mut m = connect(master, Duration::from_secs(5)).unwrap();
        // Locks the clients left behind end within a lease.
        for i in 0..10 {
            let t = int(
                &mut m,
                &[
                    "RLOCK.ACQUIRE",
                    &format!("final:{i}"),
                    "owner",
                    "PX",
                    "60000",
                ],
            );
            assert!(t > 0);
        }
        wait_until(Duration::from_secs(LEASE_MS / 1000 + 8), || {
            int(&mut m, &["DBSIZE"]) == 10
        });
        let acked: i64 = cmd("WAIT").arg(2).arg(5000).query(&mut m).unwrap();
        assert_eq!(acked, 2, "both replicas acknowledge");
        let digests: Vec<String> = self
            .servers
            .iter()
            .map(|s| {
                let mut c = connect(s.port, Duration::from_secs(5)).unwrap();
                cmd("DEBUG").arg("DIGEST").query(&mut c).unwrap()
            })
            .collect();
        assert!(
            digests.iter().all(|d| *d == digests[0]),
            "datasets differ: {digests:?}"
        );
        assert_ne!(digests[0], "0".repeat(40));
        digests[0].clone()
    }
}

fn connect(port: u16, read_timeout: Duration) -> redis::RedisResult<Connection> {
    let c = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?
        .get_connection_with_timeout(Duration::from_millis(500))?;
    c.set_read_timeout(Some(read_timeout))?;
    c.set_write_timeout(Some(Duration::from_secs(2)))?;
    Ok(c)
}

fn info_replication(port: u16) -> Option<String> {
    let mut c = connect(port, Duration::from_secs(1)).ok()?;
    cmd("INFO").arg("replication").query(&mut c).ok()
}

fn role_of(port: u16) -> Option<String> {
    let mut c = connect(port, Duration::from_secs(1)).ok()?;
    let role: Vec<Value> = cmd("ROLE").query(&mut c).ok()?;
    role.first().map(as_string)
}

// ---------------------------------------------------------------------------
// Clients and the history they record

#[derive(Clone, Debug)]
struct Grant {
    owner: String,
    key: String,
    token: i64,
    server: u16,
    /// WAIT 1 100 on the granted connection (-1: it failed).
    acks: i64,
    /// Since the run started: ACQUIRE sent, reply received, hold given up
    /// (RELEASE about to be sent, or the connection failed).
    sent: Duration,
    granted: Duration,
    ended: Duration,
    /// `RLOCK.INFO` right after the reply: whether this holding was still on
    /// (None: the query failed), and when its answer came. A reply can leave
    /// the server long after the grant (made just before a SIGSTOP, sent on
    /// waking); a lease already over by then dates the grant.
    held_on_receipt: Option<bool>,
    checked: Duration,
}

impl Grant {
    /// When the holder may act as the holder: from the reply until it lets
    /// go, never past the earliest moment its lease can end on the server.
    fn safe(&self) -> (Duration, Duration) {
        let lease_end = self.sent + Duration::from_millis(LEASE_MS);
        (self.granted, self.ended.min(lease_end))
    }

    fn overlaps(&self, other: &Grant) -> bool {
        let ((a0, a1), (b0, b1)) = (self.safe(), other.safe());
        self.key == other.key && self.owner != other.owner && a0 < b1 && b0 < a1
    }
}

struct ClientOptions {
    clients: usize,
    keys: usize,
    /// BLOCK of each ACQUIRE, cycled over clients.
    blocks: &'static [u64],
    /// Read timeout of client connections: longer than a freeze lets a
    /// deposed master answer them when it wakes (the worst case for safety).
    read_timeout: Duration,
    max_hold_ms: u64,
}

struct Clients {
    stop: Arc<AtomicBool>,
    history: Arc<Mutex<Vec<Grant>>>,
    errors: Arc<AtomicU64>,
    threads: Vec<JoinHandle<()>>,
    start: Instant,
}

impl Clients {
    fn run(sentinels: Vec<u16>, opts: ClientOptions) -> Clients {
        let stop = Arc::new(AtomicBool::new(false));
        let history = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(AtomicU64::new(0));
        let start = Instant::now();
        let threads = (0..opts.clients)
            .map(|id| {
                let (stop, history, errors) = (stop.clone(), history.clone(), errors.clone());
                let sentinels = sentinels.clone();
                let block = opts.blocks[id % opts.blocks.len()];
                let (keys, read_timeout, max_hold) =
                    (opts.keys, opts.read_timeout, opts.max_hold_ms);
                std::thread::spawn(move || {
                    client_loop(
                        id,
                        &sentinels,
                        keys,
                        block,
                        read_timeout,
                        max_hold,
                        start,
                        &stop,
                        &history,
                        &errors,
                    )
                })
            })
            .collect();
        Clients {
            stop,
            history,
            errors,
            threads,
            start,
        }
    }

    fn since_start(&self) -> Duration {
        self.start.elapsed()
    }

    fn finish(self) -> (Vec<Grant>, u64) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        let history = std::mem::take(&mut *self.history.lock().unwrap());
        (history, self.errors.load(Ordering::Relaxed))
    }
}

/// Asks the sentinels, in turn, where the master is (as redis-py's Sentinel
/// does), and connects if that server says it is the master.
fn discover(
    sentinels: &[u16],
    turn: &mut usize,
    read_timeout: Duration,
) -> Option<(u16, Connection)> {
    for _ in 0..sentinels.len() {
        *turn += 1;
        let s = sentinels[*turn % sentinels.len()];
        let Ok(mut sc) = connect(s, Duration::from_millis(500)) else {
            continue;
        };
        let addr: Option<(String, u16)> = cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(NAME)
            .query(&mut sc)
            .ok()
            .flatten();
        let Some((_, port)) = addr else { continue };
        let Ok(mut c) = connect(port, Duration::from_millis(1000)) else {
            continue;
        };
        let role: Option<Vec<Value>> = cmd("ROLE").query(&mut c).ok();
        if role.and_then(|r| r.first().map(as_string)).as_deref() == Some("master") {
            c.set_read_timeout(Some(read_timeout)).ok()?;
            return Some((port, c));
        }
    }
    None
}

#[allow(clippy::too_many_arguments)]
fn client_loop(
    id: usize,
    sentinels: &[u16],
    keys: usize,
    block: u64,
    read_timeout: Duration,
    max_hold: u64,
    start: Instant,
    stop: &AtomicBool,
    history: &Mutex<Vec<Grant>>,
    errors: &AtomicU64,
) {
    let mut turn = id;
    let mut seq = 0u64;
    // A small deterministic generator per client: keys and hold times.
    let mut rng = (id as u64 + 1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = move |n: u64| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng % n.max(1)
    };
    'discover: while !stop.load(Ordering::Relaxed) {
        let Some((port, mut c)) = discover(sentinels, &mut turn, read_timeout) else {
            sleep(Duration::from_millis(50));
            continue;
        };
        while !stop.load(Ordering::Relaxed) {
            seq += 1;
            let owner = format!("c{id}:{seq}");
            let key = format!("lock:{}", next(keys as u64));
            let sent = start.elapsed();
            let reply = call(
                &mut c,
                &[
                    "RLOCK.ACQUIRE",
                    &key,
                    &owner,
                    "PX",
                    &LEASE_MS.to_string(),
                    "BLOCK",
                    &block.to_string(),
                ],
            );
            let token = match reply {
                Ok(Value::Int(t)) => t,
                Ok(_) => continue,
                Err(_) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                    sleep(Duration::from_millis(20));
                    continue 'discover;
                }
            };
            let granted = start.elapsed();
            let held_on_receipt = still_held(&mut c, &key, token);
            let checked = start.elapsed();
            let acks: i64 = cmd("WAIT").arg(1).arg(100).query(&mut c).unwrap_or(-1);
            let mut grant = Grant {
                owner,
                key,
                token,
                server: port,
                acks,
                sent,
                granted,
                ended: granted,
                held_on_receipt,
                checked,
            };
            if acks < 0 {
                grant.ended = start.elapsed();
                history.lock().unwrap().push(grant);
                errors.fetch_add(1, Ordering::Relaxed);
                continue 'discover;
            }
            sleep(Duration::from_millis(next(max_hold)));
            grant.ended = start.elapsed();
            let released = call(&mut c, &["RLOCK.RELEASE", &grant.key, &grant.owner]);
            history.lock().unwrap().push(grant);
            if released.is_err() {
                errors.fetch_add(1, Ordering::Relaxed);
                continue 'discover;
            }
        }
    }
}

/// Whether `token` still holds `key` with lease left (RLOCK.INFO; read-only,
/// so a master refusing writes answers it too). None if the query failed.
fn still_held(c: &mut Connection, key: &str, token: i64) -> Option<bool> {
    let reply: Value = cmd("RLOCK.INFO").arg(key).query(c).ok()?;
    Some(parse_info(reply).is_some_and(|info| {
        as_int(&field(&info, "token")) == token && as_int(&field(&info, "ttl")) > 0
    }))
}

// ---------------------------------------------------------------------------
// The checks

fn overlapping(grants: &[&Grant]) -> Vec<(Grant, Grant)> {
    let mut by_key: HashMap<&str, Vec<&Grant>> = HashMap::new();
    for g in grants {
        by_key.entry(&g.key).or_default().push(g);
    }
    let mut out = vec![];
    for list in by_key.values_mut() {
        list.sort_by_key(|g| g.granted);
        for (i, a) in list.iter().enumerate() {
            for b in &list[i + 1..] {
                if b.granted >= a.safe().1 {
                    break;
                }
                if a.overlaps(b) {
                    out.push(((*a).clone(), (*b).clone()));
                }
            }
        }
    }
    out
}

/// Per key, in the order the grants reached their clients, tokens strictly increase.
fn tokens_out_of_order(history: &[Grant]) -> Vec<(Grant, Grant)> {
    let mut by_key: HashMap<&str, Vec<&Grant>> = HashMap::new();
    for g in history {
        by_key.entry(&g.key).or_default().push(g);
    }
    let mut out = vec![];
    for list in by_key.values_mut() {
        list.sort_by_key(|g| g.granted);
        for w in list.windows(2) {
            if w[1].token <= w[0].token {
                out.push((w[0].clone(), w[1].clone()));
            }
        }
    }
    out
}

/// The same token handed to two different owners (on any keys, any servers).
fn duplicate_tokens(history: &[Grant]) -> Vec<(Grant, Grant)> {
    let mut seen: HashMap<i64, &Grant> = HashMap::new();
    let mut out = vec![];
    for g in history {
        if let Some(prev) = seen.insert(g.token, g) {
            out.push((prev.clone(), g.clone()));
        }
    }
    out
}

fn summary(label: &str, history: &[Grant], errors: u64) {
    let mut per_server: HashMap<u16, usize> = HashMap::new();
    for g in history {
        *per_server.entry(g.server).or_default() += 1;
    }
    let acked = history.iter().filter(|g| g.acks >= 1).count();
    eprintln!(
        "[{label}] {} grants ({acked} acknowledged by WAIT) per server {per_server:?}, {errors} client errors",
        history.len()
    );
}

/// One server's time as (possibly deposed) master: from the fault that made
/// it master (0 for the first) until it was seen back as a replica (or the
/// end). A server is master again only after a later fault, so its tenures
/// never overlap.
#[derive(Clone, Copy, Debug)]
struct Tenure {
    server: u16,
    from: Duration,
    until: Duration,
    /// Made master by a fault the test injected (not by Sentinel on its own).
    planned: bool,
}

impl Tenure {
    fn grants<'a>(&self, history: &'a [Grant]) -> Vec<&'a Grant> {
        history
            .iter()
            .filter(|g| {
                g.server == self.server && g.granted >= self.from && g.granted <= self.until
            })
            .collect()
    }
}

/// The masters of a run in the order Sentinel made them. Sentinel also fails
/// over on its own when a node stops answering for down-after (2 s here; a
/// stalled fsync on a loaded machine is enough), so every master the
/// sentinels agree on gets a tenure, whatever made it master.
struct Tenures {
    list: Vec<Tenure>,
    start: Instant,
}

impl Tenures {
    fn new(first: u16, start: Instant) -> Tenures {
        let list = vec![Tenure {
            server: first,
            from: Duration::ZERO,
            until: Duration::MAX,
            planned: true,
        }];
        Tenures { list, start }
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn current(&self) -> u16 {
        self.list.last().unwrap().server
    }

    /// `server` was made master by the fault injected at `fault_at`.
    fn promoted(&mut self, server: u16, fault_at: Duration) {
        self.list.push(Tenure {
            server,
            from: fault_at,
            until: Duration::MAX,
            planned: true,
        });
    }

    /// Records a master the sentinels agree on that the test did not cause.
    /// It was a replica, which grants nothing, since its last tenure ended.
    fn follow(&mut self, agreed: Option<u16>) -> u16 {
        let current = self.current();
        let Some(master) = agreed.filter(|m| *m != current) else {
            return current;
        };
        // A deposed master made master again before it was ever seen as a
        // replica: its old tenure ends here.
        let now = self.now();
        let from = match self.list.iter_mut().rev().find(|t| t.server == master) {
            Some(t) if t.until == Duration::MAX => {
                t.until = now;
                now
            }
            Some(t) => t.until,
            None => Duration::ZERO,
        };
        eprintln!("[failover] Sentinel made {master} master on its own ({now:?} into the run)");
        self.list.push(Tenure {
            server: master,
            from,
            until: Duration::MAX,
            planned: false,
        });
        master
    }

    /// `server` was seen replicating: its time as a (deposed) master is over.
    fn ended(&mut self, server: u16) {
        let now = self.now();
        let last = self.list.len() - 1;
        for t in &mut self.list[..last] {
            if t.server == server && t.until == Duration::MAX {
                t.until = now;
            }
        }
    }

    /// Every token of a tenure is above every token of the one before it (the
    /// master it replaced, also while that one kept granting as a deposed
    /// master). A master the test made must have granted; one Sentinel made
    /// on its own late in the run may not have had the time.
    fn assert_ordered(&self, history: &[Grant]) {
        for pair in self.list.windows(2) {
            let (old, new) = (pair[0].grants(history), pair[1].grants(history));
            assert!(
                !new.is_empty() || !pair[1].planned,
                "no grants on the new master {:?}",
                pair[1]
            );
            let max_old = old.iter().map(|g| g.token).max();
            let min_new = new.iter().map(|g| g.token).min();
            if let (Some(o), Some(n)) = (max_old, min_new) {
                assert!(
                    n > o,
                    "a token of master {:?} ({o}) outranks its successor's {:?} ({n})",
                    pair[0],
                    pair[1]
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Scenarios

struct Timing {
    warmup: Duration,
    after: Duration,
}

/// kill -9 of the master, failover, restart of the killed node as a replica.
/// False when Sentinel also failed over on its own, which turns the run into
/// a split brain where only some of the checks apply.
fn kill_scenario(clients: usize, rounds: usize, timing: &Timing) -> bool {
    let mut d = Deployment::start(&[]);
    let run = Clients::run(
        d.ports(),
        ClientOptions {
            clients,
            keys: 3,
            blocks: &[1000, 3000],
            read_timeout: Duration::from_secs(3),
            max_hold_ms: 300,
        },
    );
    let mut tenures = Tenures::new(d.servers[0].port, run.start);
    for round in 0..rounds {
        sleep(timing.warmup);
        let old = tenures.follow(d.master());
        let killed_at = run.since_start();
        let killed = Instant::now();
        d.server(old).kill();
        let (new, seen) = d.wait_failover(old);
        eprintln!(
            "[kill round {round}] master {old} killed at {killed_at:?}; {new} promoted after {:?}",
            seen - killed
        );
        tenures.promoted(new, killed_at);
        // A killed master grants nothing more.
        tenures.ended(old);
        sleep(timing.after);
        // The killed node comes back empty; Sentinel makes it a replica.
        d.server(old).start_again();
        d.wait_replica(old, Duration::from_secs(30), &mut tenures);
        eprintln!(
            "[kill round {round}] {old} rejoined as a replica of {}",
            tenures.current()
        );
    }
    sleep(Duration::from_millis(500));
    let (history, errors) = run.finish();
    // Every node ends with the same data.
    let master = d.wait_settled(Duration::from_secs(30), &mut tenures);
    let digest = d.assert_converged(master);
    summary("kill", &history, errors);
    eprintln!("[kill] converged, digest {digest}");

    tenures.assert_ordered(&history);
    let dups = duplicate_tokens(&history);
    assert!(dups.is_empty(), "a token was issued twice: {dups:#?}");
    let all: Vec<&Grant> = history.iter().collect();
    eprintln!(
        "[kill] overlaps among all grants (acknowledged or not): {}",
        overlapping(&all).len()
    );
    if let Some(t) = tenures.list.iter().find(|t| !t.planned) {
        // A master that stalled was deposed alive and granted until it
        // rejoined, as in a freeze: the checks above hold for that too, the
        // ones below only when every deposed master was dead.
        eprintln!(
            "[kill] Sentinel also failed over on its own (to {}): this run cannot check a kill alone",
            t.server
        );
        // Why Sentinel did, for whoever reads a run that was disturbed.
        eprintln!("{}", d.logs());
        return false;
    }
    let acked: Vec<&Grant> = history.iter().filter(|g| g.acks >= 1).collect();
    let overlaps = overlapping(&acked);
    assert!(
        overlaps.is_empty(),
        "acknowledged grants overlap: {overlaps:#?}"
    );
    let disorder = tokens_out_of_order(&history);
    assert!(
        disorder.is_empty(),
        "tokens not increasing per key: {disorder:#?}"
    );
    true
}

/// Whether the server surely made this grant before it woke at `thawed_at`
/// (taken before SIGCONT): its lease was over when the holder asked right
/// after the reply, so it began at least a lease before that question, and
/// if that is before the wake, it was before the stop (a stopped server
/// grants nothing).
fn granted_before_waking(g: &Grant, thawed_at: Duration) -> bool {
    g.held_on_receipt == Some(false) && g.checked < thawed_at + Duration::from_millis(LEASE_MS)
}

/// SIGSTOP of the master past down-after: Sentinel promotes a replica while
/// the old master sleeps; it wakes as a deposed master until Sentinel turns
/// it into a replica.
fn freeze_scenario(min_replicas: bool, clients: usize, rounds: usize, timing: &Timing) {
    let extra: &[&str] = if min_replicas {
        &[
            "--min-replicas-to-write",
            "1",
            "--min-replicas-max-lag",
            "1",
        ]
    } else {
        &[]
    };
    let label = if min_replicas {
        "freeze, min-replicas-to-write 1"
    } else {
        "freeze"
    };
    let mut d = Deployment::start(extra);
    let run = Clients::run(
        d.ports(),
        ClientOptions {
            clients,
            keys: 3,
            // Some waits outlast the freeze, so the deposed master still has
            // in-time waiters to hand a lock to when it wakes.
            blocks: &[1000, 9000],
            read_timeout: Duration::from_secs(12),
            max_hold_ms: 300,
        },
    );
    let mut tenures = Tenures::new(d.servers[0].port, run.start);
    let mut freezes = vec![];
    for round in 0..rounds {
        sleep(timing.warmup);
        let old = tenures.follow(d.master());
        let frozen_at = run.since_start();
        d.server(old).freeze();
        let (new, _) = d.wait_failover(old);
        // Stay frozen a little longer than the failover took.
        sleep(Duration::from_millis(1000));
        // Taken before SIGCONT, so every grant made on waking comes after it.
        let thawed_at = run.since_start();
        d.server(old).thaw();
        eprintln!(
            "[{label} round {round}] {old} frozen {frozen_at:?}..{thawed_at:?}; {new} promoted"
        );
        tenures.promoted(new, frozen_at);
        let deposed = tenures.list.len() - 2;
        // The deposed master's tenure lasts until it is a replica again.
        d.wait_replica(old, Duration::from_secs(30), &mut tenures);
        let rejoined = tenures.list[deposed].until;
        freezes.push((tenures.list[deposed], thawed_at));
        eprintln!(
            "[{label} round {round}] {old} is a replica of {} again at {rejoined:?}",
            tenures.current()
        );
        sleep(timing.after);
    }
    let (history, errors) = run.finish();
    summary(label, &history, errors);
    let master = d.wait_settled(Duration::from_secs(30), &mut tenures);
    d.assert_converged(master);

    tenures.assert_ordered(&history);
    for (deposed, thawed_at) in &freezes {
        let (early, woke): (Vec<&Grant>, Vec<&Grant>) = deposed
            .grants(&history)
            .into_iter()
            .filter(|g| g.granted >= *thawed_at)
            .partition(|g| granted_before_waking(g, *thawed_at));
        eprintln!(
            "[{label}] deposed master {} granted {} locks between waking ({thawed_at:?}) and rejoining ({:?}); \
             {} more replies came after waking for grants made before the freeze",
            deposed.server,
            woke.len(),
            deposed.until,
            early.len()
        );
        if min_replicas {
            assert!(woke.is_empty(), "the deposed master granted: {woke:#?}");
        }
    }
    let dups = duplicate_tokens(&history);
    assert!(dups.is_empty(), "a token was issued twice: {dups:#?}");
    let all: Vec<&Grant> = history.iter().collect();
    let overlaps = overlapping(&all);
    eprintln!("[{label}] overlapping holders: {}", overlaps.len());
    if min_replicas {
        assert!(overlaps.is_empty(), "holders overlap: {overlaps:#?}");
    }
}

const SHORT: Timing = Timing {
    warmup: Duration::from_millis(2000),
    after: Duration::from_millis(2000),
};
const LONG: Timing = Timing {
    warmup: Duration::from_millis(5000),
    after: Duration::from_millis(5000),
};

/// Runs a kill scenario until one run has only the failovers the test
/// caused (at most `attempts` runs).
fn kill_checked(clients: usize, rounds: usize, timing: &Timing, attempts: usize) {
    for attempt in 1..=attempts {
        if kill_scenario(clients, rounds, timing) {
            return;
        }
        eprintln!("[kill] attempt {attempt} of {attempts} was disturbed by an unplanned failover");
    }
    panic!("every run had an unplanned failover: the kill checks did not run");
}

#[test]
fn kill_of_the_master() {
    kill_checked(6, 1, &SHORT, 3);
}

#[test]
fn freeze_of_the_master() {
    freeze_scenario(false, 6, 1, &SHORT);
}

#[test]
fn freeze_of_the_master_with_min_replicas_to_write() {
    freeze_scenario(true, 6, 1, &SHORT);
}

/// The dating of late replies the freeze check relies on: `still_held` reads
/// a real server's view, and only a lease over before a lease past the wake
/// clears a grant (the reply of the CI run that found this: sent 2.007 s, at
/// 2.004 s the SIGSTOP was started, answered 5.302 s, the wake about 5.300 s).
#[test]
fn a_late_reply_is_dated_by_the_lease_the_server_reports() {
    let s = Server::start();
    let mut c = s.client();
    let token = int(&mut c, &["RLOCK.ACQUIRE", "k", "o", "PX", "300"]);
    assert_eq!(still_held(&mut c, "k", token), Some(true));
    assert_eq!(still_held(&mut c, "k", token + 1), Some(false));
    assert_eq!(still_held(&mut c, "other", token), Some(false));
    sleep(Duration::from_millis(400));
    assert_eq!(still_held(&mut c, "k", token), Some(false));
    drop(s);
    assert_eq!(still_held(&mut c, "k", token), None);

    let ms = Duration::from_millis;
    let late = |held_on_receipt, checked| Grant {
        owner: "c3:9".into(),
        key: "k".into(),
        token,
        server: 1,
        acks: 0,
        sent: ms(2007),
        granted: ms(5302),
        ended: ms(5538),
        held_on_receipt,
        checked,
    };
    let woke = ms(5300);
    assert!(granted_before_waking(&late(Some(false), ms(5303)), woke));
    // Still held, or not known: it may have been granted on waking.
    assert!(!granted_before_waking(&late(Some(true), ms(5303)), woke));
    assert!(!granted_before_waking(&late(None, ms(5303)), woke));
    // Over only when asked a lease after the wake: it may be a grant made on waking.
    assert!(!granted_before_waking(&late(Some(false), ms(7400)), woke));
}

#[test]
#[ignore = "long: make test-full"]
fn long_kills_of_the_master() {
    kill_checked(16, 3, &LONG, 3);
}

#[test]
#[ignore = "long: make test-full"]
fn long_freezes_of_the_master() {
    freeze_scenario(false, 16, 3, &LONG);
}

#[test]
#[ignore = "long: make test-full"]
fn long_freezes_of_the_master_with_min_replicas_to_write() {
    freeze_scenario(true, 16, 3, &LONG);
}
