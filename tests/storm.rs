//! An expiry storm: 100,000 leases ending in the same few milliseconds. Every
//! lease ends, every parked waiter is served exactly once and in arrival order
//! per key, the server keeps answering meanwhile, and the counters are exact.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

/// Keys `k0`.. each locked by "holder" with a lease ending at `deadline` (unix
/// ms): `PX` is computed per pipelined batch of 1,000.
fn lease_until(c: &mut redis::Connection, locks: usize, deadline: i64) {
    for chunk in (0..locks).collect::<Vec<_>>().chunks(1000) {
        let px = deadline - unix_ms();
        let mut p = redis::pipe();
        for i in chunk {
            p.cmd("RLOCK.ACQUIRE")
                .arg(format!("k{i}"))
                .arg("holder")
                .arg("PX")
                .arg(px);
        }
        let _: Vec<i64> = p.query(c).unwrap();
    }
}

#[test]
fn a_hundred_thousand_leases_with_one_deadline() {
    const LOCKS: usize = 100_000;
    const CONTENDED: usize = 200;
    let s = Server::start_with(
        &["--save", "", "--appendonly", "no", "--maxclients", "2000"],
        &[],
    );
    let mut c = s.client();
    let deadline = unix_ms() + 4000;
    lease_until(&mut c, LOCKS, deadline);
    assert!(unix_ms() < deadline - 1000, "loading took too long to test");
    // Two waiters on each of the first keys, parked in a known order; each
    // holds for 300 ms once granted, so the second gets the lock when the
    // first one's lease ends.
    let mut waiters = Vec::new();
    for round in 0..2 {
        for i in 0..CONTENDED {
            let owner = format!("w{round}");
            waiters.push((
                i,
                round,
                spawn_call(
                    &s,
                    &[
                        "RLOCK.ACQUIRE",
                        &format!("k{i}"),
                        &owner,
                        "PX",
                        "300",
                        "BLOCK",
                        "20000",
                    ],
                ),
            ));
        }
        // A round's waiters all parked before the next round sends: the
        // order per key is known, and one wait per round keeps parking short
        // (a wait per waiter outlasted the deadline with IO threads).
        wait_parked(&mut c, ((round + 1) * CONTENDED) as i64);
    }
    assert!(unix_ms() < deadline, "parking took too long to test");
    // A client pinging throughout: the server must keep answering.
    let stop = Arc::new(AtomicBool::new(false));
    let pinger = {
        let mut p = s.client();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut worst = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                let t = Instant::now();
                let _: String = cmd("PING").query(&mut p).unwrap();
                worst = worst.max(t.elapsed());
                sleep(Duration::from_millis(1));
            }
            worst
        })
    };
    let mut tokens = vec![[0i64; 2]; CONTENDED];
    for (i, round, w) in waiters {
        match w.join().unwrap().0 {
            Ok(Value::Int(t)) => tokens[i][round] = t,
            other => panic!("waiter {round} of k{i} got {other:?}"),
        }
    }
    for (i, t) in tokens.iter().enumerate() {
        assert!(t[0] < t[1], "k{i}: granted out of arrival order {t:?}");
    }
    wait_until(Duration::from_secs(30), || stat(&mut c, "locks") == 0);
    stop.store(true, Ordering::Relaxed);
    let worst = pinger.join().unwrap();
    assert!(worst < Duration::from_secs(1), "PING waited {worst:?}");
    assert_eq!(int(&mut c, &["DBSIZE"]), 0);
    // Every lease ended exactly once: the holders', then both waiters'.
    assert_eq!(
        stat(&mut c, "lease_expirations"),
        (LOCKS + 2 * CONTENDED) as i64
    );
    assert_eq!(stat(&mut c, "contended_grants"), (2 * CONTENDED) as i64);
    assert_eq!(stat(&mut c, "grants"), (LOCKS + 2 * CONTENDED) as i64);
    assert_eq!(stat(&mut c, "waiters"), 0);
    assert_eq!(stat(&mut c, "wait_timeouts"), 0);
    assert_eq!(stat(&mut c, "lease_schedule"), 0);
}

/// The `expired` messages are published as Redis removes each key, and the
/// keyspace events follow from a queue the lease timer drains in short
/// slices: through a storm, each of them still comes exactly once per key.
#[test]
fn every_lease_ending_in_a_storm_is_published_and_notified_once() {
    const LOCKS: usize = 20_000;
    let s = Server::start_with(
        &[
            "--save",
            "",
            "--appendonly",
            "no",
            "--notify-keyspace-events",
            "Ed",
        ],
        &[],
    );
    let mut c = s.client();
    let mut sub = s.client();
    sub.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut ps = sub.as_pubsub();
    ps.psubscribe("__rlock@0__:*").unwrap();
    ps.subscribe("__keyevent@0__:rlock.expire").unwrap();
    let deadline = unix_ms() + 2000;
    lease_until(&mut c, LOCKS, deadline);
    assert!(unix_ms() < deadline - 500, "loading took too long to test");
    let mut published = vec![0u32; LOCKS];
    let mut notified = vec![0u32; LOCKS];
    let index = |key: &str| -> usize { key.trim_start_matches('k').parse().unwrap() };
    for _ in 0..2 * LOCKS {
        let m = ps
            .get_message()
            .expect("every ending is reported within 10 s");
        let payload: String = m.get_payload().unwrap();
        match m.get_channel_name() {
            "__keyevent@0__:rlock.expire" => notified[index(&payload)] += 1,
            channel => {
                let key = channel
                    .strip_prefix("__rlock@0__:")
                    .expect("a lock channel");
                assert_eq!(payload, "expired", "{channel}");
                published[index(key)] += 1;
            }
        }
    }
    assert!(unix_ms() > deadline, "a report came before the deadline");
    assert!(published.iter().all(|&n| n == 1), "channel: {published:?}");
    assert!(notified.iter().all(|&n| n == 1), "keyspace: {notified:?}");
    // Nothing more comes after the one of each.
    ps.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    assert!(ps.get_message().is_err(), "a report came twice");
    assert_eq!(stat(&mut c, "lease_expirations"), LOCKS as i64);
    assert_eq!(int(&mut c, &["DBSIZE"]), 0);
}

/// A tick that fires late (the event loop was busy) lets the clients have one
/// turn before it works, but only one: on a server kept busy by a client
/// whose commands each take a few milliseconds, so that every tick fires
/// late, a lease still ends and its waiter is handed the lock.
#[test]
fn a_server_kept_busy_still_hands_over() {
    let s = Server::start_with(&["--save", "", "--appendonly", "no"], &[]);
    let mut c = s.client();
    assert!(int(&mut c, &["RLOCK.ACQUIRE", "k", "holder", "PX", "300"]) > 0);
    let waiter = spawn_call(
        &s,
        &[
            "RLOCK.ACQUIRE",
            "k",
            "waiter",
            "PX",
            "10000",
            "BLOCK",
            "3000",
        ],
    );
    wait_parked(&mut c, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let mut b = s.client();
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut calls = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    let _: () = cmd("DEBUG")
                        .arg("SLEEP")
                        .arg("0.004")
                        .query(&mut b)
                        .unwrap();
                    calls += 1;
                }
                calls
            })
        })
        .collect();
    let (reply, _) = waiter.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    let calls: u32 = busy.into_iter().map(|b| b.join().unwrap()).sum();
    assert!(
        matches!(reply, Ok(Value::Int(t)) if t > 0),
        "the waiter got {reply:?}"
    );
    assert!(calls > 20, "the server was busy for {calls} calls only");
    let owner = call(&mut c, &["RLOCK.INFO", "k"]);
    assert!(format!("{owner:?}").contains("waiter"), "{owner:?}");
    assert_eq!(stat(&mut c, "contended_grants"), 1);
}
