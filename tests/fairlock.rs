//! FAIRLOCK: strict arrival-order hand-off, no barging, departures, reentrancy,
//! a long queue, replication/persistence of the held state, and argument errors.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// How long a waiter's reply may take once the server should have sent it.
const AT_ONCE: Duration = Duration::from_millis(500);

fn command(args: &[&str]) -> redis::Cmd {
    let mut c = cmd(args[0]);
    for a in &args[1..] {
        c.arg(*a);
    }
    c
}

/// A client whose `FAIRLOCK.ACQUIRE ... BLOCK` was sent, its reply not yet read.
struct Waiter {
    owner: String,
    /// CLIENT ID of its connection.
    id: i64,
    conn: Connection,
}

impl Waiter {
    /// Sends `FAIRLOCK.ACQUIRE key owner <extra>` on a new connection and waits until
    /// the server has parked it, so waiters enqueued one after another have a known order.
    fn park(
        server: &Server,
        ctl: &mut Connection,
        key: &str,
        owner: &str,
        extra: &[&str],
    ) -> Waiter {
        let before = stat(ctl, "waiters");
        let w = Waiter::send(server, key, owner, extra);
        wait_parked(ctl, before + 1);
        w.conn
            .set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        w
    }

    fn send(server: &Server, key: &str, owner: &str, extra: &[&str]) -> Waiter {
        let mut conn = server.client();
        let id = client_id(&mut conn);
        let mut args = vec!["FAIRLOCK.ACQUIRE", key, owner];
        args.extend_from_slice(extra);
        conn.send_packed_command(&command(&args).get_packed_command())
            .unwrap();
        Waiter {
            owner: owner.to_string(),
            id,
            conn,
        }
    }

    /// Reads the reply of the blocked ACQUIRE.
    fn reply(&mut self) -> Value {
        self.conn
            .recv_response()
            .unwrap_or_else(|e| panic!("waiter {}: no reply: {e}", self.owner))
    }

    /// Reads the reply, which must be a token, and how long it took to come.
    fn token(&mut self) -> (i64, Duration) {
        let start = Instant::now();
        match self.reply() {
            Value::Int(t) => (t, start.elapsed()),
            other => panic!("waiter {}: expected a token, got {other:?}", self.owner),
        }
    }
}

fn info(c: &mut Connection, key: &str) -> Vec<(String, Value)> {
    info_map(c, &["FAIRLOCK.INFO", key]).unwrap_or_else(|| panic!("FAIRLOCK.INFO {key}: no lock"))
}

fn queue_of(info: &[(String, Value)]) -> Vec<String> {
    match field(info, "queue") {
        Value::Array(items) => items.iter().map(as_string).collect(),
        other => panic!("queue is not an array: {other:?}"),
    }
}

/// (owner, holds, token, queue) of a held fair lock.
fn holder(c: &mut Connection, key: &str) -> (String, i64, i64, Vec<String>) {
    let i = info(c, key);
    assert_eq!(as_string(&field(&i, "kind")), "fairlock");
    let queue = queue_of(&i);
    assert_eq!(
        as_int(&field(&i, "waiters")),
        queue.len() as i64,
        "waiters vs queue in {i:?}"
    );
    (
        as_string(&field(&i, "owner")),
        as_int(&field(&i, "holds")),
        as_int(&field(&i, "token")),
        queue,
    )
}

fn owners(waiters: &[Waiter]) -> Vec<String> {
    waiters.iter().map(|w| w.owner.clone()).collect()
}

#[test]
fn waiters_are_granted_in_arrival_order_through_releases() {
    let server = Server::start();
    let mut c = server.client();
    let first = int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "holder"]);
    let mut waiters: Vec<Waiter> = (0..5)
        .map(|i| Waiter::park(&server, &mut c, "k", &format!("w{i}"), &["BLOCK", "0"]))
        .collect();
    let (owner, _, _, queue) = holder(&mut c, "k");
    assert_eq!(owner, "holder");
    assert_eq!(queue, owners(&waiters));

    let mut previous = ("holder".to_string(), first);
    for i in 0..waiters.len() {
        assert_eq!(int(&mut c, &["FAIRLOCK.RELEASE", "k", &previous.0]), 0);
        let (token, took) = waiters[i].token();
        assert!(took < AT_ONCE, "w{i} served after {took:?}");
        assert!(
            token > previous.1,
            "w{i} token {token} not above {}",
            previous.1
        );
        let (owner, holds, info_token, queue) = holder(&mut c, "k");
        assert_eq!(
            (owner.as_str(), holds, info_token),
            (waiters[i].owner.as_str(), 1, token)
        );
        assert_eq!(queue, owners(&waiters[i + 1..]), "after grant to w{i}");
        assert_eq!(stat(&mut c, "waiters"), (waiters.len() - i - 1) as i64);
        previous = (waiters[i].owner.clone(), token);
    }
    assert_eq!(int(&mut c, &["FAIRLOCK.RELEASE", "k", "w4"]), 0);
    assert!(info_map(&mut c, &["FAIRLOCK.INFO", "k"]).is_none());
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
}

#[test]
fn waiters_are_granted_in_arrival_order_through_lease_expiries() {
    let server = Server::start();
    let mut c = server.client();
    let start = Instant::now();
    let first = int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "holder", "PX", "200"]);
    // Each waiter, once granted, holds for 300 ms and never releases.
    let mut waiters: Vec<Waiter> = (0..5)
        .map(|i| {
            Waiter::park(
                &server,
                &mut c,
                "k",
                &format!("w{i}"),
                &["PX", "300", "BLOCK", "0"],
            )
        })
        .collect();
    assert_eq!(queue_of(&info(&mut c, "k")), owners(&waiters));

    let mut tokens = vec![first];
    let mut granted_at = vec![];
    for w in waiters.iter_mut() {
        let (token, _) = w.token();
        granted_at.push(start.elapsed());
        tokens.push(token);
    }
    // Tokens are issued in grant order: strictly increasing means arrival order.
    assert!(
        tokens.windows(2).all(|p| p[0] < p[1]),
        "tokens out of order: {tokens:?}"
    );
    // The first grant waits for the holder's 200 ms lease, each next one for a 300 ms lease:
    // leases are honoured, and each expiry serves the next waiter at once (no polling lag).
    assert!(
        granted_at[0] >= Duration::from_millis(150)
            && granted_at[0] < Duration::from_millis(200) + AT_ONCE,
        "w0 granted at {:?}",
        granted_at[0]
    );
    for i in 1..granted_at.len() {
        let gap = granted_at[i] - granted_at[i - 1];
        assert!(
            gap >= Duration::from_millis(200) && gap < Duration::from_millis(300) + AT_ONCE,
            "w{i} granted {gap:?} after w{}",
            i - 1
        );
    }
    assert!(stat(&mut c, "lease_expirations") >= 5);
    assert_eq!(stat(&mut c, "waiters"), 0);
    // The last waiter's lease runs out too; then the key is gone.
    wait_until(Duration::from_secs(2), || {
        int(&mut c, &["EXISTS", "k"]) == 0
    });
}

#[test]
fn force_release_hands_the_lock_to_the_head_of_the_queue() {
    let server = Server::start();
    let mut c = server.client();
    let first = int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "holder"]);
    let mut a = Waiter::park(&server, &mut c, "k", "a", &["BLOCK", "0"]);
    let _b = Waiter::park(&server, &mut c, "k", "b", &["BLOCK", "0"]);
    assert_eq!(int(&mut c, &["FAIRLOCK.FORCERELEASE", "k"]), 1);
    let (token, took) = a.token();
    assert!(took < AT_ONCE && token > first);
    let (owner, holds, info_token, queue) = holder(&mut c, "k");
    assert_eq!(
        (owner.as_str(), holds, info_token, queue),
        ("a", 1, token, vec!["b".to_string()])
    );
    assert_eq!(stat(&mut c, "waiters"), 1);
}

#[test]
fn departed_waiters_leave_the_queue_and_the_rest_keep_their_order() {
    let server = Server::start();
    let mut c = server.client();
    let mut last = int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "holder"]);
    let mut a = Waiter::park(&server, &mut c, "k", "a", &["BLOCK", "0"]);
    let dropped = Waiter::park(&server, &mut c, "k", "dropped", &["BLOCK", "0"]);
    let timeout_start = Instant::now();
    let mut timing_out = Waiter::park(&server, &mut c, "k", "timing-out", &["BLOCK", "1000"]);
    let mut killed = Waiter::park(&server, &mut c, "k", "killed", &["BLOCK", "0"]);
    let mut e = Waiter::park(&server, &mut c, "k", "e", &["BLOCK", "0"]);
    let mut f = Waiter::park(&server, &mut c, "k", "f", &["BLOCK", "0"]);
    let all = ["a", "dropped", "timing-out", "killed", "e", "f"];
    assert_eq!(queue_of(&info(&mut c, "k")), all);

    // A waiter whose connection closes leaves the queue at once.
    drop(dropped);
    wait_parked(&mut c, 5);
    assert_eq!(
        queue_of(&info(&mut c, "k")),
        ["a", "timing-out", "killed", "e", "f"]
    );

    // So does one killed by another connection.
    assert_eq!(
        int(&mut c, &["CLIENT", "KILL", "ID", &killed.id.to_string()]),
        1
    );
    wait_parked(&mut c, 4);
    assert!(
        killed.conn.recv_response().is_err(),
        "a killed client gets no reply"
    );
    assert_eq!(queue_of(&info(&mut c, "k")), ["a", "timing-out", "e", "f"]);

    // A waiter whose BLOCK runs out gets nil and leaves the queue.
    assert_eq!(timing_out.reply(), Value::Nil);
    let waited = timeout_start.elapsed();
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_millis(1000) + AT_ONCE,
        "BLOCK 1000 timed out after {waited:?}"
    );
    assert_eq!(stat(&mut c, "waiters"), 3);
    assert_eq!(stat(&mut c, "wait_timeouts"), 1);
    assert_eq!(queue_of(&info(&mut c, "k")), ["a", "e", "f"]);

    // The remaining waiters are served in order, each release going straight to the next
    // live waiter: nobody is granted to (or waits for) the departed.
    let mut previous = "holder".to_string();
    for (w, rest) in [
        (&mut a, vec!["e", "f"]),
        (&mut e, vec!["f"]),
        (&mut f, vec![]),
    ] {
        assert_eq!(int(&mut c, &["FAIRLOCK.RELEASE", "k", &previous]), 0);
        let (token, took) = w.token();
        assert!(took < AT_ONCE, "{} served after {took:?}", w.owner);
        assert!(token > last);
        let (owner, _, info_token, queue) = holder(&mut c, "k");
        assert_eq!((owner.as_str(), info_token), (w.owner.as_str(), token));
        assert_eq!(queue, rest);
        previous = w.owner.clone();
        last = token;
    }
    assert_eq!(stat(&mut c, "waiters"), 0);
    // None of the departed ever got the lock.
    for gone in ["dropped", "timing-out", "killed"] {
        assert!(
            is_nil(&mut c, &["FAIRLOCK.ACQUIRE", "k", gone]),
            "{gone} must not hold"
        );
        assert_eq!(
            error(&mut c, &["FAIRLOCK.RELEASE", "k", gone])
                .split(' ')
                .next(),
            Some("NOTOWNER")
        );
    }
}

#[test]
fn client_unblock_removes_a_waiter_from_the_queue() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "holder"]);
    let mut a = Waiter::park(&server, &mut c, "k", "a", &["BLOCK", "0"]);
    let mut b = Waiter::park(&server, &mut c, "k", "b", &["BLOCK", "0"]);
    let mut d = Waiter::park(&server, &mut c, "k", "d", &["BLOCK", "0"]);

    // The head is unblocked: it gets nil and leaves.
    assert_eq!(int(&mut c, &["CLIENT", "UNBLOCK", &a.id.to_string()]), 1);
    assert_eq!(a.reply(), Value::Nil);
    wait_parked(&mut c, 2);
    assert_eq!(queue_of(&info(&mut c, "k")), ["b", "d"]);

    // CLIENT UNBLOCK ... ERROR: the waiter gets an error and leaves.
    assert_eq!(
        int(&mut c, &["CLIENT", "UNBLOCK", &b.id.to_string(), "ERROR"]),
        1
    );
    match b.reply() {
        Value::ServerError(e) => assert_eq!(e.code(), "UNBLOCKED", "{e:?}"),
        other => panic!("expected an UNBLOCKED error, got {other:?}"),
    }
    wait_parked(&mut c, 1);
    assert_eq!(queue_of(&info(&mut c, "k")), ["d"]);

    // The next release skips both.
    assert_eq!(int(&mut c, &["FAIRLOCK.RELEASE", "k", "holder"]), 0);
    let (token, took) = d.token();
    assert!(took < AT_ONCE);
    assert_eq!(holder(&mut c, "k"), ("d".to_string(), 1, token, vec![]));
    for gone in ["a", "b"] {
        assert!(is_nil(&mut c, &["FAIRLOCK.ACQUIRE", "k", gone]));
    }
}

#[test]
fn a_newcomer_never_overtakes_the_queue() {
    let server = Server::start();
    let mut c = server.client();
    int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "holder"]);
    let mut w = Waiter::park(&server, &mut c, "k", "waiter", &["BLOCK", "0"]);
    // Busy and queued: a plain try fails.
    assert!(is_nil(&mut c, &["FAIRLOCK.ACQUIRE", "k", "newcomer"]));

    // The holder releases and a newcomer tries in the very same transaction: the lock
    // has already gone to the waiter, and BLOCK inside MULTI is one immediate try.
    let _: () = cmd("MULTI").query(&mut c).unwrap();
    for args in [
        &["FAIRLOCK.RELEASE", "k", "holder"][..],
        &["FAIRLOCK.ACQUIRE", "k", "newcomer"],
        &["FAIRLOCK.ACQUIRE", "k", "newcomer", "BLOCK", "0"],
    ] {
        assert_eq!(
            call(&mut c, args).unwrap(),
            Value::SimpleString("QUEUED".into())
        );
    }
    let exec = call(&mut c, &["EXEC"]).unwrap();
    assert_eq!(
        exec,
        Value::Array(vec![Value::Int(0), Value::Nil, Value::Nil])
    );
    let (token, took) = w.token();
    assert!(took < AT_ONCE);
    let (owner, holds, info_token, queue) = holder(&mut c, "k");
    assert_eq!((owner.as_str(), holds, info_token), ("waiter", 1, token));
    assert!(queue.is_empty());

    // The same inside a script.
    let mut w2 = Waiter::park(&server, &mut c, "k", "waiter2", &["BLOCK", "0"]);
    let script = "redis.call('FAIRLOCK.RELEASE', KEYS[1], ARGV[1]) \
                  return {redis.call('FAIRLOCK.ACQUIRE', KEYS[1], ARGV[2]), \
                          redis.call('FAIRLOCK.ACQUIRE', KEYS[1], ARGV[2], 'BLOCK', '0')}";
    let reply = call(&mut c, &["EVAL", script, "1", "k", "waiter", "newcomer"]).unwrap();
    // Lua turns nil replies into false, which comes back as nil.
    assert_eq!(reply, Value::Array(vec![Value::Nil, Value::Nil]));
    let (token2, took) = w2.token();
    assert!(took < AT_ONCE && token2 > token);
    assert_eq!(holder(&mut c, "k").0, "waiter2");
    assert_eq!(stat(&mut c, "waiters"), 0);
}

#[test]
fn the_holder_reenters_while_others_wait() {
    let server = Server::start();
    let mut c = server.client();
    let token = int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "holder"]);
    let mut a = Waiter::park(&server, &mut c, "k", "a", &["BLOCK", "0"]);
    let _b = Waiter::park(&server, &mut c, "k", "b", &["BLOCK", "0"]);

    assert_eq!(int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "holder"]), token);
    assert_eq!(
        holder(&mut c, "k"),
        ("holder".to_string(), 2, token, vec!["a".into(), "b".into()])
    );
    // Also with BLOCK, and from another connection: ownership is by owner string.
    let mut other = server.client();
    assert_eq!(
        int(
            &mut other,
            &[
                "FAIRLOCK.ACQUIRE",
                "k",
                "holder",
                "PX",
                "5000",
                "BLOCK",
                "0"
            ]
        ),
        token
    );
    let i = info(&mut c, "k");
    assert_eq!(as_int(&field(&i, "holds")), 3);
    assert!(as_int(&field(&i, "ttl")) <= 5000, "{i:?}");
    // A queued owner is not a holder: its own plain try fails.
    assert!(is_nil(&mut c, &["FAIRLOCK.ACQUIRE", "k", "a"]));

    // Only the last release hands the lock over.
    assert_eq!(int(&mut c, &["FAIRLOCK.RELEASE", "k", "holder"]), 2);
    assert_eq!(int(&mut c, &["FAIRLOCK.RELEASE", "k", "holder"]), 1);
    assert_eq!(stat(&mut c, "waiters"), 2);
    assert_eq!(holder(&mut c, "k").0, "holder");
    assert_eq!(int(&mut c, &["FAIRLOCK.RELEASE", "k", "holder"]), 0);
    let (a_token, took) = a.token();
    assert!(took < AT_ONCE && a_token > token);
    assert_eq!(
        holder(&mut c, "k"),
        ("a".to_string(), 1, a_token, vec!["b".into()])
    );
}

#[test]
fn a_thousand_waiters_are_all_served_in_order() {
    const N: usize = 1000;
    let server = Server::start();
    let mut c = server.client();
    let started = Instant::now();
    let mut last = int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "holder", "PX", "60000"]);
    let mut waiters: Vec<Waiter> = Vec::with_capacity(N);
    for i in 0..N {
        let w = Waiter::send(&server, "k", &format!("w{i:04}"), &["BLOCK", "0"]);
        w.conn
            .set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        waiters.push(w);
        wait_parked(&mut c, i as i64 + 1);
    }
    let (owner, _, _, queue) = holder(&mut c, "k");
    assert_eq!(owner, "holder");
    assert_eq!(queue, owners(&waiters));

    let mut previous = "holder".to_string();
    for i in 0..N {
        assert_eq!(
            int(&mut c, &["FAIRLOCK.RELEASE", "k", &previous]),
            0,
            "release by {previous}"
        );
        let (token, _) = waiters[i].token();
        assert!(
            token > last,
            "{}: token {token} not above {last}",
            waiters[i].owner
        );
        last = token;
        previous = waiters[i].owner.clone();
        if i % 100 == 0 || i == N - 1 {
            let (owner, holds, info_token, queue) = holder(&mut c, "k");
            assert_eq!(
                (owner.as_str(), holds, info_token),
                (previous.as_str(), 1, token)
            );
            assert_eq!(queue, owners(&waiters[i + 1..]));
            assert_eq!(stat(&mut c, "waiters"), (N - i - 1) as i64);
        }
    }
    assert_eq!(int(&mut c, &["FAIRLOCK.RELEASE", "k", &previous]), 0);
    assert!(info_map(&mut c, &["FAIRLOCK.INFO", "k"]).is_none());
    assert!(stat(&mut c, "contended_grants") >= N as i64);
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
}

#[test]
fn the_held_state_replicates_and_survives_reload() {
    let master = Server::start();
    let replica = Server::start();
    let mut m = master.client();
    let mut r = replica.client();
    // One lock taken before the replica syncs (full sync), one after (command stream).
    let before = int(
        &mut m,
        &["FAIRLOCK.ACQUIRE", "early", "owner-1", "PX", "60000"],
    );
    replica.replicate_from(&master);
    let token = int(&mut m, &["FAIRLOCK.ACQUIRE", "k", "owner-2", "PX", "60000"]);
    assert_eq!(
        int(&mut m, &["FAIRLOCK.ACQUIRE", "k", "owner-2", "PX", "60000"]),
        token
    );
    let mut queued = Waiter::park(
        &master,
        &mut m,
        "k",
        "queued",
        &["PX", "60000", "BLOCK", "0"],
    );

    let expected = ("owner-2".to_string(), 2, token, vec!["queued".to_string()]);
    assert_eq!(holder(&mut m, "k"), expected);
    wait_until(Duration::from_secs(5), || {
        info_map(&mut r, &["FAIRLOCK.INFO", "k"]).is_some_and(|i| as_int(&field(&i, "holds")) == 2)
    });
    // The replica has the held state; the queue is made of the master's connections.
    assert_eq!(
        holder(&mut r, "k"),
        ("owner-2".to_string(), 2, token, vec![])
    );
    assert_eq!(
        holder(&mut r, "early"),
        ("owner-1".to_string(), 1, before, vec![])
    );
    for key in ["k", "early"] {
        let (pm, pr) = (int(&mut m, &["PTTL", key]), int(&mut r, &["PTTL", key]));
        assert!(
            pm > 50_000 && (pm - pr).abs() < 1000,
            "{key}: PTTL master {pm}, replica {pr}"
        );
    }

    // DEBUG RELOAD gives back the same held state.
    let _: () = cmd("DEBUG").arg("RELOAD").query(&mut m).unwrap();
    assert_eq!(holder(&mut m, "k"), expected);
    assert_eq!(
        holder(&mut m, "early"),
        ("owner-1".to_string(), 1, before, vec![])
    );
    assert!(int(&mut m, &["PTTL", "k"]) > 50_000);

    // A hand-off on the master reaches the replica with the new owner and token.
    assert_eq!(int(&mut m, &["FAIRLOCK.RELEASE", "k", "owner-2"]), 1);
    assert_eq!(int(&mut m, &["FAIRLOCK.RELEASE", "k", "owner-2"]), 0);
    let (queued_token, took) = queued.token();
    assert!(took < AT_ONCE && queued_token > token);
    wait_until(Duration::from_secs(5), || {
        info_map(&mut r, &["FAIRLOCK.INFO", "k"])
            .is_some_and(|i| as_string(&field(&i, "owner")) == "queued")
    });
    assert_eq!(
        holder(&mut r, "k"),
        ("queued".to_string(), 1, queued_token, vec![])
    );
    // FAIRLOCK.INFO is read-only and allowed on the replica; acquiring there is not.
    assert!(error(&mut r, &["FAIRLOCK.ACQUIRE", "other", "x"]).starts_with("READONLY"));
}

#[test]
fn the_held_state_survives_a_restart() {
    let mut server = Server::start();
    let mut c = server.client();
    let token = int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "owner", "PX", "60000"]);
    int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "owner", "PX", "60000"]);
    let _: () = cmd("SAVE").query(&mut c).unwrap();
    server.restart();
    let mut c = server.client();
    assert_eq!(holder(&mut c, "k"), ("owner".to_string(), 2, token, vec![]));
    // Tokens keep growing across the restart.
    assert_eq!(int(&mut c, &["FAIRLOCK.RELEASE", "k", "owner"]), 1);
    assert_eq!(int(&mut c, &["FAIRLOCK.RELEASE", "k", "owner"]), 0);
    assert!(int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "next"]) > token);
}

#[test]
fn info_is_a_map_over_resp3() {
    let server = Server::start();
    let mut c = server.client_resp3();
    let token = int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "holder", "PX", "10000"]);
    let _a = Waiter::park(&server, &mut c, "k", "a", &["BLOCK", "0"]);
    assert!(matches!(
        call(&mut c, &["FAIRLOCK.INFO", "k"]).unwrap(),
        Value::Map(_)
    ));
    let i = info(&mut c, "k");
    assert_eq!(as_string(&field(&i, "kind")), "fairlock");
    assert_eq!(as_string(&field(&i, "owner")), "holder");
    assert_eq!(as_int(&field(&i, "holds")), 1);
    assert_eq!(as_int(&field(&i, "token")), token);
    let ttl = as_int(&field(&i, "ttl"));
    assert!(ttl > 5000 && ttl <= 10000, "ttl {ttl}");
    assert_eq!(as_int(&field(&i, "waiters")), 1);
    assert_eq!(queue_of(&i), ["a"]);
    assert_eq!(
        call(&mut c, &["FAIRLOCK.INFO", "missing"]).unwrap(),
        Value::Nil
    );
}

#[test]
fn argument_errors_and_wrong_types() {
    let server = Server::start();
    let mut c = server.client();
    let arity = |c: &mut Connection, args: &[&str]| {
        let e = error(c, args);
        assert!(
            e.starts_with("ERR wrong number of arguments"),
            "{args:?}: {e}"
        );
    };
    arity(&mut c, &["FAIRLOCK.ACQUIRE", "k"]);
    arity(&mut c, &["FAIRLOCK.RELEASE", "k"]);
    arity(&mut c, &["FAIRLOCK.RELEASE", "k", "o", "extra"]);
    arity(&mut c, &["FAIRLOCK.RENEW", "k"]);
    arity(&mut c, &["FAIRLOCK.FORCERELEASE"]);
    arity(&mut c, &["FAIRLOCK.FORCERELEASE", "k", "extra"]);
    arity(&mut c, &["FAIRLOCK.INFO"]);
    arity(&mut c, &["FAIRLOCK.INFO", "k", "COUNT", "1", "extra"]);
    assert_eq!(
        error(&mut c, &["FAIRLOCK.INFO", "k", "extra"]),
        "ERR syntax error"
    );

    for args in [
        &["FAIRLOCK.ACQUIRE", "k", "o", "PX"][..],
        &["FAIRLOCK.ACQUIRE", "k", "o", "PX", "100", "EX", "1"],
        &["FAIRLOCK.ACQUIRE", "k", "o", "BLOCK", "10", "block", "10"],
        &["FAIRLOCK.ACQUIRE", "k", "o", "NX", "1"],
        &["FAIRLOCK.RENEW", "k", "o", "BLOCK", "10"],
    ] {
        assert_eq!(error(&mut c, args), "ERR syntax error", "{args:?}");
    }
    for args in [
        &["FAIRLOCK.ACQUIRE", "k", "o", "PX", "0"][..],
        &["FAIRLOCK.ACQUIRE", "k", "o", "EX", "abc"],
        &["FAIRLOCK.ACQUIRE", "k", "o", "BLOCK", "-1"],
        &["FAIRLOCK.RENEW", "k", "o", "PX", "-5"],
    ] {
        let e = error(&mut c, args);
        assert!(
            e.starts_with("ERR") && e.contains("not an integer or out of range"),
            "{args:?}: {e}"
        );
    }
    for args in [
        &["FAIRLOCK.ACQUIRE", "k", ""][..],
        &["FAIRLOCK.ACQUIRE", "k", "", "BLOCK", "0"],
        &["FAIRLOCK.RELEASE", "k", ""],
        &["FAIRLOCK.RENEW", "k", ""],
    ] {
        assert!(error(&mut c, args).starts_with("ERR"), "{args:?}");
    }
    // None of that created anything.
    assert_eq!(int(&mut c, &["EXISTS", "k"]), 0);
    assert_eq!(stat(&mut c, "waiters"), 0);

    // NOTOWNER: on a missing key, and for somebody other than the holder.
    assert!(error(&mut c, &["FAIRLOCK.RELEASE", "k", "o"]).starts_with("NOTOWNER"));
    assert!(error(&mut c, &["FAIRLOCK.RENEW", "k", "o"]).starts_with("NOTOWNER"));
    let token = int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "o"]);
    assert!(error(&mut c, &["FAIRLOCK.RELEASE", "k", "other"]).starts_with("NOTOWNER"));
    assert!(error(&mut c, &["FAIRLOCK.RENEW", "k", "other"]).starts_with("NOTOWNER"));
    // An error changes nothing.
    assert!(error(&mut c, &["FAIRLOCK.ACQUIRE", "k", "o", "PX", "0"]).starts_with("ERR"));
    assert_eq!(holder(&mut c, "k"), ("o".to_string(), 1, token, vec![]));

    // WRONGTYPE: a string key, an RLOCK key, an RWLOCK key; and other families on a FAIRLOCK key.
    let _: () = cmd("SET").arg("str").arg("v").query(&mut c).unwrap();
    int(&mut c, &["RLOCK.ACQUIRE", "r", "o"]);
    int(&mut c, &["RWLOCK.ACQUIRE", "rw", "READ", "o"]);
    for key in ["str", "r", "rw"] {
        for args in [
            &["FAIRLOCK.ACQUIRE", key, "o"][..],
            &["FAIRLOCK.ACQUIRE", key, "x", "BLOCK", "0"],
            &["FAIRLOCK.RELEASE", key, "o"],
            &["FAIRLOCK.RENEW", key, "o"],
            &["FAIRLOCK.FORCERELEASE", key],
            &["FAIRLOCK.INFO", key],
        ] {
            assert!(error(&mut c, args).starts_with("WRONGTYPE"), "{args:?}");
        }
    }
    assert!(error(&mut c, &["RLOCK.INFO", "k"]).starts_with("WRONGTYPE"));
    assert!(error(&mut c, &["RLOCK.ACQUIRE", "k", "o"]).starts_with("WRONGTYPE"));
    assert!(error(&mut c, &["RWLOCK.ACQUIRE", "k", "WRITE", "o"]).starts_with("WRONGTYPE"));
    // Nothing changed, nobody was parked.
    assert_eq!(stat(&mut c, "waiters"), 0);
    let v: String = cmd("GET").arg("str").query(&mut c).unwrap();
    assert_eq!(v, "v");
    let r = info_map(&mut c, &["RLOCK.INFO", "r"]).unwrap();
    assert_eq!(
        (as_string(&field(&r, "owner")), as_int(&field(&r, "holds"))),
        ("o".to_string(), 1)
    );
    assert_eq!(holder(&mut c, "k"), ("o".to_string(), 1, token, vec![]));
}
