//! RLOCK.ACQUIREALL / RELEASEALL / RENEWALL (SPEC "Multi-key lock"): all or
//! nothing, waiting holding nothing, reservations, no deadlock under load.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

fn tokens(v: &Value) -> Vec<i64> {
    match v {
        Value::Array(items) => items.iter().map(as_int).collect(),
        other => panic!("expected an array of tokens, got {other:?}"),
    }
}

fn acquire_all(c: &mut Connection, args: &[&str]) -> Value {
    let mut full = vec!["RLOCK.ACQUIREALL"];
    full.extend_from_slice(args);
    call(c, &full).unwrap()
}

fn owner_of(c: &mut Connection, key: &str) -> Option<String> {
    info_map(c, &["RLOCK.INFO", key]).map(|i| as_string(&field(&i, "owner")))
}

fn holds_of(c: &mut Connection, key: &str) -> i64 {
    info_map(c, &["RLOCK.INFO", key])
        .map(|i| as_int(&field(&i, "holds")))
        .unwrap_or(0)
}

#[test]
fn every_key_or_none() {
    let s = Server::start();
    let mut c = s.client();
    let got = tokens(&acquire_all(
        &mut c,
        &["3", "a", "b", "c", "o1", "PX", "10000"],
    ));
    assert_eq!(got.len(), 3);
    // Each token is the key's tenure token, as RLOCK.ACQUIRE would return it.
    for (key, token) in ["a", "b", "c"].iter().zip(&got) {
        assert_eq!(int(&mut c, &["RLOCK.ACQUIRE", key, "o1"]), *token);
        assert_eq!(int(&mut c, &["RLOCK.RELEASE", key, "o1"]), 1);
    }
    // Reentrant on every key: the same tokens, one more hold each.
    let again = tokens(&acquire_all(&mut c, &["2", "c", "a", "o1"]));
    assert_eq!(again, vec![got[2], got[0]]);
    assert_eq!(holds_of(&mut c, "a"), 2);
    assert_eq!(holds_of(&mut c, "b"), 1);

    // One busy key: nothing granted, no key created or changed.
    assert!(is_nil(
        &mut c,
        &["RLOCK.ACQUIREALL", "3", "x", "b", "y", "o2"]
    ));
    assert_eq!(int(&mut c, &["EXISTS", "x", "y"]), 0);
    assert_eq!(owner_of(&mut c, "b").as_deref(), Some("o1"));
    assert_eq!(holds_of(&mut c, "b"), 1);

    // RELEASEALL: remaining holds per key, in key order.
    let left = call(&mut c, &["RLOCK.RELEASEALL", "3", "a", "b", "c", "o1"]).unwrap();
    assert_eq!(tokens(&left), vec![1, 0, 1]);
    assert_eq!(int(&mut c, &["EXISTS", "b"]), 0);
    // NOTOWNER unless every key is held: no key changes.
    let e = error(&mut c, &["RLOCK.RELEASEALL", "2", "a", "b", "o1"]);
    assert!(e.starts_with("NOTOWNER"), "{e}");
    assert_eq!(holds_of(&mut c, "a"), 1);
    let before = int(&mut c, &["PTTL", "a"]);
    let e = error(
        &mut c,
        &["RLOCK.RENEWALL", "2", "a", "b", "o1", "PX", "99000"],
    );
    assert!(e.starts_with("NOTOWNER"), "{e}");
    assert!(int(&mut c, &["PTTL", "a"]) <= before);
    assert_eq!(
        int(
            &mut c,
            &["RLOCK.RENEWALL", "2", "a", "c", "o1", "PX", "99000"]
        ),
        1
    );
    assert!(int(&mut c, &["PTTL", "a"]) > 90_000);
    assert!(int(&mut c, &["PTTL", "c"]) > 90_000);
}

#[test]
fn malformed_calls_are_errors_and_change_nothing() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "held", "h"]);
    let _: () = cmd("SET").arg("str").arg("v").query(&mut c).unwrap();
    for (args, expect) in [
        (&["0", "a", "o"][..], "ERR numkeys"),
        (&["-1", "a", "o"], "ERR numkeys"),
        (&["x", "a", "o"], "ERR numkeys"),
        (&["+1", "a", "o"], "ERR numkeys"),
        (&["01", "a", "o"], "ERR numkeys"),
        (&["3", "a", "b", "o"], "ERR numkeys"),
        (&["2", "a", "o"], "ERR numkeys"),
        (&["2", "a", "a", "o"], "ERR a key is listed more than once"),
        (&["2", "a", "b", ""], "ERR owner"),
        (&["2", "a", "b", "o", "PX", "0"], "ERR lease"),
        (&["2", "a", "b", "o", "BLOCK", "-1"], "ERR timeout"),
        (&["2", "a", "b", "o", "PX", "5", "PX", "5"], "ERR syntax"),
        (&["2", "a", "str", "o"], "WRONGTYPE"),
        (&["2", "str", "a", "o", "BLOCK", "100"], "WRONGTYPE"),
    ] {
        let mut full = vec!["RLOCK.ACQUIREALL"];
        full.extend_from_slice(args);
        let e = error(&mut c, &full);
        assert!(e.starts_with(expect), "{full:?}: {e}");
    }
    let e = error(&mut c, &["RLOCK.RELEASEALL", "1", "held", "h", "PX", "5"]);
    assert!(e.starts_with("ERR syntax"), "{e}");
    let e = error(&mut c, &["RLOCK.RENEWALL", "1", "held", "h", "BLOCK", "5"]);
    assert!(e.starts_with("ERR syntax"), "{e}");
    // Another lock family is WRONGTYPE too.
    int(&mut c, &["FAIRLOCK.ACQUIRE", "fair", "h"]);
    let e = error(&mut c, &["RLOCK.ACQUIREALL", "2", "a", "fair", "o"]);
    assert!(e.starts_with("WRONGTYPE"), "{e}");
    // Nothing was created, nothing parked, the held lock is as it was.
    assert_eq!(int(&mut c, &["EXISTS", "a", "b"]), 0);
    assert_eq!(stat(&mut c, "waiters"), 0);
    assert_eq!(holds_of(&mut c, "held"), 1);
    assert_eq!(int(&mut c, &["DBSIZE"]), 3);
}

#[test]
fn a_waiter_holds_nothing_and_gets_every_key_when_the_last_frees() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "a", "h1"]);
    int(&mut c, &["RLOCK.ACQUIRE", "c", "h2"]);
    let w = spawn_call(
        &s,
        &["RLOCK.ACQUIREALL", "3", "a", "b", "c", "w", "BLOCK", "0"],
    );
    wait_parked(&mut c, 1);
    // Waiting holds nothing: b, free, was not taken.
    assert_eq!(int(&mut c, &["EXISTS", "b"]), 0);
    assert_eq!(int(&mut c, &["RLOCK.RELEASE", "a", "h1"]), 0);
    sleep(Duration::from_millis(100));
    assert!(!w.is_finished(), "granted with c still held");
    assert_eq!(int(&mut c, &["EXISTS", "a"]), 0, "a is reserved, not held");
    let grants = stat(&mut c, "grants");
    assert_eq!(int(&mut c, &["RLOCK.RELEASE", "c", "h2"]), 0);
    let (reply, _) = w.join().unwrap();
    let got = tokens(&reply.unwrap());
    assert_eq!(got.len(), 3);
    for key in ["a", "b", "c"] {
        assert_eq!(owner_of(&mut c, key).as_deref(), Some("w"));
    }
    assert_eq!(stat(&mut c, "grants"), grants + 3);
    assert_eq!(stat(&mut c, "waiters"), 0);
}

#[test]
fn a_reserved_key_is_busy_for_everybody_else() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "b", "h"]);
    let w = spawn_call(&s, &["RLOCK.ACQUIREALL", "2", "a", "b", "w", "BLOCK", "0"]);
    wait_parked(&mut c, 1);
    // a is free, but the multi-key waiter is first in its queue.
    assert!(is_nil(&mut c, &["RLOCK.ACQUIRE", "a", "x"]));
    assert!(is_nil(&mut c, &["RLOCK.ACQUIREALL", "1", "a", "x"]));
    let later = spawn_call(&s, &["RLOCK.ACQUIRE", "a", "y", "BLOCK", "0"]);
    wait_parked(&mut c, 2);
    int(&mut c, &["RLOCK.RELEASE", "b", "h"]);
    let (reply, _) = w.join().unwrap();
    assert_eq!(tokens(&reply.unwrap()).len(), 2);
    sleep(Duration::from_millis(100));
    assert!(!later.is_finished(), "the later waiter overtook");
    call(&mut c, &["RLOCK.RELEASEALL", "2", "a", "b", "w"]).unwrap();
    let (reply, _) = later.join().unwrap();
    assert!(matches!(reply.unwrap(), Value::Int(_)));
    assert_eq!(owner_of(&mut c, "a").as_deref(), Some("y"));
}

/// A waiter that leaves (BLOCK timeout, disconnect, CLIENT UNBLOCK) takes its
/// reservations with it: the single-key waiter behind it gets the key.
#[test]
fn a_departed_waiter_leaves_no_reservation_behind() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "b", "h"]);
    for how in ["timeout", "disconnect", "unblock"] {
        let mut wc = s.client();
        let id = client_id(&mut wc);
        let block = if how == "timeout" { "300" } else { "0" };
        let w = std::thread::spawn(move || {
            call(
                &mut wc,
                &["RLOCK.ACQUIREALL", "2", "a", "b", "w", "BLOCK", block],
            )
        });
        wait_parked(&mut c, 1);
        let behind = spawn_call(&s, &["RLOCK.ACQUIRE", "a", "y", "BLOCK", "5000"]);
        wait_parked(&mut c, 2);
        match how {
            "disconnect" => {
                let _: () = cmd("CLIENT")
                    .arg("KILL")
                    .arg("ID")
                    .arg(id)
                    .query(&mut c)
                    .unwrap();
            }
            "unblock" => {
                assert_eq!(int(&mut c, &["CLIENT", "UNBLOCK", &id.to_string()]), 1);
            }
            _ => {}
        }
        let (reply, waited) = behind.join().unwrap();
        assert!(matches!(reply.unwrap(), Value::Int(_)), "{how}");
        assert!(waited < Duration::from_secs(3), "{how}: {waited:?}");
        match w.join().unwrap() {
            Ok(v) => assert_eq!(v, Value::Nil, "{how}"),
            Err(e) => assert_ne!(how, "timeout", "{e}"),
        }
        assert_eq!(owner_of(&mut c, "a").as_deref(), Some("y"), "{how}");
        int(&mut c, &["RLOCK.RELEASE", "a", "y"]);
        assert_eq!(stat(&mut c, "waiters"), 0, "{how}");
    }
}

#[test]
fn a_key_whose_lease_ends_is_released_alone() {
    let s = Server::start();
    let mut c = s.client();
    tokens(&acquire_all(&mut c, &["2", "a", "b", "o", "PX", "300"]));
    int(&mut c, &["RLOCK.RENEW", "b", "o", "PX", "60000"]);
    let w = spawn_call(&s, &["RLOCK.ACQUIRE", "a", "w", "BLOCK", "5000"]);
    let (reply, waited) = w.join().unwrap();
    assert!(matches!(reply.unwrap(), Value::Int(_)));
    assert!(waited < Duration::from_secs(3));
    assert_eq!(owner_of(&mut c, "b").as_deref(), Some("o"));
    // Its holder gets every key once the lease of the last one ends.
    let all = spawn_call(
        &s,
        &["RLOCK.ACQUIREALL", "2", "a", "b", "v", "BLOCK", "5000"],
    );
    wait_parked(&mut c, 1);
    int(&mut c, &["RLOCK.RELEASE", "a", "w"]);
    int(&mut c, &["RLOCK.RENEW", "b", "o", "PX", "200"]);
    let (reply, _) = all.join().unwrap();
    assert_eq!(tokens(&reply.unwrap()).len(), 2);
}

#[test]
fn inside_multi_and_lua_block_is_a_single_try() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "b", "h"]);
    let (r,): (Value,) = redis::pipe()
        .atomic()
        .cmd("RLOCK.ACQUIREALL")
        .arg(&["2", "a", "b", "o", "BLOCK", "0"])
        .query(&mut c)
        .unwrap();
    assert_eq!(r, Value::Nil);
    let lua: Value = cmd("EVAL")
        .arg("return redis.call('RLOCK.ACQUIREALL', 2, KEYS[1], KEYS[2], 'o', 'BLOCK', 0)")
        .arg(2)
        .arg("a")
        .arg("c")
        .query(&mut c)
        .unwrap();
    assert_eq!(tokens(&lua).len(), 2);
    assert_eq!(stat(&mut c, "waiters"), 0);
}

#[test]
fn replicas_and_reloads_see_every_key() {
    let master = Server::start_with(
        &[
            "--save",
            "",
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
        ],
        &[],
    );
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.client();
    int(&mut m, &["RLOCK.ACQUIRE", "c", "h"]);
    let got = tokens(&acquire_all(&mut m, &["2", "a", "b", "o", "PX", "60000"]));
    let w = spawn_call(
        &master,
        &["RLOCK.ACQUIREALL", "2", "b", "c", "w", "BLOCK", "0"],
    );
    wait_parked(&mut m, 1);
    int(&mut m, &["RLOCK.RELEASE", "c", "h"]);
    call(&mut m, &["RLOCK.RELEASEALL", "1", "b", "o"]).unwrap();
    let granted = tokens(&w.join().unwrap().0.unwrap());
    let _: i64 = cmd("WAIT").arg(1).arg(5000).query(&mut m).unwrap();
    let mut r = replica.client();
    let expect = [
        ("a", "o", got[0]),
        ("b", "w", granted[0]),
        ("c", "w", granted[1]),
    ];
    for (key, owner, token) in expect {
        let info = info_map(&mut r, &["RLOCK.INFO", key]).expect(key);
        assert_eq!(as_string(&field(&info, "owner")), owner);
        assert_eq!(as_int(&field(&info, "token")), token);
    }
    // The AOF has each multi-key change as one transaction.
    let aof: Vec<u8> = std::fs::read_dir(master.dir.join("appendonlydir"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().contains(".incr."))
        .flat_map(|p| std::fs::read(p).unwrap())
        .collect();
    let text = String::from_utf8_lossy(&aof);
    let multis = text.matches("MULTI").count();
    assert!(
        multis >= 2,
        "expected the two grants wrapped in MULTI/EXEC:\n{text}"
    );
    let _: () = cmd("DEBUG").arg("RELOAD").query(&mut m).unwrap();
    for (key, owner, token) in expect {
        let info = info_map(&mut m, &["RLOCK.INFO", key]).expect(key);
        assert_eq!(as_string(&field(&info, "owner")), owner);
        assert_eq!(as_int(&field(&info, "token")), token);
    }
}

/// Clients lock overlapping pairs of keys in opposite orders for 10 s: every
/// request is granted (no deadlock: BLOCK times never run out), and a
/// read-modify-write of a counter per key under the lock loses no update.
#[test]
fn opposite_orders_under_load_never_deadlock_or_overlap() {
    let s = Server::start();
    let keys = ["{m}a", "{m}b", "{m}c", "{m}d"];
    let stop = Arc::new(AtomicBool::new(false));
    let mut workers = vec![];
    for n in 0..6usize {
        let mut c = s.client();
        let stop = stop.clone();
        workers.push(std::thread::spawn(move || {
            let mut done: HashMap<&str, i64> = HashMap::new();
            let mut timeouts = 0;
            let mut i = n;
            while !stop.load(Ordering::Relaxed) {
                i += 1;
                // Pairs in both orders, and now and then all four keys.
                let mut pick: Vec<&str> = if i % 7 == 0 {
                    keys.to_vec()
                } else {
                    vec![keys[i % 4], keys[(i + 1 + n % 2) % 4]]
                };
                if n % 2 == 1 {
                    pick.reverse();
                }
                let owner = format!("w{n}");
                let numkeys = pick.len().to_string();
                let mut args = vec![numkeys.as_str()];
                args.extend(&pick);
                args.extend([owner.as_str(), "PX", "30000", "BLOCK", "8000"]);
                let reply = acquire_all(&mut c, &args);
                if reply == Value::Nil {
                    timeouts += 1;
                    continue;
                }
                for k in &pick {
                    let counter = format!("{k}:n");
                    let v: Option<i64> = cmd("GET").arg(&counter).query(&mut c).unwrap();
                    let _: () = cmd("SET")
                        .arg(&counter)
                        .arg(v.unwrap_or(0) + 1)
                        .query(&mut c)
                        .unwrap();
                    *done.entry(*k).or_default() += 1;
                }
                let mut rel = vec![numkeys.as_str()];
                rel.extend(&pick);
                rel.push(owner.as_str());
                let mut full = vec!["RLOCK.RELEASEALL"];
                full.extend(rel);
                call(&mut c, &full).unwrap();
            }
            (done, timeouts)
        }));
    }
    let mut c = s.client();
    // A single-key client competes for the same keys meanwhile.
    let started = Instant::now();
    let mut single = 0;
    while started.elapsed() < Duration::from_secs(10) {
        let key = keys[single % 4];
        let t = call(&mut c, &["RLOCK.ACQUIRE", key, "single", "BLOCK", "8000"]).unwrap();
        assert!(matches!(t, Value::Int(_)), "single-key waiter timed out");
        let counter = format!("{key}:n");
        let v: Option<i64> = cmd("GET").arg(&counter).query(&mut c).unwrap();
        let _: () = cmd("SET")
            .arg(&counter)
            .arg(v.unwrap_or(0) + 1)
            .query(&mut c)
            .unwrap();
        int(&mut c, &["RLOCK.RELEASE", key, "single"]);
        single += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let mut total: HashMap<&str, i64> = HashMap::new();
    for k in 0..single {
        *total.entry(keys[k % 4]).or_default() += 1;
    }
    for w in workers {
        let (done, timeouts) = w.join().unwrap();
        assert_eq!(
            timeouts, 0,
            "a multi-key waiter timed out: deadlock or starvation"
        );
        for (k, n) in done {
            *total.entry(k).or_default() += n;
        }
    }
    let grants: i64 = total.values().sum();
    let handed_over = stat(&mut c, "contended_grants");
    eprintln!("{grants} key holds in 10 s ({single} single-key, {handed_over} handed over to parked waiters): {total:?}");
    assert!(
        handed_over > 100,
        "the waiters hardly ever waited: {handed_over}"
    );
    for k in keys {
        let v: Option<i64> = cmd("GET").arg(format!("{k}:n")).query(&mut c).unwrap();
        assert_eq!(
            v.unwrap_or(0),
            total[k],
            "lost update on {k}: holds overlapped"
        );
    }
    assert_eq!(stat(&mut c, "waiters"), 0);
    assert_eq!(
        int(&mut c, &["EXISTS", keys[0], keys[1], keys[2], keys[3]]),
        0
    );
}

/// A multi-key waiter answered with an error because of one key (deleted,
/// overwritten) leaves the queues of its other keys too: nothing stays
/// reserved for a client that is no longer waiting.
#[test]
fn a_waiter_answered_with_an_error_leaves_every_queue() {
    let s = Server::start();
    let mut c = s.client();
    for (change, code) in [
        (&["DEL", "a"][..], "TRYAGAIN"),
        (&["SET", "b", "v"], "WRONGTYPE"),
    ] {
        int(&mut c, &["RLOCK.ACQUIRE", "a", "h"]);
        let w = spawn_call(&s, &["RLOCK.ACQUIREALL", "2", "a", "b", "w", "BLOCK", "0"]);
        wait_parked(&mut c, 1);
        let _ = call(&mut c, change).unwrap();
        if change[0] == "SET" {
            // The waiter is answered when its key (b) is served again.
            int(&mut c, &["RLOCK.RELEASE", "a", "h"]);
        }
        let e = w.join().unwrap().0.unwrap_err();
        assert_eq!(e.code(), Some(code), "{change:?}: {e}");
        assert_eq!(stat(&mut c, "waiters"), 0, "{change:?}");
        // Its other key is free for anybody at once.
        let other = if change[0] == "SET" { "a" } else { "b" };
        assert!(
            info_map(&mut c, &["RLOCK.INFO", other]).is_none(),
            "{change:?}"
        );
        int(&mut c, &["RLOCK.ACQUIRE", other, "y"]);
        assert_eq!(owner_of(&mut c, other).as_deref(), Some("y"), "{change:?}");
        let _ = call(&mut c, &["FLUSHALL"]);
    }
}

/// A key the waiter's owner already holds is granted as `ACQUIRE` would grant
/// it (reentrant, whoever is queued there): the waiter waits only for the
/// keys it does not hold, and nobody is told DEADLOCK.
#[test]
fn a_key_its_owner_holds_does_not_wait_for_that_key_s_queue() {
    let s = Server::start();
    let mut c = s.client();
    let t1 = int(&mut c, &["RLOCK.ACQUIRE", "k1", "m"]);
    int(&mut c, &["RLOCK.ACQUIRE", "k2", "x"]);
    // y queues on k1 (held by m), then m waits for k1 and k2.
    let y = spawn_call(&s, &["RLOCK.ACQUIRE", "k1", "y", "BLOCK", "10000"]);
    wait_parked(&mut c, 1);
    let m = spawn_call(
        &s,
        &["RLOCK.ACQUIREALL", "2", "k1", "k2", "m", "BLOCK", "10000"],
    );
    wait_parked(&mut c, 2);
    // Past deadlock-check-ms (1 s): y waits for m, m for x only. No cycle.
    sleep(Duration::from_millis(1300));
    assert!(!m.is_finished());
    int(&mut c, &["RLOCK.RELEASE", "k2", "x"]);
    let (reply, _) = m.join().unwrap();
    let got = tokens(&reply.expect("m gets both keys"));
    assert_eq!(got[0], t1, "k1 is m's tenure, held once more");
    assert_eq!(holds_of(&mut c, "k1"), 2);
    assert_eq!(owner_of(&mut c, "k2").as_deref(), Some("m"));
    assert_eq!(stat(&mut c, "deadlocks"), 0);
    // y gets k1 once m lets go of both of its holds.
    assert!(!y.is_finished());
    let released = call(&mut c, &["RLOCK.RELEASEALL", "2", "k1", "k2", "m"]).unwrap();
    assert_eq!(released, Value::Array(vec![Value::Int(1), Value::Int(0)]));
    int(&mut c, &["RLOCK.RELEASE", "k1", "m"]);
    assert!(matches!(y.join().unwrap().0.unwrap(), Value::Int(_)));
    assert_eq!(owner_of(&mut c, "k1").as_deref(), Some("y"));
}

/// A free key reserved by a multi-key (RLOCK) waiter is an RLOCK key until
/// the reservation ends: another family's request is WRONGTYPE, never queued
/// where it would be handed an RLOCK hold.
#[test]
fn a_reserved_key_stays_in_its_family() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut c, mut r) = (master.client(), replica.client());
    int(&mut c, &["RLOCK.ACQUIRE", "k1", "x"]);
    let m = spawn_call(
        &master,
        &["RLOCK.ACQUIREALL", "2", "k1", "k2", "m", "BLOCK", "0"],
    );
    wait_parked(&mut c, 1);
    for other in [
        &["RWLOCK.ACQUIRE", "k2", "READ", "z", "BLOCK", "0"][..],
        &["FAIRLOCK.ACQUIRE", "k2", "z", "BLOCK", "0"],
        &["SEMAPHORE.ACQUIRE", "k2", "z", "LIMIT", "5", "BLOCK", "0"],
    ] {
        let e = error(&mut c, other);
        assert!(e.starts_with("WRONGTYPE"), "{other:?}: {e}");
    }
    assert_eq!(stat(&mut c, "waiters"), 1);
    int(&mut c, &["RLOCK.RELEASE", "k1", "x"]);
    assert_eq!(tokens(&m.join().unwrap().0.unwrap()).len(), 2);
    int(&mut c, &["RLOCK.RELEASE", "k2", "m"]);
    // Free again: any family.
    int(&mut c, &["RWLOCK.ACQUIRE", "k2", "READ", "z"]);
    let acked: i64 = cmd("WAIT").arg(1).arg(2000).query(&mut c).unwrap();
    assert_eq!(acked, 1);
    assert_eq!(digest(&mut c), digest(&mut r));
}

/// A connection that reads the reply's bytes as the server wrote them: the
/// `redis` crate reads RESP2's null bulk (`$-1`) and null array (`*-1`) alike.
struct Wire {
    stream: std::net::TcpStream,
}

impl Wire {
    fn connect(s: &Server) -> Wire {
        let stream = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        Wire { stream }
    }

    fn send(&mut self, args: &[&str]) {
        use std::io::Write;
        let args: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        self.stream.write_all(&resp(&args)).unwrap();
    }

    /// The next reply line, `\r\n` included.
    fn line(&mut self) -> String {
        use std::io::Read;
        let mut line = Vec::new();
        let mut byte = [0u8];
        while !line.ends_with(b"\r\n") {
            self.stream.read_exact(&mut byte).unwrap();
            line.push(byte[0]);
        }
        String::from_utf8(line).unwrap()
    }

    fn call(&mut self, args: &[&str]) -> String {
        self.send(args);
        self.line()
    }
}

/// `ACQUIREALL` answers an array when it grants, so its null is the null
/// array (`*-1` in RESP2, as `BLPOP` times out), busy or timed out or
/// unblocked; the single-key commands keep the null bulk (`$-1`).
#[test]
fn a_refused_acquireall_is_the_null_array() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "b", "h"]);
    let mut w = Wire::connect(&s);
    assert_eq!(w.call(&["RLOCK.ACQUIREALL", "2", "a", "b", "o"]), "*-1\r\n");
    let args = ["RLOCK.ACQUIREALL", "2", "a", "b", "o", "BLOCK", "20"];
    assert_eq!(w.call(&args), "*-1\r\n");
    assert_eq!(w.call(&["RLOCK.ACQUIRE", "b", "o"]), "$-1\r\n");
    let args = ["RLOCK.ACQUIRE", "b", "o", "BLOCK", "20"];
    assert_eq!(w.call(&args), "$-1\r\n");
    let id = w.call(&["CLIENT", "ID"]);
    let id = id.trim_start_matches(':').trim_end();
    w.send(&["RLOCK.ACQUIREALL", "2", "a", "b", "o", "BLOCK", "0"]);
    wait_parked(&mut c, 1);
    assert_eq!(int(&mut c, &["CLIENT", "UNBLOCK", id]), 1);
    assert_eq!(w.line(), "*-1\r\n");
    // RESP3 has one null.
    let hello = w.call(&["HELLO", "3"]);
    assert!(hello.starts_with('%'), "{hello}");
    w.send(&["PING"]);
    while w.line() != "+PONG\r\n" {}
    assert_eq!(w.call(&["RLOCK.ACQUIREALL", "2", "a", "b", "o"]), "_\r\n");
    assert_eq!(stat(&mut c, "waiters"), 0);
    assert_eq!(owner_of(&mut c, "b").as_deref(), Some("h"));
    assert_eq!(owner_of(&mut c, "a"), None);
}

type Call = std::thread::JoinHandle<(redis::RedisResult<Value>, Duration)>;

/// `h` holds `{tag}1`; `w` waits for `{tag}1` and `{tag}2` at once (so it
/// reserves `{tag}2`, which nobody holds) and `y` for `{tag}2` behind it.
fn a_reservation_and_a_waiter_behind(s: &Server, c: &mut Connection, tag: &str) -> (Call, Call) {
    let (k1, k2) = (format!("{{{tag}}}1"), format!("{{{tag}}}2"));
    int(c, &["RLOCK.ACQUIRE", &k1, "h"]);
    let all = spawn_call(s, &["RLOCK.ACQUIREALL", "2", &k1, &k2, "w", "BLOCK", "0"]);
    wait_parked(c, 1);
    let behind = spawn_call(s, &["RLOCK.ACQUIRE", &k2, "y", "BLOCK", "0"]);
    wait_parked(c, 2);
    (all, behind)
}

/// A key that only a multi-key waiter's reservation has loses nothing to a
/// flush: `DEBUG RELOAD` (a save, a flush, a load) keeps everyone waiting,
/// and `FLUSHALL` tells only the waiters of a flushed lock to retry; the
/// waiter behind the reservation then gets its free key.
#[test]
fn a_reserved_key_survives_a_reload_and_is_not_flushed() {
    let s = Server::start();
    let mut c = s.client();
    let (all, behind) = a_reservation_and_a_waiter_behind(&s, &mut c, "a");
    let _: () = cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    sleep(Duration::from_millis(200));
    assert_eq!(stat(&mut c, "waiters"), 2, "{}", s.log());
    assert_eq!(owner_of(&mut c, "{a}1").as_deref(), Some("h"));
    int(&mut c, &["RLOCK.RELEASE", "{a}1", "h"]);
    assert_eq!(tokens(&all.join().unwrap().0.unwrap()).len(), 2);
    int(&mut c, &["RLOCK.RELEASE", "{a}2", "w"]);
    assert!(matches!(behind.join().unwrap().0.unwrap(), Value::Int(_)));
    assert_eq!(owner_of(&mut c, "{a}2").as_deref(), Some("y"));

    let (all, behind) = a_reservation_and_a_waiter_behind(&s, &mut c, "b");
    let _: () = cmd("FLUSHALL").query(&mut c).unwrap();
    let e = all.join().unwrap().0.unwrap_err();
    assert_eq!(e.code(), Some("TRYAGAIN"), "{e}");
    assert!(matches!(behind.join().unwrap().0.unwrap(), Value::Int(_)));
    assert_eq!(owner_of(&mut c, "{b}2").as_deref(), Some("y"));
    assert_eq!(stat(&mut c, "waiters"), 0);
}
