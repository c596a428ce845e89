//! Deadlock detection (SPEC "Deadlock detection"): a waiter on a wait-for
//! cycle is answered DEADLOCK; the others keep waiting.

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

fn error_of(r: redis::RedisResult<Value>) -> String {
    match r {
        Err(e) => e.to_string(),
        Ok(v) => panic!("expected an error, got {v:?}"),
    }
}

#[test]
fn two_owners_waiting_for_each_other() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "k1", "a"]);
    int(&mut c, &["RLOCK.ACQUIRE", "k2", "b"]);
    let a = spawn_call(&s, &["RLOCK.ACQUIRE", "k2", "a", "BLOCK", "20000"]);
    wait_parked(&mut c, 1);
    let started = Instant::now();
    let b = spawn_call(&s, &["RLOCK.ACQUIRE", "k1", "b", "BLOCK", "20000"]);
    // The later waiter (b) is answered, after about deadlock-check-ms (1 s).
    let (reply, waited) = b.join().unwrap();
    let e = error_of(reply);
    assert!(e.contains("DEADLOCK"), "{e}");
    assert!(e.contains("wait-for cycle: b -> a -> b"), "{e}");
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(stat(&mut c, "deadlocks"), 1);
    // a keeps waiting, and gets k2 once b gives it up.
    sleep(Duration::from_millis(300));
    assert!(!a.is_finished());
    int(&mut c, &["RLOCK.RELEASE", "k2", "b"]);
    let (reply, _) = a.join().unwrap();
    assert!(matches!(reply.unwrap(), Value::Int(_)));
}

#[test]
fn a_long_plain_wait_is_no_deadlock() {
    let s = Server::start();
    let mut c = s.client();
    let _: () = cmd("CONFIG")
        .arg("SET")
        .arg("rlock.deadlock-check-ms")
        .arg("100")
        .query(&mut c)
        .unwrap();
    int(&mut c, &["RLOCK.ACQUIRE", "k", "h"]);
    int(&mut c, &["RLOCK.ACQUIRE", "k2", "w1"]);
    // w1 holds k2 and waits for k; w2 waits for k2 behind nobody: chains, no cycle.
    let w1 = spawn_call(&s, &["RLOCK.ACQUIRE", "k", "w1", "BLOCK", "1500"]);
    let w2 = spawn_call(&s, &["RLOCK.ACQUIRE", "k2", "w2", "BLOCK", "1500"]);
    let w3 = spawn_call(&s, &["RLOCK.ACQUIRE", "k", "w3", "BLOCK", "1500"]);
    for w in [w1, w2, w3] {
        assert_eq!(w.join().unwrap().0.unwrap(), Value::Nil);
    }
    assert_eq!(stat(&mut c, "deadlocks"), 0);
}

#[test]
fn cycles_across_families_and_through_queues() {
    let s = Server::start();
    let mut c = s.client();
    let _: () = cmd("CONFIG")
        .arg("SET")
        .arg("rlock.deadlock-check-ms")
        .arg("200")
        .query(&mut c)
        .unwrap();
    // a holds f (FAIRLOCK), b holds rw (RWLOCK WRITE), x holds k (RLOCK).
    int(&mut c, &["FAIRLOCK.ACQUIRE", "f", "a"]);
    int(&mut c, &["RWLOCK.ACQUIRE", "rw", "WRITE", "b"]);
    int(&mut c, &["RLOCK.ACQUIRE", "k", "x"]);
    // a waits for k behind nobody (x holds it); b queues on k behind a;
    // a bystander waits for rw (not on any cycle).
    let a1 = spawn_call(&s, &["RLOCK.ACQUIRE", "k", "a", "BLOCK", "20000"]);
    wait_parked(&mut c, 1);
    let b1 = spawn_call(&s, &["RLOCK.ACQUIRE", "k", "b", "BLOCK", "20000"]);
    wait_parked(&mut c, 2);
    let bystander = spawn_call(&s, &["RWLOCK.ACQUIRE", "rw", "READ", "z", "BLOCK", "20000"]);
    wait_parked(&mut c, 3);
    sleep(Duration::from_millis(500));
    assert_eq!(stat(&mut c, "deadlocks"), 0, "no cycle yet");
    // a waits (on a second connection) for rw behind z, which waits for b
    // (rw's holder); b waits for a (queued ahead of it on k).
    let a2 = spawn_call(&s, &["RWLOCK.ACQUIRE", "rw", "READ", "a", "BLOCK", "20000"]);
    let (reply, _) = a2.join().unwrap();
    let e = error_of(reply);
    assert!(e.contains("wait-for cycle: a -> z -> b -> a"), "{e}");
    assert_eq!(stat(&mut c, "deadlocks"), 1);
    assert_eq!(stat(&mut c, "waiters"), 3);
    // Everybody else goes on once the locks are released.
    int(&mut c, &["RLOCK.RELEASE", "k", "x"]);
    assert!(matches!(a1.join().unwrap().0.unwrap(), Value::Int(_)));
    int(&mut c, &["RLOCK.RELEASE", "k", "a"]);
    assert!(matches!(b1.join().unwrap().0.unwrap(), Value::Int(_)));
    int(&mut c, &["RWLOCK.RELEASE", "rw", "WRITE", "b"]);
    assert!(matches!(
        bystander.join().unwrap().0.unwrap(),
        Value::Int(_)
    ));
    assert_eq!(stat(&mut c, "deadlocks"), 1);
}

#[test]
fn a_multi_key_waiter_on_a_cycle_and_switching_detection_off() {
    let s = Server::start_with(
        &["--save", "", "--appendonly", "no"],
        &["deadlock-check-ms", "0"],
    );
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "{t}1", "a"]);
    int(&mut c, &["RLOCK.ACQUIRE", "{t}2", "b"]);
    let a = spawn_call(
        &s,
        &[
            "RLOCK.ACQUIREALL",
            "2",
            "{t}2",
            "{t}3",
            "a",
            "BLOCK",
            "20000",
        ],
    );
    wait_parked(&mut c, 1);
    let b = spawn_call(&s, &["RLOCK.ACQUIRE", "{t}1", "b", "BLOCK", "1500"]);
    // Off: nobody is told; b's BLOCK runs out.
    let (reply, _) = b.join().unwrap();
    assert_eq!(reply.unwrap(), Value::Nil);
    assert_eq!(stat(&mut c, "deadlocks"), 0);
    let _: () = cmd("CONFIG")
        .arg("SET")
        .arg("rlock.deadlock-check-ms")
        .arg("100")
        .query(&mut c)
        .unwrap();
    let b = spawn_call(&s, &["RLOCK.ACQUIRE", "{t}1", "b", "BLOCK", "20000"]);
    let e = error_of(b.join().unwrap().0);
    assert!(e.contains("wait-for cycle: b -> a -> b"), "{e}");
    int(&mut c, &["RLOCK.RELEASE", "{t}2", "b"]);
    let got = a.join().unwrap().0.unwrap();
    assert!(matches!(got, Value::Array(_)), "{got:?}");
}

/// The victim leaves its queue with its answer: releasing the key it waited
/// for later grants it to nobody (SPEC: a waiter that leaves is never granted).
#[test]
fn the_victim_is_never_granted_afterwards() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "k1", "a", "PX", "60000"]);
    int(&mut c, &["RLOCK.ACQUIRE", "k2", "b", "PX", "60000"]);
    let a = spawn_call(&s, &["RLOCK.ACQUIRE", "k2", "a", "BLOCK", "0"]);
    wait_parked(&mut c, 1);
    let b = spawn_call(&s, &["RLOCK.ACQUIRE", "k1", "b", "BLOCK", "0"]);
    assert!(error_of(b.join().unwrap().0).contains("DEADLOCK"));
    let info = info_map(&mut c, &["RLOCK.INFO", "k1"]).unwrap();
    assert_eq!(as_int(&field(&info, "waiters")), 0);
    assert_eq!(stat(&mut c, "waiters"), 1);
    let grants = stat(&mut c, "grants");
    int(&mut c, &["RLOCK.RELEASE", "k2", "b"]);
    assert!(matches!(a.join().unwrap().0.unwrap(), Value::Int(_)));
    int(&mut c, &["RLOCK.RELEASE", "k1", "a"]);
    assert!(
        info_map(&mut c, &["RLOCK.INFO", "k1"]).is_none(),
        "k1 went to the victim"
    );
    assert_eq!(stat(&mut c, "grants"), grants + 1, "only a's grant of k2");
    assert_eq!(stat(&mut c, "waiters"), 0);
}
