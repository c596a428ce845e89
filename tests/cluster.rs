//! Redis Cluster: three masters on loopback, each loading the module.
//! SPEC: "Every command touches one key at a fixed position, so Redis Cluster
//! routes it and ACL key patterns apply. Hash tags (`{order:42}:lock`) work as
//! usual."

mod common;

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::get_slot;
use redis::{ConnectionLike, ErrorKind, RedisResult};

const FAMILIES: [&str; 3] = ["RLOCK", "FAIRLOCK", "RWLOCK"];

struct Cluster {
    nodes: Vec<Server>,
    ids: Vec<String>,
}

/// A cluster-enabled server, not yet in any cluster.
fn start_node() -> Server {
    start_node_with_aof("no")
}

/// `start_node` with `appendonly` as given.
fn start_node_with_aof(appendonly: &str) -> Server {
    // The bus port is explicit: port + 10000 may not exist.
    let bus = free_port().to_string();
    Server::start_with(
        &[
            "--save",
            "",
            "--appendonly",
            appendonly,
            "--cluster-enabled",
            "yes",
            // Each server has its own --dir, so the name is unique.
            "--cluster-config-file",
            "nodes.conf",
            "--cluster-port",
            &bus,
            "--cluster-node-timeout",
            "15000",
        ],
        &[],
    )
}

impl Cluster {
    fn start() -> Cluster {
        let nodes: Vec<Server> = (0..3).map(|_| start_node()).collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for n in &nodes {
            create.arg(format!("127.0.0.1:{}", n.port));
        }
        let out = create.arg("--cluster-yes").output().expect("redis-cli");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut clients: Vec<Connection> = nodes.iter().map(|n| n.client()).collect();
        wait_until(Duration::from_secs(30), || {
            clients.iter_mut().all(|c| {
                let info: String = cmd("CLUSTER").arg("INFO").query(c).unwrap();
                info.contains("cluster_state:ok")
                    && info.contains("cluster_slots_assigned:16384")
                    && info.contains("cluster_known_nodes:3")
            })
        });
        let ids = clients
            .iter_mut()
            .map(|c| cmd("CLUSTER").arg("MYID").query(c).unwrap())
            .collect();
        let cluster = Cluster { nodes, ids };
        // Every node agrees on who owns every slot.
        wait_until(Duration::from_secs(30), || {
            let maps: Vec<Vec<(u16, u16, u16)>> =
                (0..3).map(|i| cluster.slot_map(&mut clients[i])).collect();
            maps.iter().all(|m| m == &maps[0] && m.len() == 3)
        });
        cluster
    }

    /// (first slot, last slot, master port), sorted.
    fn slot_map(&self, c: &mut Connection) -> Vec<(u16, u16, u16)> {
        let slots: Vec<Value> = cmd("CLUSTER").arg("SLOTS").query(c).unwrap();
        let mut out: Vec<(u16, u16, u16)> = slots
            .iter()
            .map(|range| match range {
                Value::Array(items) => {
                    let master = match &items[2] {
                        Value::Array(m) => as_int(&m[1]) as u16,
                        other => panic!("CLUSTER SLOTS master {other:?}"),
                    };
                    (as_int(&items[0]) as u16, as_int(&items[1]) as u16, master)
                }
                other => panic!("CLUSTER SLOTS entry {other:?}"),
            })
            .collect();
        out.sort();
        out
    }

    /// Index of the node that serves `slot`, from node 0's view.
    fn owner(&self, slot: u16) -> usize {
        let mut c = self.nodes[0].client();
        let port = self
            .slot_map(&mut c)
            .into_iter()
            .find(|(lo, hi, _)| (*lo..=*hi).contains(&slot))
            .map(|(_, _, p)| p)
            .unwrap();
        self.nodes.iter().position(|n| n.port == port).unwrap()
    }

    /// A fourth node, made a replica of node `of`; returned once it is synced
    /// and its master counts it online.
    fn add_replica(&self, of: usize) -> Server {
        let replica = start_node();
        let mut r = replica.client();
        let master = &self.nodes[of];
        let mut m = master.client();
        // Its bus port, as it gives it: `<id> <ip>:<port>@<bus port> myself,...`.
        let nodes: String = cmd("CLUSTER").arg("NODES").query(&mut m).unwrap();
        let bus = nodes
            .lines()
            .find(|l| l.contains("myself"))
            .and_then(|l| l.split(['@', ' ', ',']).nth(2))
            .unwrap_or_else(|| panic!("no bus port in {nodes}"))
            .to_string();
        let _: () = cmd("CLUSTER")
            .arg("MEET")
            .arg("127.0.0.1")
            .arg(master.port)
            .arg(bus)
            .query(&mut r)
            .unwrap();
        wait_until(Duration::from_secs(30), || {
            let nodes: String = cmd("CLUSTER").arg("NODES").query(&mut r).unwrap();
            nodes.contains(&self.ids[of])
        });
        let _: () = cmd("CLUSTER")
            .arg("REPLICATE")
            .arg(&self.ids[of])
            .query(&mut r)
            .unwrap();
        wait_until(Duration::from_secs(30), || {
            replication(&mut r, "master_link_status").as_deref() == Some("up")
                && replication(&mut m, "slave0").is_some_and(|s| s.contains("state=online"))
        });
        replica
    }

    fn client(&self) -> ClusterConnection {
        ClusterClient::builder(
            self.nodes
                .iter()
                .map(|n| format!("redis://127.0.0.1:{}/", n.port))
                .collect::<Vec<_>>(),
        )
        .response_timeout(Duration::from_secs(30))
        .build()
        .unwrap()
        .get_connection()
        .unwrap()
    }
}

/// `call` for any connection (cluster or plain).
fn q<C: ConnectionLike>(c: &mut C, args: &[&str]) -> RedisResult<Value> {
    let mut command = cmd(args[0]);
    for a in &args[1..] {
        command.arg(*a);
    }
    command.query(c)
}

fn qint<C: ConnectionLike>(c: &mut C, args: &[&str]) -> i64 {
    match q(c, args) {
        Ok(Value::Int(v)) => v,
        other => panic!("{args:?}: expected an integer, got {other:?}"),
    }
}

fn qinfo<C: ConnectionLike>(c: &mut C, args: &[&str]) -> Option<Vec<(String, Value)>> {
    parse_info(q(c, args).unwrap())
}

fn acquire_args<'a>(family: &str, key: &'a str, owner: &'a str) -> Vec<String> {
    let mut v = vec![format!("{family}.ACQUIRE"), key.to_string()];
    if family == "RWLOCK" {
        v.push("WRITE".into());
    }
    v.extend([owner.to_string(), "PX".into(), "60000".into()]);
    v
}

fn release_args(family: &str, key: &str, owner: &str) -> Vec<String> {
    let mut v = vec![format!("{family}.RELEASE"), key.to_string()];
    if family == "RWLOCK" {
        v.push("WRITE".into());
    }
    v.push(owner.to_string());
    v
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(|s| s.as_str()).collect()
}

/// A field of `INFO replication`.
fn replication(c: &mut Connection, name: &str) -> Option<String> {
    let info: String = cmd("INFO").arg("replication").query(c).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .map(|v| v.trim().to_string())
}

/// `INFO commandstats` of one command: (calls, failed calls).
fn command_calls(c: &mut Connection, name: &str) -> (i64, i64) {
    let stats: String = cmd("INFO").arg("commandstats").query(c).unwrap();
    let Some(line) = stats
        .lines()
        .find_map(|l| l.strip_prefix(&format!("cmdstat_{name}:")))
    else {
        return (0, 0);
    };
    let count = |what: &str| {
        line.split(',')
            .find_map(|f| f.strip_prefix(&format!("{what}=")))
            .map_or(0, |v| v.parse().unwrap())
    };
    (count("calls"), count("failed_calls"))
}

fn dbsize(s: &Server) -> i64 {
    int(&mut s.client(), &["DBSIZE"])
}

#[test]
fn a_thousand_locks_spread_over_the_slots() {
    let cluster = Cluster::start();
    let mut cc = cluster.client();
    let keys: Vec<String> = (0..1000).map(|i| format!("lock:{i}")).collect();
    let mut slots = std::collections::HashSet::new();
    let mut tokens = Vec::new();
    for (i, key) in keys.iter().enumerate() {
        let family = FAMILIES[i % 3];
        let owner = format!("owner-{i}");
        slots.insert(get_slot(key.as_bytes()));
        let t = qint(&mut cc, &refs(&acquire_args(family, key, &owner)));
        assert!(t > 0, "{key}");
        tokens.push(t);
    }
    assert!(slots.len() > 900, "keys spread over {} slots", slots.len());
    // Every node holds its share, and only keys of its own slots.
    let per_node: Vec<i64> = cluster.nodes.iter().map(dbsize).collect();
    assert_eq!(per_node.iter().sum::<i64>(), 1000, "{per_node:?}");
    assert!(per_node.iter().all(|n| *n > 200), "{per_node:?}");
    for (i, node) in cluster.nodes.iter().enumerate() {
        let mut c = node.client();
        assert_eq!(stat(&mut c, "locks"), per_node[i], "INFO rlock on node {i}");
    }
    for (i, key) in keys.iter().enumerate() {
        let family = FAMILIES[i % 3];
        let info = qinfo(&mut cc, &[&format!("{family}.INFO"), key])
            .unwrap_or_else(|| panic!("{family}.INFO {key}: nil"));
        assert_eq!(as_string(&field(&info, "kind")), family.to_lowercase());
        let owner = if family == "RWLOCK" {
            "writer"
        } else {
            "owner"
        };
        assert_eq!(as_string(&field(&info, owner)), format!("owner-{i}"));
        let token = if family == "RWLOCK" {
            "writer_token"
        } else {
            "token"
        };
        assert_eq!(as_int(&field(&info, token)), tokens[i], "{key}");
        let owner = format!("owner-{i}");
        assert_eq!(
            qint(
                &mut cc,
                &[&format!("{family}.RENEW"), key, &owner, "PX", "60000"]
            ),
            1
        );
    }
    for (i, key) in keys.iter().enumerate() {
        let family = FAMILIES[i % 3];
        let owner = format!("owner-{i}");
        assert_eq!(qint(&mut cc, &refs(&release_args(family, key, &owner))), 0);
        assert!(qinfo(&mut cc, &[&format!("{family}.INFO"), key]).is_none());
    }
    let per_node: Vec<i64> = cluster.nodes.iter().map(dbsize).collect();
    assert_eq!(per_node, vec![0, 0, 0]);
}

#[test]
fn hash_tagged_keys_land_on_one_node() {
    let cluster = Cluster::start();
    let mut cc = cluster.client();
    let (a, b) = ("{order:42}:a", "{order:42}:b");
    assert_eq!(get_slot(a.as_bytes()), get_slot(b.as_bytes()));
    let ta = qint(&mut cc, &["RLOCK.ACQUIRE", a, "w", "PX", "60000"]);
    let tb = qint(&mut cc, &["FAIRLOCK.ACQUIRE", b, "w", "PX", "60000"]);
    assert!(tb > ta, "one node issued both: {ta} then {tb}");
    let home = cluster.owner(get_slot(a.as_bytes()));
    let mut c = cluster.nodes[home].client();
    let slot = get_slot(a.as_bytes()).to_string();
    assert_eq!(int(&mut c, &["EXISTS", a, b]), 2);
    assert_eq!(
        int(&mut c, &["CLUSTER", "COUNTKEYSINSLOT", &slot]),
        2,
        "both keys in the tag's slot"
    );
    // Multi-key transactions and scripts work within the tag...
    let (ra, rb): (i64, i64) = redis::pipe()
        .atomic()
        .cmd("RLOCK.RELEASE")
        .arg(a)
        .arg("w")
        .cmd("FAIRLOCK.RELEASE")
        .arg(b)
        .arg("w")
        .query(&mut c)
        .unwrap();
    assert_eq!((ra, rb), (0, 0));
    let script = "return {redis.call('RLOCK.ACQUIRE', KEYS[1], ARGV[1]), \
                  redis.call('RLOCK.ACQUIRE', KEYS[2], ARGV[1])}";
    let both: Vec<i64> = cmd("EVAL")
        .arg(script)
        .arg(2)
        .arg(a)
        .arg(b)
        .arg("s")
        .query(&mut cc)
        .unwrap();
    assert_eq!(both.len(), 2);
    assert_eq!(int(&mut c, &["EXISTS", a, b]), 2);
    // ...and are refused across slots.
    let other = (0..)
        .map(|i| format!("elsewhere:{i}"))
        .find(|k| get_slot(k.as_bytes()) != get_slot(a.as_bytes()))
        .unwrap();
    let err = q(&mut c, &["EVAL", script, "2", a, &other, "s"]).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::CrossSlot) || err.to_string().contains("CROSSSLOT"),
        "{err}"
    );
    for k in [a, b] {
        assert_eq!(qint(&mut cc, &["RLOCK.RELEASE", k, "s"]), 0);
    }
    assert_eq!(int(&mut c, &["DBSIZE"]), 0);
    // RLOCK.ACQUIREALL: one slot by hash tag, CROSSSLOT (from Redis) otherwise.
    let (x, y) = ("{order:42}:x", "{order:42}:y");
    let got = q(&mut cc, &["RLOCK.ACQUIREALL", "2", x, y, "m"]).unwrap();
    assert!(
        matches!(got, Value::Array(ref t) if t.len() == 2),
        "{got:?}"
    );
    assert_eq!(int(&mut c, &["EXISTS", x, y]), 2);
    let err = q(&mut c, &["RLOCK.ACQUIREALL", "2", x, &other, "m"]).unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::CrossSlot) || err.to_string().contains("CROSSSLOT"),
        "{err}"
    );
    let err = q(&mut c, &["RLOCK.RELEASEALL", "2", &other, x, "m"]).unwrap_err();
    assert!(matches!(err.kind(), ErrorKind::CrossSlot), "{err}");
    let left = q(&mut cc, &["RLOCK.RELEASEALL", "2", x, y, "m"]).unwrap();
    assert_eq!(left, Value::Array(vec![Value::Int(0), Value::Int(0)]));
    assert_eq!(int(&mut c, &["DBSIZE"]), 0);
}

#[test]
fn plain_connection_to_the_wrong_node_gets_moved() {
    let cluster = Cluster::start();
    let key = "order:7";
    let slot = get_slot(key.as_bytes());
    let home = cluster.owner(slot);
    let wrong = (home + 1) % 3;
    let mut c = cluster.nodes[wrong].client();
    let home_port = cluster.nodes[home].port;
    let mut vectors: Vec<Vec<String>> = Vec::new();
    for family in FAMILIES {
        vectors.push(acquire_args(family, key, "o"));
        let mut blocking = acquire_args(family, key, "o");
        blocking.extend(["BLOCK".into(), "0".into()]);
        vectors.push(blocking);
        vectors.push(release_args(family, key, "o"));
        vectors.push(
            [&format!("{family}.RENEW"), key, "o"]
                .map(|s| s.to_string())
                .to_vec(),
        );
        vectors.push(vec![format!("{family}.FORCERELEASE"), key.into()]);
        vectors.push(vec![format!("{family}.INFO"), key.into()]);
    }
    for argv in &vectors {
        let start = Instant::now();
        let err = q(&mut c, &refs(argv)).expect_err("the wrong node must redirect");
        assert_eq!(err.kind(), ErrorKind::Moved, "{argv:?}: {err}");
        let (addr, rslot) = err.redirect_node().expect("MOVED names a node");
        assert_eq!(rslot, slot, "{argv:?}");
        assert_eq!(addr, format!("127.0.0.1:{home_port}"), "{argv:?}");
        assert!(start.elapsed() < Duration::from_secs(2), "{argv:?}");
    }
    assert_eq!(int(&mut c, &["DBSIZE"]), 0);
    assert_eq!(stat(&mut c, "waiters"), 0);
    // The right node executes it.
    let mut right = cluster.nodes[home].client();
    assert!(int(&mut right, &["RLOCK.ACQUIRE", key, "o"]) > 0);
    assert_eq!(int(&mut right, &["RLOCK.RELEASE", key, "o"]), 0);
}

/// Moves `slot` (and `keys`, which live in it) from node `src` to node `dst`,
/// the way `redis-cli --cluster reshard` does. Returns the errors of the
/// `CLUSTER SETSLOT ... NODE` steps (a node refuses to give a slot away while
/// it holds keys of it).
fn migrate_slot(
    cluster: &Cluster,
    slot: u16,
    src: usize,
    dst: usize,
    keys: &[&str],
) -> Vec<String> {
    let slot = slot.to_string();
    let mut s = cluster.nodes[src].client();
    let mut d = cluster.nodes[dst].client();
    let ok = |c: &mut Connection, args: &[&str]| {
        call(c, args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    };
    ok(
        &mut d,
        &["CLUSTER", "SETSLOT", &slot, "IMPORTING", &cluster.ids[src]],
    );
    ok(
        &mut s,
        &["CLUSTER", "SETSLOT", &slot, "MIGRATING", &cluster.ids[dst]],
    );
    let port = cluster.nodes[dst].port.to_string();
    let mut migrate = vec!["MIGRATE", "127.0.0.1", &port, "", "0", "5000", "KEYS"];
    migrate.extend_from_slice(keys);
    ok(&mut s, &migrate);
    let mut errors = Vec::new();
    for node in [dst, src, 3 - src - dst] {
        let mut c = cluster.nodes[node].client();
        if let Err(e) = call(
            &mut c,
            &["CLUSTER", "SETSLOT", &slot, "NODE", &cluster.ids[dst]],
        ) {
            errors.push(format!("node {node}: CLUSTER SETSLOT {slot} NODE: {e}"));
        }
    }
    errors
}

/// A slot holding a lock moves to another node while a client waits for the
/// lock: the lock (owner, token, lease) moves with its key, clients follow
/// MOVED, and the waiter is never granted the lock while its holder still
/// holds it on the new node, nor does the old node recreate the key.
#[test]
fn locks_move_with_their_slot_and_clients_follow_moved() {
    let cluster = Cluster::start();
    let key = "migrating:lock";
    let short = "{migrating:lock}:lease";
    let slot = get_slot(key.as_bytes());
    assert_eq!(get_slot(short.as_bytes()), slot);
    let src = cluster.owner(slot);
    let dst = (src + 1) % 3;

    let mut cc = cluster.client();
    let token = qint(&mut cc, &["RLOCK.ACQUIRE", key, "o", "PX", "60000"]);
    let short_start = Instant::now();
    qint(&mut cc, &["RLOCK.ACQUIRE", short, "o", "PX", "4000"]);

    // A waiter, parked on the source node.
    let released = Arc::new(AtomicBool::new(false));
    let waiter = {
        let mut wc = cluster.client();
        let released = released.clone();
        std::thread::spawn(move || {
            let r = q(&mut wc, &["RLOCK.ACQUIRE", key, "w", "BLOCK", "5000"]);
            (r, released.load(Ordering::SeqCst))
        })
    };
    let mut src_client = cluster.nodes[src].client();
    wait_parked(&mut src_client, 1);

    let setslot_errors = migrate_slot(&cluster, slot, src, dst, &[key, short]);
    // Give the waiter time to be redirected (or to be wrongly granted).
    std::thread::sleep(Duration::from_millis(500));
    let slot_s = slot.to_string();
    let left_on_src: Vec<String> = cmd("CLUSTER")
        .arg("GETKEYSINSLOT")
        .arg(slot)
        .arg(10)
        .query(&mut src_client)
        .unwrap();
    // A waiter that already has its answer must not have been granted: o
    // still holds the lock (now on the new node).
    let (early, waiter) = if waiter.is_finished() {
        (Some(waiter.join().unwrap()), None)
    } else {
        (None, Some(waiter))
    };
    let early_grant = matches!(early, Some((Ok(Value::Int(_)), _)));
    assert!(
        setslot_errors.is_empty() && left_on_src.is_empty() && !early_grant,
        "slot {slot} moved from node {src} to node {dst} (MIGRATE {key} {short}) while \
         client w was parked on node {src} for {key}, held by o:\n  \
         keys of the slot on node {src} afterwards: {left_on_src:?}\n  \
         SETSLOT errors: {setslot_errors:?}\n  \
         waiter's reply before o released: {:?}",
        early.as_ref().map(|(r, _)| r)
    );

    // The cluster client (its slot map is stale) follows MOVED to the new node,
    // where the lock is intact.
    let info = qinfo(&mut cc, &["RLOCK.INFO", key]).expect("the lock moved with its key");
    assert_eq!(as_string(&field(&info, "owner")), "o");
    assert_eq!(as_int(&field(&info, "token")), token);
    let ttl = as_int(&field(&info, "ttl"));
    assert!(ttl > 40_000, "lease moved too: {ttl}");
    let e = q(&mut src_client, &["RLOCK.INFO", key]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Moved, "{e}");
    assert_eq!(
        int(&mut src_client, &["CLUSTER", "COUNTKEYSINSLOT", &slot_s]),
        0
    );

    released.store(true, Ordering::SeqCst);
    assert_eq!(qint(&mut cc, &["RLOCK.RELEASE", key, "o"]), 0);
    let (r, released_before_grant) = match early {
        Some(done) => done,
        None => waiter.unwrap().join().unwrap(),
    };
    match r {
        // Redirected with MOVED, parked again on the new node, served there.
        Ok(Value::Int(t)) => {
            assert!(
                released_before_grant,
                "the waiter was granted {key} (token {t}) while o still held it"
            );
            assert!(t > token, "{t} after {token}");
        }
        // Or left parked on the old node until its timeout.
        Ok(Value::Nil) => {}
        // Or told by the old node that the key went elsewhere.
        Err(e) if e.code().is_some() && !e.to_string().contains("internal") => {}
        other => panic!("waiter: {other:?}"),
    }
    let mut dst_client = cluster.nodes[dst].client();
    wait_until(Duration::from_secs(5), || {
        stat(&mut src_client, "waiters") == 0 && stat(&mut dst_client, "waiters") == 0
    });
    let _ = q(&mut cc, &["RLOCK.FORCERELEASE", key]);

    // The lease of the moved short lock still ends on time on the new node:
    // a waiter there is served right at its deadline.
    let r = q(&mut cc, &["RLOCK.ACQUIRE", short, "p", "BLOCK", "15000"]);
    let waited = short_start.elapsed();
    assert!(matches!(r, Ok(Value::Int(_))), "{r:?}");
    assert!(
        waited >= Duration::from_millis(3900) && waited < Duration::from_millis(5500),
        "granted {waited:?} after a 4000 ms lease began"
    );
}

/// A tick's KEEPALIVE renewals go out as one `RLOCK.DELTAS` whatever slots
/// their keys hash to: the command only comes from a master's stream or the
/// AOF, where no slot is checked. A cluster replica applies every one of
/// them and ends with its master's keyspace.
#[test]
fn keepalive_renewals_over_many_slots_reach_a_cluster_replica() {
    let cluster = Cluster::start();
    let replica = cluster.add_replica(0);
    let (mut m, mut r) = (cluster.nodes[0].client(), replica.client());
    let port = cluster.nodes[0].port;
    let served = cluster.slot_map(&mut m);
    let on_node_0 = |key: &String| {
        let slot = get_slot(key.as_bytes());
        served
            .iter()
            .any(|&(lo, hi, p)| p == port && (lo..=hi).contains(&slot))
    };
    let keys: Vec<String> = (0..)
        .map(|i| format!("k{i}"))
        .filter(on_node_0)
        .take(100)
        .collect();
    let slots: std::collections::HashSet<u16> =
        keys.iter().map(|k| get_slot(k.as_bytes())).collect();
    assert!(slots.len() > 90, "{} slots", slots.len());
    // Bound to one open connection, renewed every 200 ms.
    let mut holder = cluster.nodes[0].client();
    assert_eq!(acquire_keepalive(&mut holder, &keys, "o", 600).len(), 100);
    std::thread::sleep(Duration::from_millis(1500));
    // Writes paused: no more renewals, so the two copies can be compared.
    pause_writes(&mut m, 10_000);
    let renewals = stat(&mut m, "keepalive_renewals");
    assert!(renewals >= 500, "{renewals} renewals");
    let sent: i64 = replication(&mut m, "master_repl_offset")
        .unwrap()
        .parse()
        .unwrap();
    wait_until(Duration::from_secs(10), || {
        replication(&mut r, "slave_repl_offset").and_then(|v| v.parse().ok()) >= Some(sent)
    });
    let (batches, failed) = command_calls(&mut r, "rlock.deltas");
    assert!(
        batches >= 2 && renewals >= 10 * batches,
        "{renewals} renewals in {batches} RLOCK.DELTAS"
    );
    assert_eq!(failed, 0, "RLOCK.DELTAS refused on the replica");
    assert_eq!(digest(&mut r), digest(&mut m));
    assert_eq!(dbsize(&replica), 100);
    let _: () = cmd("CLIENT").arg("UNPAUSE").query(&mut m).unwrap();
    // Still held: renewed well past the 600 ms lease.
    assert!(int(&mut m, &["PTTL", &keys[0]]) > 0);
    assert!(!replica.log().contains("refused"), "{}", replica.log());
}

/// `tests/rlock.rs` `killing_a_waiter_after_a_hand_over_on_lease_end_is_safe`
/// on the keys no hash tag can hold, which Redis hashes whole although they
/// have a `}` (and the empty key). Their waiters used to be parked on the key
/// itself, so the lock made again for the first waiter was offered to the
/// others, which declined, and Redis 7.0 kept pointing at a declining waiter
/// that `CLIENT KILL` then freed. They park on a name in the key's slot now,
/// as every other key's waiters do.
#[test]
fn killing_a_waiter_on_a_key_hashed_whole_with_a_brace_is_safe() {
    // AOF on: the timer's effects are propagated, which is where Redis 7.0
    // read the freed client.
    let s = start_node_with_aof("yes");
    let mut a = s.client();
    q(&mut a, &["CLUSTER", "ADDSLOTSRANGE", "0", "16383"]).unwrap();
    wait_until(Duration::from_secs(10), || {
        let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut a).unwrap();
        info.contains("cluster_state:ok")
    });
    for key in ["a}b", "}{", "{}x", ""] {
        int(&mut a, &["RLOCK.ACQUIRE", key, "h", "PX", "300"]);
        let w1 = spawn_call(&s, &["RLOCK.ACQUIRE", key, "w1", "BLOCK", "0"]);
        wait_parked(&mut a, 1);
        let (w2id, w2) = spawn_call_with_id(&s, &["RLOCK.ACQUIRE", key, "w2", "BLOCK", "0"]);
        wait_parked(&mut a, 2);
        // h's lease ends: the timer makes the key again for w1, w2 still parked.
        let (r, _) = w1.join().unwrap();
        assert!(matches!(r, Ok(redis::Value::Int(_))), "{key:?} w1: {r:?}");
        assert_eq!(int(&mut a, &["CLIENT", "KILL", "ID", &w2id]), 1);
        let _ = w2.join();
        reuse_freed_client_then_hand_over_on_lease_end(&s, &mut a);
        assert!(call(&mut a, &["PING"]).is_ok(), "{}", s.log());
        for k in [key, "x"] {
            int(&mut a, &["RLOCK.FORCERELEASE", k]);
        }
    }
}
