//! KEEPALIVE (SPEC "Keepalive holds"): the server renews a holding while the
//! connection that was granted it is open, and ends it when it closes.

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

fn info_field(c: &mut Connection, cmd_name: &str, key: &str, name: &str) -> Value {
    info_map(c, &[cmd_name, key])
        .map(|i| field(&i, name))
        .unwrap_or(Value::Nil)
}

fn keepalive_of(c: &mut Connection, key: &str) -> Option<i64> {
    match info_field(c, "RLOCK.INFO", key, "keepalive") {
        Value::Int(id) => Some(id),
        _ => None,
    }
}

#[test]
fn the_server_renews_while_the_connection_is_open() {
    let s = Server::start();
    let mut holder = s.client();
    let id = client_id(&mut holder);
    let token = int(
        &mut holder,
        &["RLOCK.ACQUIRE", "k", "o", "PX", "300", "KEEPALIVE"],
    );
    let mut c = s.client();
    assert_eq!(keepalive_of(&mut c, "k"), Some(id));
    // Five leases long: still held, by the same tenure, never past 300 ms.
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(1500) {
        let ttl = as_int(&info_field(&mut c, "RLOCK.INFO", "k", "ttl"));
        assert!((0..=300).contains(&ttl), "ttl {ttl}");
        sleep(Duration::from_millis(50));
    }
    assert_eq!(
        as_int(&info_field(&mut c, "RLOCK.INFO", "k", "token")),
        token
    );
    assert_eq!(stat(&mut c, "lease_expirations"), 0);
    // Without KEEPALIVE the same lease ends.
    int(&mut c, &["RLOCK.ACQUIRE", "plain", "o", "PX", "300"]);
    assert_eq!(keepalive_of(&mut c, "plain"), None);
    sleep(Duration::from_millis(600));
    assert_eq!(int(&mut c, &["EXISTS", "plain"]), 0);
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 1);
}

#[test]
fn a_closed_or_killed_connection_ends_its_holdings_as_releases() {
    let s = Server::start();
    let mut c = s.client();
    let mut sub = s.client();
    let mut pubsub = sub.as_pubsub();
    pubsub.subscribe("__rlock@0__:k1").unwrap();
    pubsub
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    for how in ["close", "kill"] {
        let mut holder = s.client();
        let id = client_id(&mut holder);
        int(
            &mut holder,
            &["RLOCK.ACQUIRE", "k1", "o", "PX", "60000", "KEEPALIVE"],
        );
        int(&mut holder, &["RLOCK.ACQUIRE", "k1", "o"]);
        int(&mut holder, &["FAIRLOCK.ACQUIRE", "k2", "o", "KEEPALIVE"]);
        let w = spawn_call(&s, &["RLOCK.ACQUIRE", "k1", "w", "BLOCK", "5000"]);
        wait_parked(&mut c, 1);
        let start = Instant::now();
        if how == "close" {
            drop(holder);
        } else {
            let _: () = cmd("CLIENT")
                .arg("KILL")
                .arg("ID")
                .arg(id)
                .query(&mut c)
                .unwrap();
        }
        // Both holds end at once (it held k1 twice), the waiter is served.
        let (reply, _) = w.join().unwrap();
        assert!(matches!(reply.unwrap(), Value::Int(_)), "{how}");
        assert!(start.elapsed() < Duration::from_secs(2), "{how}");
        assert_eq!(int(&mut c, &["EXISTS", "k2"]), 0, "{how}");
        let msg = pubsub.get_message().unwrap();
        assert_eq!(msg.get_payload::<String>().unwrap(), "released", "{how}");
        int(&mut c, &["RLOCK.RELEASE", "k1", "w"]);
        let msg = pubsub.get_message().unwrap();
        assert_eq!(msg.get_payload::<String>().unwrap(), "released");
    }
}

#[test]
fn the_binding_belongs_to_the_tenure() {
    let s = Server::start();
    let mut holder = s.client();
    let id = client_id(&mut holder);
    let mut other = s.client();
    int(
        &mut holder,
        &[
            "RWLOCK.ACQUIRE",
            "rw",
            "READ",
            "o",
            "PX",
            "300",
            "KEEPALIVE",
        ],
    );
    // More holds and a renewal from another connection keep the binding.
    int(
        &mut other,
        &["RWLOCK.ACQUIRE", "rw", "READ", "o", "PX", "300"],
    );
    int(&mut other, &["RWLOCK.RENEW", "rw", "o", "PX", "300"]);
    int(&mut other, &["RWLOCK.RELEASE", "rw", "READ", "o"]);
    sleep(Duration::from_millis(800));
    let info = info_map(&mut other, &["RWLOCK.INFO", "rw"]).expect("still held");
    let Value::Array(readers) = field(&info, "readers") else {
        panic!("{info:?}")
    };
    let reader = parse_info(readers[0].clone()).unwrap();
    assert_eq!(as_int(&field(&reader, "keepalive")), id);
    assert_eq!(field(&info, "writer_keepalive"), Value::Nil);
    // The tenure ends; the owner's next tenure, without KEEPALIVE, is not kept.
    int(&mut other, &["RWLOCK.RELEASE", "rw", "READ", "o"]);
    int(
        &mut other,
        &["RWLOCK.ACQUIRE", "rw", "WRITE", "o", "PX", "300"],
    );
    assert_eq!(
        info_field(&mut other, "RWLOCK.INFO", "rw", "writer_keepalive"),
        Value::Nil
    );
    sleep(Duration::from_millis(600));
    assert_eq!(int(&mut other, &["EXISTS", "rw"]), 0);
    // A tenure started without KEEPALIVE is bound by a later KEEPALIVE acquisition.
    int(&mut other, &["RLOCK.ACQUIRE", "k", "o", "PX", "300"]);
    int(
        &mut holder,
        &["RLOCK.ACQUIRE", "k", "o", "PX", "300", "KEEPALIVE"],
    );
    assert_eq!(keepalive_of(&mut other, "k"), Some(id));
    sleep(Duration::from_millis(600));
    assert_eq!(int(&mut other, &["EXISTS", "k"]), 1);
    drop(holder);
    wait_until(Duration::from_secs(2), || {
        int(&mut other, &["EXISTS", "k"]) == 0
    });
}

#[test]
fn a_parked_waiter_is_bound_once_granted() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "a", "h"]);
    int(&mut c, &["RLOCK.ACQUIRE", "b", "h"]);
    let mut waiter = s.client();
    let id = client_id(&mut waiter);
    let single = std::thread::spawn(move || {
        let r = call(
            &mut waiter,
            &[
                "RLOCK.ACQUIRE",
                "a",
                "w",
                "PX",
                "300",
                "BLOCK",
                "5000",
                "KEEPALIVE",
            ],
        );
        (r, waiter)
    });
    wait_parked(&mut c, 1);
    int(&mut c, &["RLOCK.RELEASE", "a", "h"]);
    let (reply, waiter) = single.join().unwrap();
    assert!(matches!(reply.unwrap(), Value::Int(_)));
    assert_eq!(keepalive_of(&mut c, "a"), Some(id));
    // ACQUIREALL ... KEEPALIVE binds every key, also when granted after a wait.
    let mut multi = s.client();
    let mid = client_id(&mut multi);
    let all = std::thread::spawn(move || {
        let r = call(
            &mut multi,
            &[
                "RLOCK.ACQUIREALL",
                "2",
                "b",
                "c",
                "m",
                "PX",
                "300",
                "BLOCK",
                "5000",
                "KEEPALIVE",
            ],
        );
        (r, multi)
    });
    wait_parked(&mut c, 1);
    int(&mut c, &["RLOCK.RELEASE", "b", "h"]);
    let (reply, multi) = all.join().unwrap();
    assert!(matches!(reply.unwrap(), Value::Array(_)));
    sleep(Duration::from_millis(700));
    assert_eq!(keepalive_of(&mut c, "b"), Some(mid));
    assert_eq!(keepalive_of(&mut c, "c"), Some(mid));
    assert_eq!(keepalive_of(&mut c, "a"), Some(id));
    drop(waiter);
    drop(multi);
    wait_until(Duration::from_secs(2), || {
        int(&mut c, &["EXISTS", "a", "b", "c"]) == 0
    });
}

#[test]
fn renewals_replicate_and_bindings_do_not() {
    let master = Server::start();
    let mut replica = Server::start();
    replica.replicate_from(&master);
    let mut holder = master.client();
    int(
        &mut holder,
        &["RLOCK.ACQUIRE", "k", "o", "PX", "600", "KEEPALIVE"],
    );
    let mut r = replica.client();
    sleep(Duration::from_millis(1500));
    // The replica follows the renewals (its copy would have ended by now).
    let info = info_map(&mut r, &["RLOCK.INFO", "k"]).expect("replicated");
    assert_eq!(as_string(&field(&info, "owner")), "o");
    assert_eq!(field(&info, "keepalive"), Value::Nil);
    // Promoted, it keeps the holding only until its last replicated deadline.
    let _: () = cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).unwrap();
    wait_until(Duration::from_secs(3), || {
        int(&mut r, &["EXISTS", "k"]) == 0
    });
    replica.kill();
}

#[test]
fn a_reload_keeps_no_binding() {
    let s = Server::start();
    let mut holder = s.client();
    int(
        &mut holder,
        &["RLOCK.ACQUIRE", "k", "o", "PX", "800", "KEEPALIVE"],
    );
    assert_eq!(stat(&mut holder, "keepalive_holds"), 1);
    let _: () = cmd("DEBUG").arg("RELOAD").query(&mut holder).unwrap();
    assert_eq!(stat(&mut holder, "keepalive_holds"), 0);
    assert_eq!(keepalive_of(&mut holder, "k"), None);
    // The holding runs out its last lease although the connection is open.
    wait_until(Duration::from_secs(3), || {
        int(&mut holder, &["EXISTS", "k"]) == 0
    });
}

#[test]
fn grammar_and_scripts() {
    let s = Server::start();
    let mut c = s.client();
    for args in [
        &["RLOCK.ACQUIRE", "k", "o", "KEEPALIVE", "KEEPALIVE"][..],
        &["RLOCK.RENEW", "k", "o", "KEEPALIVE"],
        &["RLOCK.RENEWALL", "1", "k", "o", "KEEPALIVE"],
    ] {
        let e = error(&mut c, args);
        assert!(e.starts_with("ERR syntax"), "{args:?}: {e}");
    }
    let e: redis::RedisError = cmd("EVAL")
        .arg("return redis.call('RLOCK.ACQUIRE', KEYS[1], 'o', 'KEEPALIVE')")
        .arg(1)
        .arg("k")
        .query::<Value>(&mut c)
        .unwrap_err();
    assert!(e.to_string().contains("KEEPALIVE"), "{e}");
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    // Any case, any position; inside MULTI it binds the transaction's client.
    let id = client_id(&mut c);
    let (t,): (i64,) = redis::pipe()
        .atomic()
        .cmd("RLOCK.ACQUIRE")
        .arg(&["k", "o", "keepalive", "PX", "5000"])
        .query(&mut c)
        .unwrap();
    assert!(t > 0);
    assert_eq!(keepalive_of(&mut c, "k"), Some(id));
}

/// A bound holding renewed or acquired again with a shorter lease (from any
/// connection, without KEEPALIVE) keeps being renewed in time: the binding
/// takes the latest lease, and the connection's holding never runs out.
#[test]
fn a_shorter_lease_set_later_is_renewed_in_time() {
    let s = Server::start();
    let mut holder = s.client();
    let mut c = s.client();
    for (key, family, acquire) in [
        ("r", "RLOCK", &["RLOCK.ACQUIRE", "r", "o"][..]),
        ("w", "RWLOCK", &["RWLOCK.ACQUIRE", "w", "READ", "o"]),
        (
            "s",
            "SEMAPHORE",
            &["SEMAPHORE.ACQUIRE", "s", "o", "LIMIT", "5"],
        ),
    ] {
        let with = |extra: &[&'static str]| [acquire, extra].concat();
        let token = int(&mut holder, &with(&["PX", "3000", "KEEPALIVE"]));
        // Acquired again from another connection with PX 300, then renewed
        // to PX 250: either would end the holding before the renewal the
        // 3 s lease scheduled (at 1 s). The server renews the 250 ms lease
        // every 83 ms, so a stall of up to ~160 ms (a loaded test machine)
        // still finds it held.
        assert_eq!(int(&mut c, &with(&["PX", "300"])), token, "{family}");
        sleep(Duration::from_millis(100));
        let renew = format!("{family}.RENEW");
        assert_eq!(int(&mut c, &[&renew, key, "o", "PX", "250"]), 1, "{family}");
        sleep(Duration::from_millis(1200));
        let info = info_map(&mut c, &[&format!("{family}.INFO"), key]);
        let ttl = as_int(&field(&info.expect(family), "ttl"));
        assert!((0..=250).contains(&ttl), "{family}: ttl {ttl}");
    }
    assert_eq!(stat(&mut c, "lease_expirations"), 0);
}

/// The holdings of a closing connection end on the module's own timer, not
/// in the disconnect event: there the context's client is the closing one,
/// and selecting a holding's database in it moved that client under Redis,
/// which then unblocked it from the wrong database (the server aborted).
#[test]
fn a_connection_parked_in_another_database_closes_cleanly() {
    let s = Server::start();
    let mut a = s.client();
    let id = client_id(&mut a);
    int(
        &mut a,
        &["RLOCK.ACQUIRE", "k1", "a", "PX", "10000", "KEEPALIVE"],
    );
    let mut h = s.client();
    let _: () = cmd("SELECT").arg(1).query(&mut h).unwrap();
    int(&mut h, &["RLOCK.ACQUIRE", "k2", "h", "PX", "10000"]);
    let _: () = cmd("SELECT").arg(1).query(&mut a).unwrap();
    let parked =
        std::thread::spawn(move || call(&mut a, &["RLOCK.ACQUIRE", "k2", "a", "BLOCK", "5000"]));
    let mut c = s.client();
    wait_parked(&mut c, 1);
    let _: () = cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(&mut c)
        .unwrap();
    assert!(parked.join().unwrap().is_err());
    wait_until(Duration::from_secs(2), || {
        int(&mut c, &["EXISTS", "k1"]) == 0
    });
    assert_eq!(stat(&mut c, "waiters"), 0);
    assert_eq!(stat(&mut c, "keepalive_holds"), 0);
    let _: () = cmd("SELECT").arg(1).query(&mut c).unwrap();
    assert_eq!(int(&mut c, &["RLOCK.RELEASE", "k2", "h"]), 0);
}

/// Redis arms a module timer at `now + delay * 1000` microseconds: a delay
/// near 2^64 / 1000 ms wraps into the past, and a timer in the past fires
/// again as soon as it is re-armed. A KEEPALIVE lease three times that (its
/// renewal interval is a third of the lease) used to keep the server in its
/// timer loop, answering nobody. The lease and BLOCK timers are exercised
/// too: a waiter parked for as long behind a lock of the same lease.
#[test]
fn a_lease_of_any_length_leaves_the_timers_idle() {
    let s = Server::start();
    let wraps = u64::MAX / 1000;
    let mut holder = s.client();
    // A wedged server answers nothing: fail, don't hang.
    holder
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    for (i, lease) in [3 * wraps, 3 * wraps - 3_000, 3 * (wraps + 1)]
        .into_iter()
        .enumerate()
    {
        let key = format!("ka{i}");
        let lease = lease.to_string();
        int(
            &mut holder,
            &["RLOCK.ACQUIRE", &key, "o", "PX", &lease, "KEEPALIVE"],
        );
    }
    let lease = wraps.to_string();
    int(&mut holder, &["RLOCK.ACQUIRE", "held", "o", "PX", &lease]);
    let mut waiter = s.client();
    let parked = std::thread::spawn(move || {
        call(
            &mut waiter,
            &["RLOCK.ACQUIRE", "held", "w", "BLOCK", &lease],
        )
    });

    let mut c = s.client();
    c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    wait_parked(&mut c, 1);
    let spent = cpu_seconds_over_a_second(&mut c);
    // An idle server spends milliseconds a second; one re-arming a timer in
    // the past spends the whole second.
    assert!(
        spent < 0.5,
        "the server spent {spent:.3} s of CPU in 1 s idle"
    );
    assert_eq!(stat(&mut c, "keepalive_holds"), 3);
    assert!(keepalive_of(&mut c, "ka0").is_some());

    assert_eq!(int(&mut c, &["RLOCK.FORCERELEASE", "held"]), 1);
    assert!(matches!(parked.join().unwrap(), Ok(Value::Int(_))));
}

/// Redis 7.0 reschedules its one event-loop timer for module timers at `now +
/// ms * 1000` computed in a C `int`: a module timer more than 2,147,483 ms
/// (35.8 minutes) ahead, once another one has fired, overflowed it into the
/// past, and the event loop spun at full CPU until the far timer came within
/// range (24 minutes for a timer an hour ahead). Here a BLOCK timer fires
/// while the lease timer of a day-long lease is armed and a KEEPALIVE renewal
/// is 40 minutes ahead.
#[test]
fn timers_far_ahead_leave_the_server_idle() {
    let s = Server::start();
    let mut holder = s.client();
    int(
        &mut holder,
        &["RLOCK.ACQUIRE", "day", "o", "PX", "86400000"],
    );
    int(
        &mut holder,
        &["RLOCK.ACQUIRE", "kept", "o", "PX", "7200000", "KEEPALIVE"],
    );
    // "day" gets a waiter, so the lease timer is armed for the lease's end;
    // the waiter's BLOCK timer fires after 200 ms.
    let mut c = s.client();
    assert!(is_nil(
        &mut c,
        &["RLOCK.ACQUIRE", "day", "w", "BLOCK", "200"]
    ));
    let spent = cpu_seconds_over_a_second(&mut c);
    assert!(
        spent < 0.5,
        "the server spent {spent:.3} s of CPU in 1 s idle"
    );
    assert_eq!(stat(&mut c, "lease_schedule"), 1);
    assert_eq!(stat(&mut c, "keepalive_holds"), 1);
}

/// The server's CPU time (user and system, all threads) over one second.
fn cpu_seconds_over_a_second(c: &mut Connection) -> f64 {
    let mut cpu = || -> f64 {
        let info: String = cmd("INFO").arg("cpu").query(c).unwrap();
        info.lines()
            .filter_map(|l| l.split_once(':'))
            .filter(|(k, _)| ["used_cpu_sys", "used_cpu_user"].contains(k))
            .map(|(_, v)| v.trim().parse::<f64>().unwrap())
            .sum()
    };
    let before = cpu();
    sleep(Duration::from_secs(1));
    cpu() - before
}
