//! Integration tests of the semaphore family (`SEMAPHORE.*`) against real
//! `redis-server` processes loading the module: grammar, permits and limits,
//! FIFO with large requests, leases, INFO, persistence, replication, a
//! 32-client history check and fuzzed arguments.

mod common;

use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

/// "At once": a woken waiter must have its reply within this bound.
const AT_ONCE: Duration = Duration::from_millis(500);

/// `SEMAPHORE.ACQUIRE key owner LIMIT n PERMITS k [opts...]`: token or None.
fn acquire(
    c: &mut Connection,
    key: &str,
    owner: &str,
    limit: u32,
    k: u32,
    opts: &[&str],
) -> Option<i64> {
    let (limit, k) = (limit.to_string(), k.to_string());
    let mut args = vec![
        "SEMAPHORE.ACQUIRE",
        key,
        owner,
        "LIMIT",
        &limit,
        "PERMITS",
        &k,
    ];
    args.extend_from_slice(opts);
    match call(c, &args) {
        Ok(Value::Int(token)) => Some(token),
        Ok(Value::Nil) => None,
        other => panic!("{args:?}: expected a token or nil, got {other:?}"),
    }
}

fn grant(c: &mut Connection, key: &str, owner: &str, limit: u32, k: u32) -> i64 {
    acquire(c, key, owner, limit, k, &[])
        .unwrap_or_else(|| panic!("{owner}: {k} of {limit} on {key} not granted"))
}

fn release(c: &mut Connection, key: &str, owner: &str, k: u32) -> i64 {
    int(
        c,
        &["SEMAPHORE.RELEASE", key, owner, "PERMITS", &k.to_string()],
    )
}

fn sem_info(c: &mut Connection, key: &str) -> Vec<(String, Value)> {
    info_map(c, &["SEMAPHORE.INFO", key]).unwrap_or_else(|| panic!("SEMAPHORE.INFO {key} is nil"))
}

fn info_int(c: &mut Connection, key: &str, name: &str) -> i64 {
    as_int(&field(&sem_info(c, key), name))
}

/// The `holders` of an INFO reply as (owner, permits, token), in grant order.
fn holdings(info: &[(String, Value)]) -> Vec<(String, i64, i64)> {
    let list = match field(info, "holders") {
        Value::Array(items) | Value::Set(items) => items,
        other => panic!("holders is not an array: {other:?}"),
    };
    list.iter()
        .map(|entry| {
            let p = match entry {
                Value::Array(items) => items
                    .chunks(2)
                    .map(|kv| (as_string(&kv[0]), kv[1].clone()))
                    .collect::<Vec<_>>(),
                Value::Map(items) => items
                    .iter()
                    .map(|(k, v)| (as_string(k), v.clone()))
                    .collect(),
                other => panic!("holder entry {other:?}"),
            };
            (
                as_string(&field(&p, "owner")),
                as_int(&field(&p, "permits")),
                as_int(&field(&p, "token")),
            )
        })
        .collect()
}

fn joined(
    p: std::thread::JoinHandle<(redis::RedisResult<Value>, Duration)>,
) -> (Option<i64>, Duration) {
    match p.join().unwrap() {
        (Ok(Value::Int(t)), d) => (Some(t), d),
        (Ok(Value::Nil), d) => (None, d),
        other => panic!("waiter got {other:?}"),
    }
}

#[test]
fn malformed_calls_are_errors_and_change_nothing() {
    let s = Server::start();
    let mut c = s.client();
    grant(&mut c, "s", "a", 3, 1);
    let before = digest(&mut c);
    let cases: &[(&[&str], &str)] = &[
        (&["SEMAPHORE.ACQUIRE", "s", "b"], "ERR LIMIT is required"),
        (
            &["SEMAPHORE.ACQUIRE", "s", "b", "PERMITS", "2"],
            "ERR LIMIT is required",
        ),
        (
            &["SEMAPHORE.ACQUIRE", "s", "b", "LIMIT", "2", "PERMITS", "3"],
            "ERR PERMITS is greater than LIMIT",
        ),
        (
            &["SEMAPHORE.ACQUIRE", "s", "b", "LIMIT", "0"],
            "ERR LIMIT is not a positive integer or out of range",
        ),
        (
            &["SEMAPHORE.ACQUIRE", "s", "b", "LIMIT", "-3"],
            "ERR LIMIT is not a positive integer or out of range",
        ),
        (
            &["SEMAPHORE.ACQUIRE", "s", "b", "LIMIT", "2.5"],
            "ERR LIMIT is not a positive integer or out of range",
        ),
        (
            &["SEMAPHORE.ACQUIRE", "s", "b", "LIMIT", "4294967296"],
            "ERR LIMIT is not a positive integer or out of range",
        ),
        (
            &["SEMAPHORE.ACQUIRE", "s", "b", "LIMIT", "3", "PERMITS", "0"],
            "ERR PERMITS is not a positive integer or out of range",
        ),
        (
            &["SEMAPHORE.ACQUIRE", "s", "b", "LIMIT", "3", "PERMITS", "x"],
            "ERR PERMITS is not a positive integer or out of range",
        ),
        (
            &["SEMAPHORE.ACQUIRE", "s", "b", "LIMIT", "3", "LIMIT", "3"],
            "ERR syntax error",
        ),
        (
            &[
                "SEMAPHORE.ACQUIRE",
                "s",
                "b",
                "LIMIT",
                "3",
                "PERMITS",
                "1",
                "PERMITS",
                "1",
            ],
            "ERR syntax error",
        ),
        (
            &[
                "SEMAPHORE.ACQUIRE",
                "s",
                "b",
                "LIMIT",
                "3",
                "PX",
                "5",
                "EX",
                "5",
            ],
            "ERR syntax error",
        ),
        (
            &["SEMAPHORE.ACQUIRE", "s", "b", "LIMIT"],
            "ERR syntax error",
        ),
        (
            &["SEMAPHORE.ACQUIRE", "s", "", "LIMIT", "3"],
            "ERR owner must not be empty",
        ),
        (
            &["SEMAPHORE.ACQUIRE", "s", "b", "LIMIT", "3", "PX", "0"],
            "ERR lease is not an integer or out of range",
        ),
        (
            &["SEMAPHORE.RELEASE", "s", "a", "PERMITS", "2"],
            "ERR the owner holds fewer permits than it releases",
        ),
        (
            &["SEMAPHORE.RELEASE", "s", "b"],
            "NOTOWNER the owner does not hold this lock",
        ),
        (
            &["SEMAPHORE.RELEASE", "s", "a", "PERMITS", "0"],
            "ERR PERMITS is not a positive integer or out of range",
        ),
        (
            &["SEMAPHORE.RELEASE", "s", "a", "LIMIT", "3"],
            "ERR syntax error",
        ),
        (
            &["SEMAPHORE.RELEASE", "s", "a", "PX", "3"],
            "ERR syntax error",
        ),
        (
            &["SEMAPHORE.RENEW", "s", "a", "PERMITS", "1"],
            "ERR syntax error",
        ),
        (
            &["SEMAPHORE.RENEW", "s", "b"],
            "NOTOWNER the owner does not hold this lock",
        ),
        (
            &["RLOCK.ACQUIRE", "s", "a"],
            "WRONGTYPE Operation against a key holding the wrong kind of value",
        ),
        (
            &["SEMAPHORE.INFO", "s", "COUNT", "-1"],
            "ERR count is not an integer or out of range",
        ),
    ];
    for (args, expected) in cases {
        assert_eq!(error(&mut c, args), *expected, "{args:?}");
        assert_eq!(digest(&mut c), before, "{args:?} changed the dataset");
    }
    let _: () = cmd("SET").arg("str").arg("x").query(&mut c).unwrap();
    assert!(
        error(&mut c, &["SEMAPHORE.ACQUIRE", "str", "a", "LIMIT", "1"]).starts_with("WRONGTYPE")
    );
    assert_eq!(
        error(&mut c, &["SEMAPHORE.ACQUIRE", "str", "a"]),
        "ERR LIMIT is required"
    );
    assert_eq!(info_int(&mut c, "s", "used"), 1);
}

#[test]
fn permits_up_to_the_limit_reacquire_and_release_counts() {
    let s = Server::start();
    let mut c = s.client();
    let ta = grant(&mut c, "s", "a", 5, 2);
    let tb = grant(&mut c, "s", "b", 5, 2);
    assert!(tb > ta);
    assert_eq!(acquire(&mut c, "s", "c", 5, 2, &[]), None, "4 of 5 in use");
    // The same owner adds permits if they fit, keeping its token.
    assert_eq!(grant(&mut c, "s", "a", 5, 1), ta);
    assert_eq!(acquire(&mut c, "s", "a", 5, 1, &[]), None, "full");
    let info = sem_info(&mut c, "s");
    assert_eq!(as_string(&field(&info, "kind")), "semaphore");
    assert_eq!(as_int(&field(&info, "limit")), 5);
    assert_eq!(as_int(&field(&info, "used")), 5);
    assert_eq!(as_int(&field(&info, "available")), 0);
    assert_eq!(as_int(&field(&info, "waiters")), 0);
    assert_eq!(
        holdings(&info),
        vec![("a".to_string(), 3, ta), ("b".to_string(), 2, tb)]
    );
    assert_eq!(release(&mut c, "s", "a", 2), 1);
    assert_eq!(int(&mut c, &["SEMAPHORE.RELEASE", "s", "a"]), 0);
    assert_eq!(release(&mut c, "s", "b", 2), 0);
    assert_eq!(
        int(&mut c, &["EXISTS", "s"]),
        0,
        "the key goes with the last permit"
    );
    assert!(is_nil(&mut c, &["SEMAPHORE.INFO", "s"]));
    // A new tenure of the same owner gets a new token.
    assert!(grant(&mut c, "s", "a", 5, 1) > tb);
    assert_eq!(int(&mut c, &["SEMAPHORE.FORCERELEASE", "s"]), 1);
    assert_eq!(int(&mut c, &["SEMAPHORE.FORCERELEASE", "s"]), 0);
}

#[test]
fn the_latest_limit_is_in_force_and_a_lower_one_ends_nobody() {
    let s = Server::start();
    let mut c = s.client();
    grant(&mut c, "s", "a", 4, 2);
    grant(&mut c, "s", "b", 4, 2);
    // Lowered to 2: both keep their permits; nobody new gets one.
    assert_eq!(acquire(&mut c, "s", "c", 2, 1, &[]), None);
    assert_eq!(info_int(&mut c, "s", "limit"), 2);
    assert_eq!(info_int(&mut c, "s", "available"), 0);
    assert_eq!(info_int(&mut c, "s", "used"), 4);
    release(&mut c, "s", "a", 2);
    assert_eq!(
        acquire(&mut c, "s", "c", 2, 1, &[]),
        None,
        "2 in use, limit 2"
    );
    release(&mut c, "s", "b", 1);
    assert!(acquire(&mut c, "s", "c", 2, 1, &[]).is_some());
    // Raised: a parked waiter that did not fit is let in by the raise itself.
    let w = spawn_call(
        &s,
        &[
            "SEMAPHORE.ACQUIRE",
            "s",
            "w",
            "LIMIT",
            "2",
            "PERMITS",
            "2",
            "BLOCK",
            "5000",
        ],
    );
    wait_parked(&mut c, 1);
    let raised = acquire(&mut c, "s", "d", 6, 1, &[]);
    let (t, waited) = joined(w);
    assert!(
        t.is_some() && waited < Duration::from_secs(4),
        "raise did not serve the waiter"
    );
    let (t, raised) = (
        t.unwrap(),
        raised.expect("room left after the waiter was served"),
    );
    assert!(raised > t, "the waiter was served first");
    assert_eq!(info_int(&mut c, "s", "used"), 5);
    assert!(acquire(&mut c, "s", "d", 6, 2, &[]).is_none());
    assert!(acquire(&mut c, "s", "e", 6, 1, &[]).is_some());
}

/// The limit in force outlives the last holder for the waiters its release
/// lets in: they are served under the latest ACQUIRE's limit, not their own.
#[test]
fn waiters_let_in_by_the_last_release_get_the_latest_limit() {
    let s = Server::start();
    let mut c = s.client();
    grant(&mut c, "sl", "a", 3, 3);
    let mut waiters = Vec::new();
    for (i, w) in ["w1", "w2", "w3"].into_iter().enumerate() {
        let args = ["SEMAPHORE.ACQUIRE", "sl", w, "LIMIT", "3", "BLOCK", "1500"];
        waiters.push(spawn_call(&s, &args));
        wait_parked(&mut c, i as i64 + 1);
    }
    assert_eq!(acquire(&mut c, "sl", "n", 1, 1, &[]), None);
    assert_eq!(release(&mut c, "sl", "a", 3), 0);
    let granted: Vec<bool> = waiters
        .into_iter()
        .map(|w| matches!(w.join().unwrap().0, Ok(Value::Int(_))))
        .collect();
    assert_eq!(
        granted,
        vec![true, false, false],
        "one permit under LIMIT 1"
    );
    assert_eq!(info_int(&mut c, "sl", "limit"), 1);
    assert_eq!(info_int(&mut c, "sl", "used"), 1);
}

/// A lowered limit a waiter does not fit under outlives the last holding,
/// however it ends (release, FORCERELEASE, its lease): the key is gone, the
/// waiter still waits, and the next ACQUIRE's limit is the one in force,
/// never the waiter's own. A replica follows.
#[test]
fn a_lowered_limit_outlives_the_last_holding_while_waiters_remain() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut c = master.client();
    for end in ["release", "forcerelease", "lease"] {
        let key = format!("lo-{end}");
        let lease = if end == "lease" { "300" } else { "60000" };
        acquire(&mut c, &key, "h", 5, 3, &["PX", lease]).expect("3 of 5");
        let args = [
            "SEMAPHORE.ACQUIRE",
            &key,
            "w",
            "LIMIT",
            "5",
            "PERMITS",
            "4",
            "BLOCK",
            "5000",
        ];
        let w = spawn_call(&master, &args);
        wait_parked(&mut c, 1);
        assert_eq!(acquire(&mut c, &key, "y", 2, 1, &[]), None, "{end}");
        match end {
            "release" => assert_eq!(release(&mut c, &key, "h", 3), 0),
            "forcerelease" => assert_eq!(int(&mut c, &["SEMAPHORE.FORCERELEASE", &key]), 1),
            _ => sleep(Duration::from_millis(600)),
        }
        sleep(Duration::from_millis(50));
        assert_eq!(stat(&mut c, "waiters"), 1, "{end}: still waiting (4 > 2)");
        assert_eq!(int(&mut c, &["EXISTS", &key]), 0, "{end}");
        // A newcomer under LIMIT 2 neither overtakes it nor lets it in under 5.
        assert_eq!(acquire(&mut c, &key, "q", 2, 1, &[]), None, "{end}");
        assert_eq!(stat(&mut c, "waiters"), 1, "{end}");
        // Raised to 4: it fits, and takes the key under that limit.
        assert_eq!(acquire(&mut c, &key, "z", 4, 1, &[]), None, "{end}");
        assert!(matches!(w.join().unwrap().0, Ok(Value::Int(_))), "{end}");
        assert_eq!(info_int(&mut c, &key, "limit"), 4, "{end}");
        assert_eq!(info_int(&mut c, &key, "used"), 4, "{end}");
    }
    let acked: i64 = cmd("WAIT").arg(1).arg(2000).query(&mut c).unwrap();
    assert_eq!(acked, 1);
    assert_eq!(digest(&mut c), digest(&mut replica.client()));
}

#[test]
fn fifo_large_head_blocks_smaller_ones_and_one_release_serves_many() {
    let s = Server::start();
    let mut c = s.client();
    grant(&mut c, "s", "a", 4, 3);
    let big = spawn_call(
        &s,
        &[
            "SEMAPHORE.ACQUIRE",
            "s",
            "big",
            "LIMIT",
            "4",
            "PERMITS",
            "3",
            "BLOCK",
            "10000",
        ],
    );
    wait_parked(&mut c, 1);
    let small1 = spawn_call(
        &s,
        &[
            "SEMAPHORE.ACQUIRE",
            "s",
            "s1",
            "LIMIT",
            "4",
            "BLOCK",
            "10000",
        ],
    );
    wait_parked(&mut c, 2);
    let small2 = spawn_call(
        &s,
        &[
            "SEMAPHORE.ACQUIRE",
            "s",
            "s2",
            "LIMIT",
            "4",
            "BLOCK",
            "10000",
        ],
    );
    wait_parked(&mut c, 3);
    // One permit is free, but the large head is not overtaken.
    assert_eq!(acquire(&mut c, "s", "late", 4, 1, &[]), None);
    sleep(Duration::from_millis(100));
    assert_eq!(
        stat(&mut c, "waiters"),
        3,
        "a small request overtook the large head"
    );
    let grants = stat(&mut c, "grants");
    // One release frees 3: the head (3) and s1 (1) fit, s2 waits.
    let freed = Instant::now();
    assert_eq!(release(&mut c, "s", "a", 3), 0);
    let (t_big, _) = joined(big);
    let (t_s1, _) = joined(small1);
    assert!(freed.elapsed() < AT_ONCE);
    let (t_big, t_s1) = (t_big.unwrap(), t_s1.unwrap());
    assert!(t_big < t_s1, "served in arrival order");
    assert_eq!(stat(&mut c, "grants"), grants + 2);
    assert_eq!(stat(&mut c, "waiters"), 1);
    assert_eq!(info_int(&mut c, "s", "used"), 4);
    release(&mut c, "s", "big", 3);
    let (t_s2, _) = joined(small2);
    assert!(t_s2.unwrap() > t_s1);
    assert_eq!(info_int(&mut c, "s", "used"), 2);
}

#[test]
fn a_crashed_holders_permits_return_when_its_lease_ends() {
    let s = Server::start();
    let mut c = s.client();
    grant(&mut c, "s", "keeps", 3, 1);
    // The lease starts after this instant, so it cannot end before +300 ms.
    let started = Instant::now();
    acquire(&mut c, "s", "dies", 3, 2, &["PX", "300"]).unwrap();
    let w = spawn_call(
        &s,
        &[
            "SEMAPHORE.ACQUIRE",
            "s",
            "w",
            "LIMIT",
            "3",
            "PERMITS",
            "2",
            "BLOCK",
            "5000",
        ],
    );
    wait_parked(&mut c, 1);
    let (t, _) = joined(w);
    assert!(t.is_some(), "the waiter got the expired holder's permits");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    let info = sem_info(&mut c, "s");
    let owners: Vec<String> = holdings(&info).into_iter().map(|h| h.0).collect();
    assert_eq!(owners, ["keeps", "w"]);
    assert!(stat(&mut c, "lease_expirations") >= 1);
    // RENEW moves one holding's lease, not the others'.
    assert_eq!(
        int(&mut c, &["SEMAPHORE.RENEW", "s", "w", "PX", "100000"]),
        1
    );
    assert!(int(&mut c, &["PTTL", "s"]) > 90_000);
}

#[test]
fn info_in_resp2_and_resp3_and_count() {
    let s = Server::start();
    let mut c2 = s.client();
    let mut c3 = s.client_resp3();
    for i in 0..5 {
        grant(&mut c2, "s", &format!("o{i}"), 10, 2);
    }
    let flat = call(&mut c2, &["SEMAPHORE.INFO", "s"]).unwrap();
    assert!(matches!(flat, Value::Array(_)), "{flat:?}");
    let map = call(&mut c3, &["SEMAPHORE.INFO", "s"]).unwrap();
    assert!(matches!(map, Value::Map(_)), "{map:?}");
    let (a, b) = (parse_info(flat).unwrap(), parse_info(map).unwrap());
    for name in ["limit", "used", "available", "holder_count", "waiters"] {
        assert_eq!(field(&a, name), field(&b, name), "{name}");
    }
    assert_eq!(holdings(&a), holdings(&b));
    let capped = info_map(&mut c2, &["SEMAPHORE.INFO", "s", "COUNT", "2"]).unwrap();
    assert_eq!(holdings(&capped).len(), 2);
    assert_eq!(as_int(&field(&capped, "holder_count")), 5);
    assert_eq!(as_int(&field(&capped, "used")), 10);
    assert!(error(&mut c2, &["RWLOCK.INFO", "s"]).starts_with("WRONGTYPE"));
}

#[test]
fn events_and_the_unlock_channel() {
    let s = Server::start();
    let mut c = s.client();
    let _: () = cmd("CONFIG")
        .arg("SET")
        .arg("notify-keyspace-events")
        .arg("KEd")
        .query(&mut c)
        .unwrap();
    let mut sub = s.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("__rlock@0__:s").unwrap();
    pubsub
        .subscribe("__keyevent@0__:semaphore.acquire")
        .unwrap();
    pubsub.subscribe("__keyevent@0__:semaphore.expire").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut next = || {
        let m = pubsub.get_message().unwrap();
        (
            m.get_channel_name().to_string(),
            m.get_payload::<String>().unwrap(),
        )
    };
    grant(&mut c, "s", "a", 3, 2);
    assert_eq!(
        next(),
        ("__keyevent@0__:semaphore.acquire".into(), "s".into())
    );
    release(&mut c, "s", "a", 1);
    assert_eq!(
        next(),
        ("__rlock@0__:s".into(), "released".into()),
        "returned permits are published"
    );
    acquire(&mut c, "s", "b", 3, 1, &["PX", "50"]).unwrap();
    assert_eq!(next().0, "__keyevent@0__:semaphore.acquire");
    assert_eq!(next(), ("__rlock@0__:s".into(), "expired".into()));
    assert_eq!(
        next(),
        ("__keyevent@0__:semaphore.expire".into(), "s".into())
    );
}

#[test]
fn keepalive_holds_permits_until_the_connection_closes() {
    let s = Server::start();
    let mut c = s.client();
    let mut holder = s.client();
    let id = client_id(&mut holder);
    acquire(&mut holder, "s", "a", 2, 2, &["PX", "300", "KEEPALIVE"]).unwrap();
    sleep(Duration::from_millis(700));
    let info = sem_info(&mut c, "s");
    assert_eq!(
        holdings(&info).len(),
        1,
        "renewed by the server past its lease"
    );
    let w = spawn_call(
        &s,
        &["SEMAPHORE.ACQUIRE", "s", "w", "LIMIT", "2", "BLOCK", "5000"],
    );
    wait_parked(&mut c, 1);
    let _: () = cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(&mut c)
        .unwrap();
    let (t, waited) = joined(w);
    assert!(t.is_some() && waited < Duration::from_secs(3));
}

/// A semaphore with holders of every shape: several owners, permits, leases.
fn populate(c: &mut Connection) -> Vec<(String, i64, i64)> {
    grant(c, "sem", "a", 10, 3);
    acquire(c, "sem", "b", 10, 2, &["PX", "400000"]).unwrap();
    grant(c, "sem", "a", 10, 1);
    acquire(c, "sem", "c", 7, 1, &["PX", "300000"]).unwrap();
    // Lowered below the permits in use: nothing ends, nothing new fits.
    assert_eq!(acquire(c, "sem", "d", 6, 1, &[]), None);
    grant(c, "one", "x", 1, 1);
    // One holding alone above a lowered limit.
    grant(c, "big", "x", 3, 3);
    assert_eq!(acquire(c, "big", "y", 1, 1, &[]), None);
    holdings(&sem_info(c, "sem"))
}

fn assert_state(c: &mut Connection, expected: &[(String, i64, i64)]) {
    let info = sem_info(c, "sem");
    assert_eq!(holdings(&info), expected);
    assert_eq!(as_int(&field(&info, "limit")), 6);
    assert_eq!(as_int(&field(&info, "used")), 7);
    assert_eq!(info_int(c, "one", "limit"), 1);
    assert_eq!(info_int(c, "big", "limit"), 1);
    assert_eq!(info_int(c, "big", "used"), 3);
}

#[test]
fn debug_reload_and_restart_from_rdb_keep_holdings_and_limit() {
    let mut s = Server::start_with(&["--save", ""], &[]);
    let mut c = s.client();
    let expected = populate(&mut c);
    let before = digest(&mut c);
    let _: () = cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
    assert_eq!(digest(&mut c), before);
    assert_state(&mut c, &expected);
    let _: () = cmd("SAVE").query(&mut c).unwrap();
    s.restart();
    let mut c = s.client();
    assert_eq!(digest(&mut c), before);
    assert_state(&mut c, &expected);
    // The restored limit is in force: 7 of 6 used, nothing fits.
    assert_eq!(acquire(&mut c, "sem", "d", 6, 1, &[]), None);
    let max = expected.iter().map(|h| h.2).max().unwrap();
    assert!(grant(&mut c, "new", "z", 1, 1) > max);
}

#[test]
fn aof_replay_and_rewrite_keep_holdings_and_limit() {
    for (preamble, rewrite) in [("no", false), ("no", true), ("yes", true)] {
        let mut s = Server::start_with(
            &[
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--aof-use-rdb-preamble",
                preamble,
            ],
            &[],
        );
        let mut c = s.client();
        let expected = populate(&mut c);
        if rewrite {
            let _: String = cmd("BGREWRITEAOF").query(&mut c).unwrap();
            wait_until(Duration::from_secs(30), || {
                let info: String = cmd("INFO").arg("persistence").query(&mut c).unwrap();
                info.contains("aof_rewrite_in_progress:0")
                    && info.contains("aof_rewrite_scheduled:0")
            });
            let info: String = cmd("INFO").arg("persistence").query(&mut c).unwrap();
            assert!(info.contains("aof_last_bgrewrite_status:ok"), "{info}");
        }
        let before = digest(&mut c);
        s.restart();
        let mut c = s.client();
        assert_eq!(
            digest(&mut c),
            before,
            "preamble={preamble} rewrite={rewrite}"
        );
        assert_state(&mut c, &expected);
    }
}

#[test]
fn a_replica_holds_the_same_state() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let (mut m, mut r) = (master.client(), replica.client());
    let expected = populate(&mut m);
    // A waiter served by a release, a partial release, a raised limit.
    let w = spawn_call(
        &master,
        &[
            "SEMAPHORE.ACQUIRE",
            "sem",
            "w",
            "LIMIT",
            "6",
            "PERMITS",
            "2",
            "BLOCK",
            "5000",
        ],
    );
    wait_parked(&mut m, 1);
    release(&mut m, "sem", "a", 3);
    assert!(joined(w).0.is_some());
    grant(&mut m, "sem", "e", 9, 3);
    let acked: i64 = cmd("WAIT").arg(1).arg(2000).query(&mut m).unwrap();
    assert_eq!(acked, 1);
    assert_eq!(digest(&mut m), digest(&mut r));
    let (mi, ri) = (sem_info(&mut m, "sem"), sem_info(&mut r, "sem"));
    assert_eq!(holdings(&mi), holdings(&ri));
    assert_eq!(field(&ri, "limit"), Value::Int(9));
    assert_ne!(holdings(&mi), expected);
    assert!(
        error(&mut r, &["SEMAPHORE.ACQUIRE", "sem", "x", "LIMIT", "9"]).starts_with("READONLY")
    );
    int(&mut m, &["SEMAPHORE.FORCERELEASE", "sem"]);
    let _: i64 = cmd("WAIT").arg(1).arg(2000).query(&mut m).unwrap();
    assert_eq!(int(&mut r, &["EXISTS", "sem"]), 0);
    assert_eq!(digest(&mut m), digest(&mut r));
}

/// One holding as a client saw it: the server-side holding contains
/// [granted, released]; [asked, freed] contains the server-side holding.
#[derive(Clone, Debug)]
struct Held {
    token: i64,
    permits: i64,
    asked: Instant,
    granted: Instant,
    released: Instant,
    freed: Instant,
}

#[test]
fn thirty_two_clients_never_hold_more_than_the_limit() {
    const LIMIT: i64 = 8;
    let s = Server::start();
    let log = Arc::new(Mutex::new(Vec::<Held>::new()));
    let until = Instant::now() + Duration::from_secs(3);
    let workers: Vec<_> = (0..32u64)
        .map(|t| {
            let (mut c, log) = (s.client(), log.clone());
            std::thread::spawn(move || {
                let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ (t + 1);
                let owner = format!("o{t}");
                let mut mine = Vec::new();
                while Instant::now() < until {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = 1 + (x % 3) as u32;
                    let asked = Instant::now();
                    let Some(token) = acquire(
                        &mut c,
                        "load",
                        &owner,
                        LIMIT as u32,
                        k,
                        &["PX", "5000", "BLOCK", "2000"],
                    ) else {
                        continue;
                    };
                    let granted = Instant::now();
                    sleep(Duration::from_micros(x % 500));
                    let released = Instant::now();
                    assert_eq!(release(&mut c, "load", &owner, k), 0);
                    mine.push(Held {
                        token,
                        permits: k as i64,
                        asked,
                        granted,
                        released,
                        freed: Instant::now(),
                    });
                }
                log.lock().unwrap().extend(mine);
            })
        })
        .collect();
    workers.into_iter().for_each(|w| w.join().unwrap());
    let mut holds = log.lock().unwrap().clone();
    assert!(holds.len() > 500, "only {} holdings in 3 s", holds.len());
    // Permits in use at every instant a holding began (client intervals lie
    // inside the server's, so any excess proves the server over-granted).
    let mut events: Vec<(Instant, i64)> = holds
        .iter()
        .flat_map(|h| [(h.granted, h.permits), (h.released, -h.permits)])
        .collect();
    events.sort_by_key(|e| (e.0, e.1));
    let mut in_use = 0;
    for (at, delta) in events {
        in_use += delta;
        assert!(in_use <= LIMIT, "{in_use} permits held at {at:?}");
    }
    // Tokens: distinct, and a holding asked for after another was freed has a larger one.
    let mut tokens: Vec<i64> = holds.iter().map(|h| h.token).collect();
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), holds.len(), "a token was issued twice");
    let mut by_freed = holds.clone();
    by_freed.sort_by_key(|h| h.freed);
    holds.sort_by_key(|h| h.asked);
    let (mut i, mut max_before) = (0, 0);
    for h in &holds {
        while i < by_freed.len() && by_freed[i].freed < h.asked {
            max_before = max_before.max(by_freed[i].token);
            i += 1;
        }
        assert!(
            h.token > max_before,
            "token {} after a freed holding with {max_before}",
            h.token
        );
    }
    let mut c = s.client();
    assert_eq!(stat(&mut c, "waiters"), 0);
    assert_eq!(int(&mut c, &["EXISTS", "load"]), 0);
}

#[test]
fn fuzzed_arguments_never_crash_and_errors_change_nothing() {
    let s = Server::start();
    let mut c = s.client();
    let words = [
        "LIMIT",
        "PERMITS",
        "PX",
        "EX",
        "BLOCK",
        "KEEPALIVE",
        "limit",
        "permits",
        "COUNT",
        "READ",
        "0",
        "1",
        "2",
        "3",
        "8",
        "-1",
        "4294967295",
        "4294967296",
        "9223372036854775807",
        "x",
        "",
        "1.5",
        "+1",
        "01",
    ];
    let commands = [
        "SEMAPHORE.ACQUIRE",
        "SEMAPHORE.RELEASE",
        "SEMAPHORE.RENEW",
        "SEMAPHORE.FORCERELEASE",
        "SEMAPHORE.INFO",
    ];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let mut rnd = move |n: usize| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        (x % n as u64) as usize
    };
    let mut errors = 0;
    for _ in 0..3000 {
        let mut args = vec![
            commands[rnd(commands.len())],
            ["f1", "f2"][rnd(2)],
            ["a", "b", ""][rnd(3)],
        ];
        for _ in 0..rnd(7) {
            args.push(words[rnd(words.len())]);
        }
        // A BLOCK that could park waits 1 ms at most.
        for i in 0..args.len().saturating_sub(1) {
            if args[i].eq_ignore_ascii_case("BLOCK") && args[i + 1] == "0" {
                args[i + 1] = "1";
            }
        }
        let before = digest(&mut c);
        if call(&mut c, &args).is_err() {
            errors += 1;
            assert_eq!(
                digest(&mut c),
                before,
                "{args:?} failed but changed the dataset"
            );
        }
    }
    assert!(errors > 500, "the fuzz reached few error paths ({errors})");
    let pong: String = cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
}
