//! SPEC "Failover and split brain", one defect at a time, with real servers:
//! no grant after a BLOCK deadline (server frozen meanwhile); `WAIT` (and
//! `WAITAOF`) on the granted connection covers every kind of grant; hand-overs obey
//! min-replicas-to-write; tokens are ordered by failover.

mod common;

use std::thread::{sleep, JoinHandle};
use std::time::{Duration, Instant};

use common::*;

/// How a client asks that its writes reached a replica: the number of
/// replicas that acknowledged them within `ms`.
type Ack = fn(&mut Connection, u64) -> i64;

/// A waiter on its own connection: `ACQUIRE ... BLOCK`, then (if granted)
/// `WAIT 1 <wait_ms>` on the same connection. Returns the ACQUIRE reply, the
/// WAIT result and the connection (for a later WAIT).
fn waiter(
    server: &Server,
    args: &[&str],
    wait_ms: u64,
) -> JoinHandle<(Value, Option<i64>, Connection)> {
    waiter_acking(server, args, wait_ms, wait_acked)
}

/// `waiter`, asking with `ack` instead of `WAIT`.
fn waiter_acking(
    server: &Server,
    args: &[&str],
    wait_ms: u64,
    ack: Ack,
) -> JoinHandle<(Value, Option<i64>, Connection)> {
    let mut c = server.client();
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    std::thread::spawn(move || {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let reply = call(&mut c, &refs).unwrap();
        let waited = match reply {
            Value::Int(_) => Some(ack(&mut c, wait_ms)),
            _ => None,
        };
        (reply, waited, c)
    })
}

fn wait_acked(c: &mut Connection, ms: u64) -> i64 {
    cmd("WAIT").arg(1).arg(ms).query(c).unwrap()
}

/// `WAITAOF 0 1 <ms>`: replicas that wrote the connection's writes to their AOF.
fn waitaof_acked(c: &mut Connection, ms: u64) -> i64 {
    let (_local, replicas): (i64, i64) = cmd("WAITAOF").arg(0).arg(1).arg(ms).query(c).unwrap();
    replicas
}

fn owner_of(c: &mut Connection, info_cmd: &str, key: &str) -> Option<String> {
    info_map(c, &[info_cmd, key]).map(|i| as_string(&field(&i, "owner")))
}

// ---------------------------------------------------------------------------
// 1. No late grants

#[test]
fn no_grant_after_the_block_deadline_when_a_frozen_server_catches_up() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "k", "holder", "PX", "300"]);
    let w = spawn_call(&s, &["RLOCK.ACQUIRE", "k", "late", "BLOCK", "500"]);
    wait_parked(&mut c, 1);
    // The server sleeps through the lease end (~300 ms) and the BLOCK
    // deadline (~500 ms); when it wakes, the lease timer is due first.
    let _: () = cmd("DEBUG").arg("SLEEP").arg("1").query(&mut c).unwrap();
    let (reply, _) = w.join().unwrap();
    assert_eq!(
        reply.unwrap(),
        Value::Nil,
        "granted after its BLOCK deadline"
    );
    assert_eq!(owner_of(&mut c, "RLOCK.INFO", "k"), None);
    assert_eq!(stat(&mut c, "wait_timeouts"), 1);
    assert_eq!(stat(&mut c, "waiters"), 0);
}

#[test]
fn no_grant_after_the_block_deadline_from_a_release_queued_behind_a_freeze() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["FAIRLOCK.ACQUIRE", "k", "holder", "PX", "60000"]);
    let late = spawn_call(&s, &["FAIRLOCK.ACQUIRE", "k", "late", "BLOCK", "300"]);
    wait_parked(&mut c, 1);
    let patient = spawn_call(&s, &["FAIRLOCK.ACQUIRE", "k", "patient", "BLOCK", "20000"]);
    wait_parked(&mut c, 2);
    // The RELEASE runs right after the sleep, before Redis looks at timeouts:
    // the first waiter's BLOCK ran out meanwhile, the second's did not.
    let (_, released): ((), i64) = redis::pipe()
        .cmd("DEBUG")
        .arg("SLEEP")
        .arg("0.6")
        .cmd("FAIRLOCK.RELEASE")
        .arg("k")
        .arg("holder")
        .query(&mut c)
        .unwrap();
    assert_eq!(released, 0);
    assert_eq!(late.join().unwrap().0.unwrap(), Value::Nil);
    assert!(matches!(patient.join().unwrap().0.unwrap(), Value::Int(_)));
    assert_eq!(
        owner_of(&mut c, "FAIRLOCK.INFO", "k").as_deref(),
        Some("patient")
    );
}

#[test]
fn block_timeouts_stay_on_time() {
    // Timeouts are delivered by the module's own timer now: check they are
    // neither early nor late, and that CLIENT UNBLOCK still ends a wait.
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "k", "holder", "PX", "60000"]);
    let (reply, took) = spawn_call(&s, &["RLOCK.ACQUIRE", "k", "w", "BLOCK", "200"])
        .join()
        .unwrap();
    assert_eq!(reply.unwrap(), Value::Nil);
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_millis(400),
        "{took:?}"
    );
    let mut w = s.client();
    let id = client_id(&mut w);
    let h = std::thread::spawn(move || call(&mut w, &["RLOCK.ACQUIRE", "k", "w", "BLOCK", "0"]));
    wait_parked(&mut c, 1);
    assert_eq!(int(&mut c, &["CLIENT", "UNBLOCK", &id.to_string()]), 1);
    assert_eq!(h.join().unwrap().unwrap(), Value::Nil);
    assert_eq!(stat(&mut c, "waiters"), 0);
    assert_eq!(stat(&mut c, "wait_timeouts"), 2);
}

// ---------------------------------------------------------------------------
// 2. WAIT covers every grant

/// Master, replica, and a connection on the master whose writes the replica
/// has acknowledged.
fn pair() -> (Server, Server, Connection) {
    pair_with(&[])
}

/// `pair`, the replica started with `replica_args`.
fn pair_with(replica_args: &[&str]) -> (Server, Server, Connection) {
    let master = Server::start();
    let replica = Server::start_with(replica_args, &[]);
    replica.replicate_from(&master);
    let mut c = master.client();
    // The replica's link can be up before the master counts it online (and
    // only online replicas acknowledge for WAIT): wait for the master's view too.
    wait_until(Duration::from_secs(10), || {
        let info: String = cmd("INFO").arg("replication").query(&mut c).unwrap();
        info.contains("state=online")
    });
    (master, replica, c)
}

#[test]
fn wait_on_the_granted_connection_covers_every_kind_of_grant() {
    let (master, replica, m) = pair();
    every_kind_of_grant_is_covered_by(wait_acked, "WAIT 1", master, replica, m);
}

/// The same with `WAITAOF 0 1` (Redis 7.2 on, Valkey): the replica's AOF.
#[test]
fn waitaof_on_the_granted_connection_covers_every_kind_of_grant() {
    // `always`: a Redis 8.2.3 replica on `everysec` acknowledged no AOF offset
    // for seconds once its link went idle (by hand, without the module).
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let (master, replica, mut m) = pair_with(&aof);
    let known: Value = cmd("COMMAND")
        .arg("INFO")
        .arg("WAITAOF")
        .query(&mut m)
        .unwrap();
    if known == Value::Array(vec![Value::Nil]) {
        let version = server_info(&mut m, "redis_version").unwrap();
        assert!(version.starts_with("7.0."), "no WAITAOF on {version}");
        eprintln!("Redis {version} has no WAITAOF: nothing to check");
        return;
    }
    // The replica acknowledges AOF offsets once its rewrite after the sync is done.
    wait_until(Duration::from_secs(20), || {
        let _: () = cmd("SET").arg("sync").arg("0").query(&mut m).unwrap();
        waitaof_acked(&mut m, 200) == 1
    });
    every_kind_of_grant_is_covered_by(waitaof_acked, "WAITAOF 0 1", master, replica, m);
}

fn every_kind_of_grant_is_covered_by(
    ack: Ack,
    name: &str,
    master: Server,
    replica: Server,
    mut m: Connection,
) {
    // Holders and waiters in place while the replica is live.
    int(&mut m, &["RLOCK.ACQUIRE", "rel", "h", "PX", "60000"]);
    int(&mut m, &["RLOCK.ACQUIRE", "exp", "h", "PX", "2500"]);
    int(&mut m, &["RLOCK.ACQUIRE", "force", "h", "PX", "60000"]);
    int(&mut m, &["FAIRLOCK.ACQUIRE", "fair", "h", "PX", "60000"]);
    int(
        &mut m,
        &["RWLOCK.ACQUIRE", "rw", "WRITE", "h", "PX", "60000"],
    );
    assert_eq!(ack(&mut m, 2000), 1);
    let kinds = [
        (
            "release",
            &["RLOCK.ACQUIRE", "rel", "w", "BLOCK", "20000"][..],
        ),
        (
            "lease expiry",
            &["RLOCK.ACQUIRE", "exp", "w", "BLOCK", "20000"][..],
        ),
        (
            "forced release",
            &["RLOCK.ACQUIRE", "force", "w", "BLOCK", "20000"][..],
        ),
        (
            "fair lock",
            &["FAIRLOCK.ACQUIRE", "fair", "w", "BLOCK", "20000"][..],
        ),
        (
            "read-write lock",
            &["RWLOCK.ACQUIRE", "rw", "READ", "w", "BLOCK", "20000"][..],
        ),
    ];
    let waiters: Vec<_> = kinds
        .iter()
        .enumerate()
        .map(|(i, (_, args))| {
            let h = waiter_acking(&master, args, 200, ack);
            wait_parked(&mut m, i as i64 + 1);
            h
        })
        .collect();
    // The replica acknowledges every offset up to the waiters' own.
    let _: () = cmd("SET").arg("sync").arg("1").query(&mut m).unwrap();
    assert_eq!(ack(&mut m, 2000), 1);

    replica.freeze();
    let mut own = master.client();
    let t = int(&mut own, &["RLOCK.ACQUIRE", "own", "a"]);
    assert!(t > 0);
    let own_wait = ack(&mut own, 200);
    int(&mut m, &["RLOCK.RELEASE", "rel", "h"]);
    int(&mut m, &["RLOCK.FORCERELEASE", "force"]);
    int(&mut m, &["FAIRLOCK.RELEASE", "fair", "h"]);
    int(&mut m, &["RWLOCK.RELEASE", "rw", "WRITE", "h"]);
    // "exp" is handed over by the lease timer.
    let results: Vec<_> = waiters.into_iter().map(|h| h.join().unwrap()).collect();
    let mut report = vec![("own acquire", own_wait)];
    for ((kind, _), (reply, waited, _)) in kinds.iter().zip(&results) {
        assert!(matches!(reply, Value::Int(_)), "{kind}: {reply:?}");
        report.push((kind, waited.unwrap()));
    }
    eprintln!("{name} 200 while the replica is frozen: {report:?}");
    assert!(
        report.iter().all(|(_, w)| *w == 0),
        "{name} claimed a replica has a grant it never received: {report:?}"
    );

    replica.thaw();
    assert_eq!(ack(&mut own, 5000), 1);
    let mut after = vec![];
    for ((kind, _), (_, _, mut c)) in kinds.iter().zip(results) {
        after.push((kind, ack(&mut c, 5000)));
    }
    eprintln!("{name} 5000 after the replica resumed: {after:?}");
    assert!(after.iter().all(|(_, w)| *w == 1), "{after:?}");
}

#[test]
fn wait_covers_a_grant_made_in_the_turn_its_block_time_ran_out() {
    // The grant comes from a RELEASE within the waiter's BLOCK time, and the
    // same event-loop turn ends past that time (a slow command after it).
    // Redis used to time the already-granted client out itself then, which
    // skipped updating its replication offset: WAIT returned 1 at once.
    let (master, replica, mut m) = pair();
    int(&mut m, &["RLOCK.ACQUIRE", "k", "h", "PX", "60000"]);
    assert_eq!(wait_acked(&mut m, 2000), 1);
    let w = waiter(&master, &["RLOCK.ACQUIRE", "k", "w", "BLOCK", "400"], 200);
    wait_parked(&mut m, 1);
    // The replica acknowledges everything up to now (the waiter's own offset
    // included: WAIT's GETACK is counted after the write before it).
    let _: () = cmd("SET").arg("sync").arg("1").query(&mut m).unwrap();
    assert_eq!(wait_acked(&mut m, 2000), 1);
    replica.freeze();
    let (released, ()): (i64, ()) = redis::pipe()
        .cmd("RLOCK.RELEASE")
        .arg("k")
        .arg("h")
        .cmd("DEBUG")
        .arg("SLEEP")
        .arg("0.6")
        .query(&mut m)
        .unwrap();
    assert_eq!(released, 0);
    let (reply, waited, mut wc) = w.join().unwrap();
    assert!(matches!(reply, Value::Int(_)), "granted in time: {reply:?}");
    eprintln!("WAIT after a grant in the turn the BLOCK ran out: {waited:?}");
    assert_eq!(waited, Some(0), "WAIT lied: the replica is frozen");
    replica.thaw();
    assert_eq!(wait_acked(&mut wc, 5000), 1);
}

// ---------------------------------------------------------------------------
// 3. Hand-overs obey min-replicas-to-write

fn wait_good_replicas(m: &mut Connection, n: i64) {
    let line = format!("min_slaves_good_slaves:{n}");
    wait_until(Duration::from_secs(10), || {
        let info: String = cmd("INFO").arg("replication").query(m).unwrap();
        info.lines().any(|l| l.trim() == line)
    });
}

fn guarded_master() -> Server {
    guarded_master_with_lag("1")
}

/// A master with `min-replicas-to-write 1` and this `min-replicas-max-lag` (s).
fn guarded_master_with_lag(max_lag: &str) -> Server {
    Server::start_with(
        &[
            "--save",
            "",
            "--appendonly",
            "no",
            "--min-replicas-to-write",
            "1",
            "--min-replicas-max-lag",
            max_lag,
            "--repl-diskless-sync-delay",
            "0",
        ],
        &[],
    )
}

#[test]
fn lease_ending_without_good_replicas_grants_nobody_until_one_is_back() {
    let master = guarded_master();
    let mut replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.client();
    wait_good_replicas(&mut m, 1);
    int(&mut m, &["RLOCK.ACQUIRE", "k", "h", "PX", "400"]);
    int(&mut m, &["FAIRLOCK.ACQUIRE", "f", "h", "PX", "400"]);
    let w = waiter(
        &master,
        &["RLOCK.ACQUIRE", "k", "w", "BLOCK", "30000"],
        2000,
    );
    wait_parked(&mut m, 1);
    let fw = waiter(
        &master,
        &["FAIRLOCK.ACQUIRE", "f", "w", "BLOCK", "1200"],
        2000,
    );
    wait_parked(&mut m, 2);
    replica.kill();
    wait_good_replicas(&mut m, 0);
    assert!(error(&mut m, &["RLOCK.ACQUIRE", "other", "x"]).starts_with("NOREPLICAS"));
    // The leases end: the holds are gone, nobody is granted.
    wait_until(Duration::from_secs(3), || int(&mut m, &["DBSIZE"]) == 0);
    sleep(Duration::from_millis(300));
    assert_eq!(stat(&mut m, "waiters"), 2, "waiters keep waiting");
    assert_eq!(owner_of(&mut m, "RLOCK.INFO", "k"), None);
    // The fair waiter's BLOCK runs out: null, never a lock.
    let (reply, _, _) = fw.join().unwrap();
    assert_eq!(reply, Value::Nil);
    assert_eq!(owner_of(&mut m, "FAIRLOCK.INFO", "f"), None);
    assert!(!w.is_finished());

    // A replica is back: the waiter is served, and WAIT sees the grant.
    let start = Instant::now();
    replica.start_again();
    replica.replicate_from(&master);
    let (reply, waited, _) = w.join().unwrap();
    assert!(matches!(reply, Value::Int(_)), "{reply:?}");
    eprintln!(
        "served {:?} after the replica restarted; WAIT {waited:?}",
        start.elapsed()
    );
    assert_eq!(waited, Some(1));
    assert_eq!(owner_of(&mut m, "RLOCK.INFO", "k").as_deref(), Some("w"));
}

#[test]
fn frozen_master_deposed_in_split_brain_hands_nothing_over_when_it_wakes() {
    // The master sleeps while its replica is promoted; when it wakes, Redis's
    // count of good replicas is a second stale, but the lease timer runs
    // first. The waiter must not be granted.
    let master = guarded_master();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.client();
    wait_good_replicas(&mut m, 1);
    // The lease must outlast the WAIT (up to ~1 s when the replica acks on its
    // once-a-second REPLCONF ACK) and end during the 3 s sleep below: with
    // 500 ms it sometimes ended before the waiter parked, which then got the lock.
    int(&mut m, &["RLOCK.ACQUIRE", "k", "h", "PX", "2000"]);
    assert_eq!(wait_acked(&mut m, 2000), 1);
    let w = waiter(&master, &["RLOCK.ACQUIRE", "k", "w", "BLOCK", "5000"], 200);
    wait_parked(&mut m, 1);
    // An ACQUIRE of a free lock queued behind the sleep runs as soon as the
    // master wakes, before Redis recounts its good replicas.
    let mut sleeper = master.client();
    let asleep = std::thread::spawn(move || {
        redis::pipe()
            .cmd("DEBUG")
            .arg("SLEEP")
            .arg("3")
            // The usual acquire's shape, then one the general parser reads:
            // both go through the module's own check.
            .cmd("RLOCK.ACQUIRE")
            .arg("usual")
            .arg("x")
            .arg("PX")
            .arg("60000")
            .cmd("RLOCK.ACQUIRE")
            .arg("free")
            .arg("x")
            .query::<((), i64, i64)>(&mut sleeper)
    });
    sleep(Duration::from_millis(300));
    let mut r = replica.client();
    let _: () = cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).unwrap();
    let refused = asleep.join().unwrap();
    assert_eq!(
        refused.as_ref().err().and_then(|e| e.code()),
        Some("NOREPLICAS"),
        "{refused:?}"
    );
    let (reply, _, _) = w.join().unwrap();
    assert_eq!(reply, Value::Nil, "the deposed master handed the lock over");
    assert_eq!(owner_of(&mut m, "RLOCK.INFO", "k"), None);
    assert_eq!(int(&mut m, &["EXISTS", "free", "usual"]), 0);
}

#[test]
fn acknowledgements_read_after_a_stall_do_not_make_a_deposed_replica_good() {
    // The master stalls (a slow command) while its replica keeps sending its
    // once-a-second REPLCONF ACK, is promoted and hangs up. Redis stamps an
    // ack with the time it reads it (its clock is refreshed per command), so
    // when those acks are read after the stall, in the same turn as a queued
    // release and before the hang-up is seen, the replica looks up to date.
    // The release must not hand the lock over on that evidence.
    //
    // To get the replica's socket read after the stall and before the
    // release, all three must be ready when the stalling command is read: a
    // first stall (1.5 s, so an ack arrives in it) collects the stalling
    // command, then an ack, then the release, and the next turn runs them in
    // that order. (SIGSTOP does not stage this: on SIGCONT Redis's epoll_wait
    // returns EINTR, so the cron judges the replicas before any socket is read.)
    // max-lag 3 s keeps Redis's own count at one good replica after the first
    // stall, so Redis itself lets the release run.
    let master = guarded_master_with_lag("3");
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut m = master.client();
    wait_good_replicas(&mut m, 1);
    let mut holder = master.client();
    int(&mut holder, &["RLOCK.ACQUIRE", "k", "h", "PX", "60000"]);
    assert_eq!(wait_acked(&mut holder, 2000), 1);
    let w = waiter(&master, &["RLOCK.ACQUIRE", "k", "w", "BLOCK", "9000"], 200);
    wait_parked(&mut m, 1);
    let stall = |mut c: Connection, secs: &'static str| {
        std::thread::spawn(move || {
            let _: () = cmd("DEBUG").arg("SLEEP").arg(secs).query(&mut c).unwrap();
        })
    };
    let (first, second) = (master.client(), master.client());
    let first = stall(first, "1.5");
    sleep(Duration::from_millis(2));
    let second = stall(second, "5");
    sleep(Duration::from_millis(1300));
    let release = std::thread::spawn(move || call(&mut holder, &["RLOCK.RELEASE", "k", "h"]));
    // Promoted in the middle of the second stall: acks queue before it and
    // the hang-up after them.
    sleep(Duration::from_millis(2700));
    let mut r = replica.client();
    let _: () = cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).unwrap();
    first.join().unwrap();
    second.join().unwrap();
    let released = release.join().unwrap();
    let (reply, _, _) = w.join().unwrap();
    eprintln!("release: {released:?}; waiter: {reply:?}");
    // Released by the command (Redis's own count let it run), not refused.
    assert_eq!(
        released,
        Ok(Value::Int(0)),
        "the release did not run as staged"
    );
    assert_eq!(reply, Value::Nil, "the deposed master handed the lock over");
    assert_eq!(owner_of(&mut m, "RLOCK.INFO", "k"), None);
}

// ---------------------------------------------------------------------------
// 4. Tokens in failover order

#[test]
fn promoted_replica_outranks_the_deposed_master_and_never_repeats_its_tokens() {
    let (master, replica, mut m) = pair();
    let mut before = vec![];
    for i in 0..20 {
        before.push(int(&mut m, &["RLOCK.ACQUIRE", &format!("k{i}"), "a"]));
    }
    assert_eq!(wait_acked(&mut m, 5000), 1);
    // Split brain: the replica is promoted, the old master keeps granting.
    let mut r = replica.client();
    let _: () = cmd("REPLICAOF").arg("NO").arg("ONE").query(&mut r).unwrap();
    let (mut old, mut new) = (vec![], vec![]);
    for i in 0..50 {
        let key = format!("s{i}");
        new.push(int(&mut r, &["RLOCK.ACQUIRE", &key, "new"]));
        old.push(int(&mut m, &["RLOCK.ACQUIRE", &key, "old"]));
        sleep(Duration::from_millis(3));
    }
    let max_old = *old.iter().max().unwrap();
    let min_new = *new.iter().min().unwrap();
    eprintln!("deposed master's tokens up to {max_old}, new master's from {min_new}");
    assert!(
        min_new > max_old,
        "a token of the deposed master ({max_old}) outranks the new master's ({min_new})"
    );
    assert!(min_new > *before.iter().max().unwrap());
    assert!(
        old.iter().all(|t| !new.contains(t)),
        "a token was issued twice"
    );
    drop(master);
}
