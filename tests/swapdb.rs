//! `SWAPDB a b`: the two databases trade their values, while clients (and so
//! parked waiters) stay in the database they selected. Lease deadlines and
//! KEEPALIVE bindings follow the values; every waiter of the two databases is
//! judged again against what its database holds now.

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

/// A connection with database `db` selected.
fn client_in(s: &Server, db: i64) -> Connection {
    let mut c = s.client();
    let _: () = cmd("SELECT").arg(db).query(&mut c).unwrap();
    c
}

fn owner_of(c: &mut Connection, info_cmd: &str, key: &str) -> Option<String> {
    info_map(c, &[info_cmd, key]).map(|i| as_string(&field(&i, "owner")))
}

/// A waiter stays in its client's database: its key now absent there gets
/// TRYAGAIN, a lock of another family WRONGTYPE, a lock of its family is
/// waited on (and taken at that lock's own deadline). Nothing waits for the
/// old lock's deadline, and the moved locks stay intact in the other database.
#[test]
fn waiters_are_judged_again_against_what_their_database_now_holds() {
    let s = Server::start();
    let mut c = s.client();
    let mut c1 = client_in(&s, 1);
    for key in ["gone", "same", "other"] {
        int(&mut c, &["RLOCK.ACQUIRE", key, "h", "PX", "3000"]);
    }
    int(&mut c1, &["RLOCK.ACQUIRE", "same", "x", "PX", "500"]);
    int(&mut c1, &["FAIRLOCK.ACQUIRE", "other", "y", "PX", "60000"]);
    let waiters: Vec<_> = ["gone", "same", "other"]
        .map(|key| spawn_call(&s, &["RLOCK.ACQUIRE", key, "w", "BLOCK", "10000"]))
        .into_iter()
        .collect();
    wait_parked(&mut c, 3);
    let swapped = Instant::now();
    let _: () = cmd("SWAPDB").arg(0).arg(1).query(&mut c).unwrap();
    let [gone, same, other] = <[_; 3]>::try_from(waiters).ok().unwrap();
    let (reply, _) = gone.join().unwrap();
    let e = reply.unwrap_err();
    assert_eq!(e.code(), Some("TRYAGAIN"), "{e}");
    assert!(swapped.elapsed() < Duration::from_millis(500), "{e}");
    let (reply, _) = other.join().unwrap();
    let e = reply.unwrap_err();
    assert_eq!(e.code(), Some("WRONGTYPE"), "{e}");
    assert!(swapped.elapsed() < Duration::from_millis(500), "{e}");
    // x's lease (500 ms from before the swap) ends and w takes the lock.
    let (reply, _) = same.join().unwrap();
    assert!(matches!(reply, Ok(Value::Int(_))), "{reply:?}");
    let waited = swapped.elapsed();
    assert!(waited < Duration::from_millis(1500), "{waited:?}");
    assert_eq!(owner_of(&mut c, "RLOCK.INFO", "same").as_deref(), Some("w"));
    // h's locks moved to db1 whole, and are released there.
    for key in ["gone", "same", "other"] {
        assert_eq!(owner_of(&mut c1, "RLOCK.INFO", key).as_deref(), Some("h"));
        assert_eq!(int(&mut c1, &["RLOCK.RELEASE", key, "h"]), 0);
    }
    assert_eq!(int(&mut c, &["EXISTS", "gone"]), 0);
    assert_eq!(stat(&mut c, "waiters"), 0);
}

/// Each reader of a moved RWLOCK ends at its own deadline (its lock key's TTL
/// is only the latest one), in both directions of the swap; a replica follows.
#[test]
fn a_moved_lock_ends_each_holder_at_its_own_deadline() {
    let s = Server::start();
    let replica = Server::start();
    replica.replicate_from(&s);
    let mut c = s.client();
    let mut c1 = client_in(&s, 1);
    let mut sub = s.client();
    let mut ps = sub.as_pubsub();
    ps.subscribe(&["__rlock@0__:k", "__rlock@1__:k"]).unwrap();
    ps.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let start = Instant::now();
    int(&mut c, &["RWLOCK.ACQUIRE", "k", "READ", "r1", "PX", "300"]);
    int(
        &mut c,
        &["RWLOCK.ACQUIRE", "k", "READ", "r2", "PX", "60000"],
    );
    int(
        &mut c1,
        &["RWLOCK.ACQUIRE", "k", "READ", "s1", "PX", "2000"],
    );
    int(
        &mut c1,
        &["RWLOCK.ACQUIRE", "k", "READ", "s2", "PX", "60000"],
    );
    let _: () = cmd("SWAPDB").arg(0).arg(1).query(&mut c).unwrap();
    // r1, now in db1, ends first, then s1, now in db0.
    for (channel, by_ms) in [("__rlock@1__:k", 1300), ("__rlock@0__:k", 3000)] {
        let m = ps.get_message().unwrap();
        assert_eq!(m.get_channel_name(), channel);
        assert_eq!(m.get_payload::<String>().unwrap(), "expired");
        let at = start.elapsed();
        assert!(at < Duration::from_millis(by_ms), "{channel} at {at:?}");
        if channel.contains("@0") {
            assert!(at >= Duration::from_millis(2000), "{channel} at {at:?}");
        }
    }
    assert_eq!(stat(&mut c, "lease_expirations"), 2);
    for (conn, alive) in [(&mut c1, "r2"), (&mut c, "s2")] {
        let info = info_map(conn, &["RWLOCK.INFO", "k"]).unwrap();
        let Value::Array(readers) = field(&info, "readers") else {
            panic!("{info:?}")
        };
        assert_eq!(readers.len(), 1, "{info:?}");
        let reader = parse_info(readers[0].clone()).unwrap();
        assert_eq!(as_string(&field(&reader, "owner")), alive);
        assert!(int(conn, &["PTTL", "k"]) > 50_000);
    }
    let _: i64 = cmd("WAIT").arg(1).arg(2000).query(&mut c).unwrap();
    let mut r = replica.client();
    let digest = |c: &mut Connection| -> String { cmd("DEBUG").arg("DIGEST").query(c).unwrap() };
    assert_eq!(digest(&mut c), digest(&mut r));
}

/// A KEEPALIVE holding moved by SWAPDB is still renewed while its connection
/// lives, and released when it closes.
#[test]
fn a_keepalive_holding_survives_a_swap() {
    let s = Server::start();
    let mut holder = s.client();
    let id = client_id(&mut holder);
    int(
        &mut holder,
        &["RLOCK.ACQUIRE", "k", "o", "PX", "300", "KEEPALIVE"],
    );
    let mut c = s.client();
    let _: () = cmd("SWAPDB").arg(0).arg(1).query(&mut c).unwrap();
    let mut c1 = client_in(&s, 1);
    // Five leases long, renewed in db1 all along.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        let info = info_map(&mut c1, &["RLOCK.INFO", "k"]).expect("still held");
        let ttl = as_int(&field(&info, "ttl"));
        assert!((0..=300).contains(&ttl), "ttl {ttl}");
        assert_eq!(as_int(&field(&info, "keepalive")), id);
        sleep(Duration::from_millis(50));
    }
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    assert_eq!(stat(&mut c, "lease_expirations"), 0);
    assert_eq!(stat(&mut c, "keepalive_holds"), 1);
    drop(holder);
    wait_until(Duration::from_secs(1), || {
        int(&mut c1, &["EXISTS", "k"]) == 0
    });
    // Released with the connection, not run out.
    assert_eq!(stat(&mut c, "lease_expirations"), 0);
    assert_eq!(stat(&mut c, "keepalive_holds"), 0);
}

/// A key `RESTORE` loaded a lock into is looked at on the next turn of the
/// event loop (its TTL made the lock's latest deadline): a SWAPDB in the same
/// pipeline moves that look along with the value.
#[test]
fn a_lock_restored_just_before_a_swap_gets_its_ttl_in_its_new_database() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "src", "w", "PX", "5000"]);
    let dump: Vec<u8> = cmd("DUMP").arg("src").query(&mut c).unwrap();
    int(&mut c, &["DEL", "src"]);
    let _: () = redis::pipe()
        .cmd("RESTORE")
        .arg("k")
        .arg(0)
        .arg(&dump)
        .ignore()
        .cmd("SWAPDB")
        .arg(0)
        .arg(1)
        .ignore()
        .query(&mut c)
        .unwrap();
    let mut c1 = client_in(&s, 1);
    wait_until(Duration::from_secs(1), || {
        (1..=5000).contains(&int(&mut c1, &["PTTL", "k"]))
    });
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
}
