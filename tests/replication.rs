//! A live replica holds exactly the master's lock state and decides nothing on
//! its own; after promotion it expires leases and serves waiters itself.

mod common;

use std::thread::sleep;
use std::time::Duration;

use common::*;

fn wait_replicated(master: &mut Connection) {
    let acked: i64 = cmd("WAIT").arg(1).arg(2000).query(master).unwrap();
    assert_eq!(acked, 1, "replica did not acknowledge");
}

#[test]
fn replica_mirrors_holders_tokens_and_deadlines() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());

    let t = int(&mut m, &["RLOCK.ACQUIRE", "k", "a", "PX", "60000"]);
    int(&mut m, &["RLOCK.ACQUIRE", "k", "a", "PX", "50000"]);
    wait_replicated(&mut m);
    let info = info_map(&mut r, &["RLOCK.INFO", "k"]).expect("replica has the lock");
    assert_eq!(as_string(&field(&info, "owner")), "a");
    assert_eq!(as_int(&field(&info, "holds")), 2);
    assert_eq!(as_int(&field(&info, "token")), t);
    let (pm, pr) = (int(&mut m, &["PTTL", "k"]), int(&mut r, &["PTTL", "k"]));
    assert!(
        (pm - pr).abs() < 200,
        "deadlines differ: master {pm} replica {pr}"
    );
    assert_eq!(digest(&mut m), digest(&mut r), "datasets differ");

    // A waiter served on the master: the replica sees the new owner and token.
    let w = spawn_call(
        &master,
        &["RLOCK.ACQUIRE", "k", "b", "BLOCK", "5000", "PX", "40000"],
    );
    wait_parked(&mut m, 1);
    int(&mut m, &["RLOCK.RELEASE", "k", "a"]);
    int(&mut m, &["RLOCK.RELEASE", "k", "a"]);
    let tb = as_int(&w.join().unwrap().0.unwrap());
    wait_replicated(&mut m);
    let info = info_map(&mut r, &["RLOCK.INFO", "k"]).unwrap();
    assert_eq!(as_string(&field(&info, "owner")), "b");
    assert_eq!(as_int(&field(&info, "token")), tb);
    assert_eq!(digest(&mut m), digest(&mut r));

    int(&mut m, &["RLOCK.RELEASE", "k", "b"]);
    wait_replicated(&mut m);
    assert_eq!(int(&mut r, &["EXISTS", "k"]), 0);
    assert_eq!(digest(&mut m), digest(&mut r));

    // Lock commands are writes: a replica refuses them, INFO is allowed.
    assert!(error(&mut r, &["RLOCK.ACQUIRE", "k", "x"]).starts_with("READONLY"));
    assert!(info_map(&mut r, &["RLOCK.INFO", "k"]).is_none());
}

#[test]
fn replica_follows_lease_expiry_from_the_master() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    int(&mut m, &["RLOCK.ACQUIRE", "k", "a", "PX", "200"]);
    wait_replicated(&mut m);
    assert_eq!(int(&mut r, &["EXISTS", "k"]), 1);
    wait_until(Duration::from_secs(3), || int(&mut r, &["DBSIZE"]) == 0);
    assert_eq!(digest(&mut m), digest(&mut r));
}

#[test]
fn replica_never_expires_or_grants_on_its_own_until_promoted() {
    let mut master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    let t_old = int(&mut m, &["RLOCK.ACQUIRE", "short", "a", "PX", "300"]);
    int(&mut m, &["RLOCK.ACQUIRE", "long", "b", "PX", "60000"]);
    wait_replicated(&mut m);
    master.kill();

    sleep(Duration::from_millis(600));
    // The lease is over, but only a master decides that: the key is still there.
    assert_eq!(int(&mut r, &["DBSIZE"]), 2);
    assert_eq!(stat(&mut r, "lease_expirations"), 0);

    let mut sub = replica.client();
    sub.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut ps = sub.as_pubsub();
    ps.subscribe("__rlock@0__:short").unwrap();
    let _: () = cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).unwrap();
    assert_eq!(
        ps.get_message().unwrap().get_payload::<String>().unwrap(),
        "expired"
    );
    assert_eq!(int(&mut r, &["EXISTS", "short"]), 0);
    assert_eq!(stat(&mut r, "lease_expirations"), 1);

    // The promoted master keeps the unexpired hold, expires leases on time and serves waiters.
    let info = info_map(&mut r, &["RLOCK.INFO", "long"]).unwrap();
    assert_eq!(as_string(&field(&info, "owner")), "b");
    int(&mut r, &["RLOCK.RENEW", "long", "b", "PX", "300"]);
    let w = spawn_call(&replica, &["RLOCK.ACQUIRE", "long", "c", "BLOCK", "5000"]);
    let (reply, took) = w.join().unwrap();
    let t_new = as_int(&reply.unwrap());
    assert!(took < Duration::from_millis(1500), "{took:?}");
    assert!(
        t_new > t_old,
        "token after failover {t_new} not above {t_old}"
    );
}

#[test]
fn chained_setstate_keeps_tokens_monotonic_after_failover() {
    let mut master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    let mut last = 0;
    for i in 0..50 {
        let k = format!("k{}", i % 5);
        last = int(&mut m, &["RLOCK.ACQUIRE", &k, "o"]);
        int(&mut m, &["RLOCK.RELEASE", &k, "o"]);
    }
    wait_replicated(&mut m);
    master.kill();
    let _: () = cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).unwrap();
    let next = int(&mut r, &["RLOCK.ACQUIRE", "k0", "o"]);
    assert!(next > last, "{next} <= {last}");
    assert!(stat(&mut r, "last_token") >= last);
}

#[test]
fn per_holder_expiry_on_the_master_replicates() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    int(
        &mut m,
        &["RWLOCK.ACQUIRE", "rw", "READ", "brief", "PX", "200"],
    );
    int(
        &mut m,
        &["RWLOCK.ACQUIRE", "rw", "READ", "stays", "PX", "60000"],
    );
    wait_until(Duration::from_secs(3), || {
        stat(&mut m, "lease_expirations") == 1
    });
    wait_replicated(&mut m);
    assert_eq!(digest(&mut m), digest(&mut r));
    let info = info_map(&mut r, &["RWLOCK.INFO", "rw"]).unwrap();
    match field(&info, "readers") {
        Value::Array(readers) => assert_eq!(readers.len(), 1),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_replica_that_attaches_late_receives_every_later_change() {
    // Until a replica or the AOF exists, the master builds no effects at all;
    // the replica's full sync must still start it replicating.
    let master = Server::start();
    let mut m = master.client();
    for i in 0..50 {
        int(
            &mut m,
            &["RLOCK.ACQUIRE", &format!("before{i}"), "a", "PX", "60000"],
        );
    }
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut r = replica.client();
    for i in 0..50 {
        int(&mut m, &["RLOCK.RELEASE", &format!("before{i}"), "a"]);
        int(
            &mut m,
            &[
                "RWLOCK.ACQUIRE",
                &format!("after{i}"),
                "READ",
                "r",
                "PX",
                "60000",
            ],
        );
    }
    wait_replicated(&mut m);
    assert_eq!(int(&mut r, &["DBSIZE"]), 50);
    assert_eq!(digest(&mut m), digest(&mut r));
}

/// With `replica-read-only no` Redis lets clients write to a replica; lock
/// commands still refuse there: a replica holds exactly the master's locks,
/// and a grant of its own would issue a token the master issues too.
#[test]
fn a_writable_replica_still_refuses_lock_changes() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    int(&mut m, &["RLOCK.ACQUIRE", "k", "a", "PX", "60000"]);
    wait_replicated(&mut m);
    let _: () = cmd("CONFIG")
        .arg("SET")
        .arg("replica-read-only")
        .arg("no")
        .query(&mut r)
        .unwrap();
    let _: () = cmd("SET").arg("plain").arg("v").query(&mut r).unwrap();
    for args in [
        &["RLOCK.ACQUIRE", "mine", "b"][..],
        &["RLOCK.RELEASE", "k", "a"],
        &["RLOCK.RENEW", "k", "a", "PX", "5000"],
        &["RLOCK.FORCERELEASE", "k"],
        &["RLOCK.ACQUIREALL", "2", "x", "y", "b"],
        &["RLOCK.RELEASEALL", "1", "k", "a"],
        &["FAIRLOCK.ACQUIRE", "f", "b"],
        &["RWLOCK.ACQUIRE", "rw", "READ", "b"],
        &["SEMAPHORE.ACQUIRE", "s", "b", "LIMIT", "2"],
    ] {
        let e = error(&mut r, args);
        assert!(e.starts_with("READONLY"), "{args:?}: {e}");
    }
    assert_eq!(int(&mut r, &["DBSIZE"]), 2, "only k and the plain key");
    assert!(info_map(&mut r, &["RLOCK.INFO", "k"]).is_some());
    let _: () = cmd("DEL").arg("plain").query(&mut r).unwrap();
    assert_eq!(digest(&mut m), digest(&mut r));
}

/// Found by tests/chaos.rs: the lease timer firing at a deadline that a
/// RENEW has since moved changes no lock, but it put the key's TTL back to
/// the latest deadline on the master only. After a PERSIST (or EXPIRE) by
/// hand, the replica kept the hand-set TTL and `DEBUG DIGEST` differed until
/// the key changed again. The TTL the timer puts back now goes out as
/// `PEXPIREAT`. Each case: a watched lock (a waiter parked; two readers; two
/// semaphore holders) whose earliest deadline is renewed, then PERSIST.
#[test]
fn a_ttl_the_lease_timer_puts_back_reaches_the_replica() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    let mut waiters = Vec::new();
    for case in ["waiter", "readers", "permits"] {
        let k = format!("ttl-{case}");
        match case {
            "waiter" => {
                int(&mut m, &["FAIRLOCK.ACQUIRE", &k, "h", "PX", "300"]);
                waiters.push(spawn_call(
                    &master,
                    &["FAIRLOCK.ACQUIRE", &k, "w", "BLOCK", "0"],
                ));
                wait_parked(&mut m, 1);
                int(&mut m, &["FAIRLOCK.RENEW", &k, "h", "PX", "5000"]);
            }
            "readers" => {
                int(&mut m, &["RWLOCK.ACQUIRE", &k, "READ", "r1", "PX", "300"]);
                int(&mut m, &["RWLOCK.ACQUIRE", &k, "READ", "r2", "PX", "5000"]);
                int(&mut m, &["RWLOCK.RENEW", &k, "r1", "PX", "6000"]);
            }
            _ => {
                int(
                    &mut m,
                    &["SEMAPHORE.ACQUIRE", &k, "a", "LIMIT", "3", "PX", "300"],
                );
                int(
                    &mut m,
                    &["SEMAPHORE.ACQUIRE", &k, "b", "LIMIT", "3", "PX", "5000"],
                );
                int(&mut m, &["SEMAPHORE.RENEW", &k, "a", "PX", "6000"]);
            }
        }
        assert_eq!(int(&mut m, &["PERSIST", &k]), 1);
        // The first deadline as it was before the renewal passes.
        sleep(Duration::from_millis(if valgrind() { 3000 } else { 600 }));
        wait_replicated(&mut m);
        let (tm, tr) = (
            int(&mut m, &["PEXPIRETIME", &k]),
            int(&mut r, &["PEXPIRETIME", &k]),
        );
        assert_eq!(
            tm, tr,
            "{case}: the key's TTL on the master and the replica"
        );
        assert_eq!(digest(&mut m), digest(&mut r), "{case}: datasets differ");
    }
    int(&mut m, &["FAIRLOCK.FORCERELEASE", "ttl-waiter"]);
    for w in waiters {
        let (reply, _) = w.join().unwrap();
        assert!(matches!(reply, Ok(Value::Int(_))), "{reply:?}");
    }
}

/// `DEBUG DIGEST-VALUE` of one key.
fn digest_value(c: &mut Connection, key: &str) -> Value {
    cmd("DEBUG").arg("DIGEST-VALUE").arg(key).query(c).unwrap()
}

/// The first grant of a free key builds its packed block straight from the
/// request (`Compact::first_grant`, which the unit tests hold to the state
/// machine's grant), while the replica applies its effect through the state
/// machine and a reload reads the value back: all three must hold the same
/// lock, with its TTL set. Every family, every owner form the block holds
/// (short, 24 bytes, Redisson's), owners it cannot hold (the general path),
/// semaphore permits and limits, the options the general parser reads.
#[test]
fn a_first_grant_is_held_alike_by_the_master_its_replica_and_a_reload() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    let redisson = "6f1c2a4e-8b1d-4e55-9a7c-3d2f1b0e9a11:42";
    let owners = [
        "a".to_string(),
        "x".repeat(24),
        redisson.to_string(),
        "x".repeat(25),
        redisson.to_uppercase(),
    ];
    let requests: [&[&str]; 8] = [
        &["RLOCK.ACQUIRE", "K", "O", "PX", "60000"],
        &["FAIRLOCK.ACQUIRE", "K", "O", "px", "60000"],
        &["RWLOCK.ACQUIRE", "K", "READ", "O", "PX", "60000"],
        &[
            "RWLOCK.ACQUIRE",
            "K",
            "WRITE",
            "O",
            "PX",
            "60000",
            "BLOCK",
            "100",
        ],
        &[
            "SEMAPHORE.ACQUIRE",
            "K",
            "O",
            "LIMIT",
            "5",
            "PERMITS",
            "3",
            "PX",
            "60000",
        ],
        &[
            "SEMAPHORE.ACQUIRE",
            "K",
            "O",
            "LIMIT",
            "70000",
            "PX",
            "60000",
        ],
        &["RLOCK.ACQUIRE", "K", "O", "EX", "60"],
        &["SEMAPHORE.ACQUIRE", "K", "O", "limit", "5", "PX", "60000"],
    ];
    let mut keys = Vec::new();
    for (i, owner) in owners.iter().enumerate() {
        for (j, request) in requests.iter().enumerate() {
            let key = format!("first:{i}:{j}");
            let args: Vec<&str> = request
                .iter()
                .map(|&a| match a {
                    "K" => key.as_str(),
                    "O" => owner.as_str(),
                    a => a,
                })
                .collect();
            let token = int(&mut m, &args);
            assert!(token > 0, "{args:?}");
            let pttl = int(&mut m, &["PTTL", &key]);
            assert!((50_000..=60_000).contains(&pttl), "{args:?}: PTTL {pttl}");
            keys.push(key);
        }
    }
    assert_eq!(stat(&mut m, "grants"), keys.len() as i64);
    assert_eq!(stat(&mut m, "locks"), keys.len() as i64);
    wait_replicated(&mut m);
    let on_master: Vec<Value> = keys.iter().map(|k| digest_value(&mut m, k)).collect();
    for (key, value) in keys.iter().zip(&on_master) {
        assert_eq!(&digest_value(&mut r, key), value, "{key} on the replica");
    }
    assert_eq!(stat(&mut r, "locks"), keys.len() as i64);
    let _: () = cmd("DEBUG").arg("RELOAD").query(&mut m).unwrap();
    for (key, value) in keys.iter().zip(&on_master) {
        assert_eq!(&digest_value(&mut m, key), value, "{key} after a reload");
    }
    assert_eq!(stat(&mut m, "locks"), keys.len() as i64);
}
