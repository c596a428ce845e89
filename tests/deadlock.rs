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

/// A client that sent `args` (a BLOCK request) without reading the reply.
fn park(s: &Server, args: &[&str]) -> Connection {
    park_with_id(s, args).0
}

/// As `park`, with the connection's client id.
fn park_with_id(s: &Server, args: &[&str]) -> (Connection, i64) {
    let mut c = s.client();
    let id = client_id(&mut c);
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    c.send_packed_command(&cmd(args[0]).arg(&args[1..]).get_packed_command())
        .unwrap();
    (c, id)
}

/// Waits until Redis shows client `id` blocked (counting waiters would not
/// do: other waiters may park or be answered meanwhile).
fn wait_blocked(c: &mut Connection, id: i64) {
    wait_until(Duration::from_secs(5), || {
        let line: String = cmd("CLIENT")
            .arg("LIST")
            .arg("ID")
            .arg(id)
            .query(c)
            .unwrap();
        line.split(' ')
            .any(|f| f.starts_with("flags=") && f.contains('b'))
    });
}

fn set_check_ms(c: &mut Connection, ms: &str) {
    let _: () = cmd("CONFIG")
        .arg("SET")
        .arg("rlock.deadlock-check-ms")
        .arg(ms)
        .query(c)
        .unwrap();
}

/// The error a parked client was answered.
fn answered_error(c: &mut Connection) -> String {
    match c.recv_response() {
        Ok(Value::ServerError(e)) => format!("{e:?}"),
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.to_string(),
    }
}

/// Two holders each waiting for the other: `p` holds `a` and waits for `b`
/// (first), then `q` holds `b` and waits for `a`: `q` is the one answered.
fn two_cycle(s: &Server, c: &mut Connection, p: &str, q: &str) -> (Connection, Connection) {
    let (a, b) = (format!("{p}-key"), format!("{q}-key"));
    int(c, &["RLOCK.ACQUIRE", &a, p]);
    int(c, &["RLOCK.ACQUIRE", &b, q]);
    // `first` must be parked before `second` sends: Redis need not read two
    // connections in the order they sent (with IO threads it often does not).
    let (first, id) = park_with_id(s, &["RLOCK.ACQUIRE", &b, p, "BLOCK", "0"]);
    wait_blocked(c, id);
    let second = park(s, &["RLOCK.ACQUIRE", &a, q, "BLOCK", "0"]);
    (first, second)
}

/// `n` waiters (w0..) on `n` keys that `h` holds: on no cycle.
fn bystanders(s: &Server, c: &mut Connection, prefix: &str, n: usize) -> Vec<Connection> {
    (0..n)
        .map(|i| {
            let key = format!("{prefix}{i}");
            int(c, &["RLOCK.ACQUIRE", &key, "h", "PX", "600000"]);
            park(
                s,
                &[
                    "RLOCK.ACQUIRE",
                    &key,
                    &format!("w{prefix}{i}"),
                    "BLOCK",
                    "0",
                ],
            )
        })
        .collect()
}

/// The waits that close the cycle were checked long before it closes; the
/// due waiter's check follows its owner's waits into them, through a queue.
#[test]
fn a_cycle_through_waiters_checked_earlier_is_found() {
    let s = Server::start();
    let mut c = s.client();
    set_check_ms(&mut c, "200");
    for (key, owner) in [("k1", "a"), ("k2", "b"), ("k3", "c"), ("q", "x")] {
        int(&mut c, &["RLOCK.ACQUIRE", key, owner]);
    }
    let _others = bystanders(&s, &mut c, "u", 20);
    // a waits for b; y is first on q (waits for x), b behind y; x waits for c.
    let mut early = Vec::new();
    for (key, owner) in [("k2", "a"), ("q", "y"), ("q", "b"), ("k3", "x")] {
        early.push(park(&s, &["RLOCK.ACQUIRE", key, owner, "BLOCK", "0"]));
        wait_parked(&mut c, 20 + early.len() as i64);
    }
    sleep(Duration::from_millis(700));
    assert_eq!(stat(&mut c, "deadlocks"), 0, "chains, no cycle yet");
    // c waits for a: c -> a -> b -> y -> x -> c, c the last to wait.
    let mut closing = park(&s, &["RLOCK.ACQUIRE", "k1", "c", "BLOCK", "0"]);
    let e = answered_error(&mut closing);
    assert!(
        e.contains("wait-for cycle: c -> a -> b -> y -> x -> c"),
        "{e}"
    );
    assert_eq!(stat(&mut c, "deadlocks"), 1);
    assert_eq!(stat(&mut c, "waiters"), 24, "nobody else was answered");
}

#[test]
fn several_cycles_among_many_unrelated_waiters() {
    let s = Server::start();
    let mut c = s.client();
    set_check_ms(&mut c, "300");
    let _others = bystanders(&s, &mut c, "u", 300);
    let mut cycles: Vec<_> = (0..5)
        .map(|j| two_cycle(&s, &mut c, &format!("p{j}"), &format!("q{j}")))
        .collect();
    let _more = bystanders(&s, &mut c, "v", 300);
    for (j, (_first, second)) in cycles.iter_mut().enumerate() {
        let e = answered_error(second);
        assert!(
            e.contains(&format!("wait-for cycle: q{j} -> p{j} -> q{j}")),
            "{e}"
        );
    }
    sleep(Duration::from_millis(700));
    assert_eq!(stat(&mut c, "deadlocks"), 5);
    assert_eq!(stat(&mut c, "waiters"), 605, "only the five were answered");
}

/// Thousands of waiters come due in the same tick: they are checked a slice
/// per cron tick, and every deadlocked one is answered, nobody else.
#[test]
fn a_burst_larger_than_one_slice() {
    let s = Server::start();
    let mut c = s.client();
    // Nobody is due while they park; all are at once when the check is due.
    set_check_ms(&mut c, "600000");
    let mut seconds = Vec::new();
    let mut others = Vec::new();
    for j in 0..30 {
        others.extend(bystanders(&s, &mut c, &format!("u{j}-"), 100));
        seconds.push(two_cycle(&s, &mut c, &format!("p{j}"), &format!("q{j}")));
    }
    let parked = 3060;
    wait_parked(&mut c, parked);
    set_check_ms(&mut c, "100");
    for (j, (_, second)) in seconds.iter_mut().enumerate() {
        let e = answered_error(second);
        assert!(
            e.contains(&format!("wait-for cycle: q{j} -> p{j} -> q{j}")),
            "{e}"
        );
    }
    sleep(Duration::from_millis(1200));
    assert_eq!(stat(&mut c, "deadlocks"), 30);
    assert_eq!(stat(&mut c, "waiters"), parked - 30);
}

/// Long queues, chains across keys, a multi-key waiter on a key its owner
/// holds, an owner parked twice, readers and writers, a semaphore: no cycle,
/// and nobody is answered.
#[test]
fn no_false_positive() {
    let s = Server::start();
    let mut c = s.client();
    set_check_ms(&mut c, "100");
    let mut parked = Vec::new();
    let mut wait = |c: &mut Connection, args: &[&str]| {
        let before = stat(c, "waiters");
        parked.push(park(&s, args));
        wait_parked(c, before + 1);
    };
    // One long queue.
    int(&mut c, &["RLOCK.ACQUIRE", "q", "h"]);
    for i in 0..200 {
        wait(
            &mut c,
            &["RLOCK.ACQUIRE", "q", &format!("q{i}"), "BLOCK", "0"],
        );
    }
    // A chain across keys: o0 waits for o1's key, ... o49 for the end's.
    for i in 0..50 {
        int(
            &mut c,
            &["RLOCK.ACQUIRE", &format!("c{i}"), &format!("o{i}")],
        );
    }
    int(&mut c, &["RLOCK.ACQUIRE", "c50", "end"]);
    for i in 0..50 {
        let key = format!("c{}", i + 1);
        wait(
            &mut c,
            &["RLOCK.ACQUIRE", &key, &format!("o{i}"), "BLOCK", "0"],
        );
    }
    // m holds ka and waits for ka and kb (held by n); r queues on ka behind
    // m; n waits for z. m does not wait on ka, so r -> m -> n -> z.
    int(&mut c, &["RLOCK.ACQUIRE", "{m}a", "m"]);
    int(&mut c, &["RLOCK.ACQUIRE", "{m}b", "n"]);
    int(&mut c, &["RLOCK.ACQUIRE", "kz", "z"]);
    wait(
        &mut c,
        &["RLOCK.ACQUIREALL", "2", "{m}a", "{m}b", "m", "BLOCK", "0"],
    );
    wait(&mut c, &["RLOCK.ACQUIRE", "{m}a", "r", "BLOCK", "0"]);
    wait(&mut c, &["RLOCK.ACQUIRE", "kz", "n", "BLOCK", "0"]);
    // An owner parked twice, on keys of owners that wait for a third.
    int(&mut c, &["RLOCK.ACQUIRE", "s1", "t1"]);
    int(&mut c, &["FAIRLOCK.ACQUIRE", "s2", "t2"]);
    int(&mut c, &["RLOCK.ACQUIRE", "s3", "free"]);
    wait(&mut c, &["RLOCK.ACQUIRE", "s1", "two", "BLOCK", "0"]);
    wait(&mut c, &["FAIRLOCK.ACQUIRE", "s2", "two", "BLOCK", "0"]);
    wait(&mut c, &["RLOCK.ACQUIRE", "s3", "t1", "BLOCK", "0"]);
    wait(&mut c, &["RLOCK.ACQUIRE", "s3", "t2", "BLOCK", "0"]);
    // Readers hold rw; a writer waits, readers queue behind it.
    int(&mut c, &["RWLOCK.ACQUIRE", "rw", "READ", "r1"]);
    int(&mut c, &["RWLOCK.ACQUIRE", "rw", "READ", "r2"]);
    wait(
        &mut c,
        &["RWLOCK.ACQUIRE", "rw", "WRITE", "wr", "BLOCK", "0"],
    );
    wait(
        &mut c,
        &["RWLOCK.ACQUIRE", "rw", "READ", "r3", "BLOCK", "0"],
    );
    // sa holds the semaphore's only permit and waits for sb, which waits
    // for a permit: semaphore waits are no edges.
    int(&mut c, &["SEMAPHORE.ACQUIRE", "sem", "sa", "LIMIT", "1"]);
    int(&mut c, &["RLOCK.ACQUIRE", "ks", "sb"]);
    wait(
        &mut c,
        &["SEMAPHORE.ACQUIRE", "sem", "sb", "LIMIT", "1", "BLOCK", "0"],
    );
    wait(&mut c, &["RLOCK.ACQUIRE", "ks", "sa", "BLOCK", "0"]);
    let waiting = stat(&mut c, "waiters");
    sleep(Duration::from_millis(1000));
    assert_eq!(stat(&mut c, "deadlocks"), 0);
    assert_eq!(stat(&mut c, "waiters"), waiting);
}

/// A multi-key waiter whose owner holds one of its keys is granted that key
/// at once: it has no wait there, but whoever queues behind it still waits
/// for the waiters ahead of it too. On k: y, then m's ACQUIREALL (m holds k),
/// then x; y also waits for l, which x holds. x can never have k before y,
/// and y never l before x: a deadlock, whose wait-for cycle y -> x -> y runs
/// past m's waiter (the graph used to stop there and never found it).
#[test]
fn a_cycle_past_a_waiter_whose_owner_holds_the_key() {
    let s = Server::start();
    let mut c = s.client();
    set_check_ms(&mut c, "100");
    int(&mut c, &["RLOCK.ACQUIRE", "{d}k", "m"]);
    int(&mut c, &["RLOCK.ACQUIRE", "{d}k2", "n"]);
    int(&mut c, &["RLOCK.ACQUIRE", "{d}l", "x"]);
    let mut parked = Vec::new();
    for args in [
        &["RLOCK.ACQUIRE", "{d}k", "y", "BLOCK", "0"][..],
        &["RLOCK.ACQUIREALL", "2", "{d}k", "{d}k2", "m", "BLOCK", "0"],
        &["RLOCK.ACQUIRE", "{d}k", "x", "BLOCK", "0"],
        &["RLOCK.ACQUIRE", "{d}l", "y", "BLOCK", "0"],
    ] {
        let before = stat(&mut c, "waiters");
        parked.push(park(&s, args));
        wait_parked(&mut c, before + 1);
    }
    // y's wait for l is the newest on the cycle.
    parked[3]
        .set_read_timeout(Some(Duration::from_secs(3)))
        .unwrap();
    let e = answered_error(&mut parked[3]);
    assert!(e.contains("wait-for cycle: y -> x -> y"), "{e}");
    assert_eq!(stat(&mut c, "deadlocks"), 1);
    assert_eq!(stat(&mut c, "waiters"), 3, "nobody else was answered");
}

/// A cycle no new wait closes: `SWAPDB` puts another lock under a parked
/// waiter, whose holder already waits for the waiter's owner. w waits for k
/// in db 0 (held by x); n holds k in db 1 and waits for l in db 2, which w
/// holds. Both waits were checked and on no cycle; after `SWAPDB 0 1` w
/// waits for n's k, and n for w's l, for ever. The swapped keys' waiters are
/// checked again (they were not: nobody was ever answered).
#[test]
fn a_cycle_closed_by_swapdb_is_found() {
    let s = Server::start();
    let mut c = s.client();
    set_check_ms(&mut c, "100");
    let in_db = |db: i64| {
        let mut c = s.client();
        let _: () = cmd("SELECT").arg(db).query(&mut c).unwrap();
        c
    };
    int(&mut c, &["RLOCK.ACQUIRE", "k", "x", "PX", "600000"]);
    int(&mut in_db(1), &["RLOCK.ACQUIRE", "k", "n", "PX", "600000"]);
    int(&mut in_db(2), &["RLOCK.ACQUIRE", "l", "w", "PX", "600000"]);
    let _w = park(&s, &["RLOCK.ACQUIRE", "k", "w", "BLOCK", "0"]);
    wait_parked(&mut c, 1);
    let mut n = in_db(2);
    n.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    n.send_packed_command(
        &cmd("RLOCK.ACQUIRE")
            .arg(&["l", "n", "BLOCK", "0"])
            .get_packed_command(),
    )
    .unwrap();
    wait_parked(&mut c, 2);
    sleep(Duration::from_millis(600));
    assert_eq!(stat(&mut c, "deadlocks"), 0, "no cycle yet");
    let _: () = cmd("SWAPDB").arg(0).arg(1).query(&mut c).unwrap();
    // n's wait for l is the newer one on the cycle.
    let e = answered_error(&mut n);
    assert!(e.contains("wait-for cycle: n -> w -> n"), "{e}");
    assert_eq!(stat(&mut c, "deadlocks"), 1);
    assert_eq!(stat(&mut c, "waiters"), 1);
}
