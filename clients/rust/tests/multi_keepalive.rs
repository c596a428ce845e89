//! MultiLock (RLOCK.ACQUIREALL), keepalive locks and the Deadlock error
//! against a real server.

mod common;

use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;
use redis::Value;
use rlock_client::{info_field, Error, Lock, MultiLock, ReadWriteLock};

fn owner_of(c: &mut redis::Connection, key: &str) -> Option<String> {
    let reply: Value = redis::cmd("RLOCK.INFO").arg(key).query(c).unwrap();
    let info = rlock_client::parse_info(reply)?;
    Some(redis::from_redis_value(info_field(&info, "owner").unwrap()).unwrap())
}

/// The client id the keepalive holding of `key` is bound to (None: unbound).
fn keepalive_client(c: &mut redis::Connection, key: &str) -> Option<i64> {
    let reply: Value = redis::cmd("RLOCK.INFO").arg(key).query(c).unwrap();
    let info = rlock_client::parse_info(reply).expect("held");
    match info_field(&info, "keepalive") {
        Some(Value::Int(id)) => Some(*id),
        _ => None,
    }
}

fn calls(c: &mut redis::Connection, command: &str) -> i64 {
    let stats: String = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
    let prefix = format!("cmdstat_{command}:calls=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

fn exists(c: &mut redis::Connection, keys: &[&str]) -> i64 {
    redis::cmd("EXISTS").arg(keys).query(c).unwrap()
}

#[test]
fn multi_lock_is_all_or_nothing() {
    let s = Server::start();
    let cl = s.client();
    let mut c = s.conn();
    let other = Lock::new(&cl, "m:b").acquire(None).unwrap().unwrap();
    let multi = MultiLock::new(&cl, ["m:a", "m:b", "m:c"]).lease(Duration::from_secs(5));
    assert!(multi.try_acquire().unwrap().is_none());
    assert_eq!(exists(&mut c, &["m:a", "m:c"]), 0, "nothing taken");
    drop(other);
    let guard = multi.try_acquire().unwrap().expect("every key free");
    assert_eq!(guard.tokens().len(), 3);
    assert!(guard.is_renewing());
    for (key, info) in multi.keys().iter().zip(multi.info().unwrap()) {
        let info = info.unwrap_or_else(|| panic!("{key} held"));
        let owner: String = redis::from_redis_value(info_field(&info, "owner").unwrap()).unwrap();
        assert_eq!(owner, multi.owner_name());
    }
    // Plain RLOCK keys: another owner's single-key lock is refused.
    assert!(Lock::new(&cl, "m:c").try_acquire().unwrap().is_none());
    // Reentrant: the same owner again, the same tokens.
    let again = multi.try_acquire().unwrap().unwrap();
    assert_eq!(again.tokens(), guard.tokens());
    assert_eq!(again.release().unwrap(), [1, 1, 1]);
    assert_eq!(guard.release().unwrap(), [0, 0, 0]);
    assert_eq!(exists(&mut c, &["m:a", "m:b", "m:c"]), 0);
}

#[test]
fn multi_lock_renewal_and_loss() {
    let s = Server::start();
    let mut c = s.conn();
    let reports = Arc::new(Mutex::new(Vec::<String>::new()));
    let r2 = reports.clone();
    let multi = MultiLock::new(&s.client(), ["r:1", "r:2"])
        .lease(Duration::from_millis(300))
        .on_lost(move |why| r2.lock().unwrap().push(why.to_string()));
    let before = calls(&mut c, "rlock.renewall");
    let guard = multi.acquire(None).unwrap().unwrap();
    let end = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end {
        assert_eq!(owner_of(&mut c, "r:1").as_deref(), Some(multi.owner_name()));
        assert_eq!(owner_of(&mut c, "r:2").as_deref(), Some(multi.owner_name()));
        sleep(Duration::from_millis(50));
    }
    assert!(calls(&mut c, "rlock.renewall") - before >= 5);
    // One key forced free: RENEWALL says NOTOWNER, the guard is lost.
    let _: i64 = redis::cmd("RLOCK.FORCERELEASE")
        .arg("r:2")
        .query(&mut c)
        .unwrap();
    wait_until(Duration::from_secs(2), || guard.is_lost());
    assert_eq!(reports.lock().unwrap().len(), 1);
    assert!(matches!(guard.check(), Err(Error::Lost(_))));
    assert!(matches!(guard.release(), Err(Error::Lost(_))));
}

#[test]
fn blocking_multi_lock_is_granted_when_the_last_key_frees() {
    let s = Server::start();
    let cl = s.client();
    let a = Lock::new(&cl, "w:a").acquire(None).unwrap().unwrap();
    let b = Lock::new(&cl, "w:b").acquire(None).unwrap().unwrap();
    let (ta, tb) = (a.token(), b.token());
    let multi = MultiLock::new(&cl, ["w:a", "w:b"]).owner("multi");
    let t = std::thread::spawn(move || multi.acquire(Some(Duration::from_secs(5))));
    wait_until(Duration::from_secs(5), || {
        stat(&mut s.conn(), "waiters") == 1
    });
    drop(a);
    sleep(Duration::from_millis(200));
    assert!(!t.is_finished(), "granted before every key was free");
    // The freed key is reserved for the queued multi-key waiter.
    assert!(Lock::new(&cl, "w:a").try_acquire().unwrap().is_none());
    let start = Instant::now();
    drop(b);
    let guard = t.join().unwrap().unwrap().expect("granted");
    assert!(start.elapsed() < Duration::from_secs(1));
    let tokens = guard.tokens();
    assert!(tokens[0] > ta && tokens[1] > tb, "{tokens:?}");
    let mut c = s.conn();
    assert_eq!(owner_of(&mut c, "w:a").as_deref(), Some("multi"));
    assert_eq!(owner_of(&mut c, "w:b").as_deref(), Some("multi"));
    assert_eq!(guard.release().unwrap(), [0, 0]);
}

#[test]
fn blocking_multi_lock_times_out_holding_nothing() {
    let s = Server::start();
    let cl = s.client();
    let _b = Lock::new(&cl, "t:b").acquire(None).unwrap().unwrap();
    let start = Instant::now();
    let got = MultiLock::new(&cl, ["t:a", "t:b"])
        .acquire(Some(Duration::from_millis(200)))
        .unwrap();
    assert!(got.is_none());
    assert!(start.elapsed() >= Duration::from_millis(190));
    let mut c = s.conn();
    assert_eq!(exists(&mut c, &["t:a"]), 0);
    assert_eq!(stat(&mut c, "waiters"), 0);
}

#[test]
fn keepalive_outlives_3x_its_lease_without_a_renewal_thread() {
    let s = Server::start();
    let mut c = s.conn();
    let lock = Lock::new(&s.client(), "ka")
        .lease(Duration::from_millis(300))
        .keepalive(true);
    let before = renew_calls(&mut c);
    let guard = lock.acquire(None).unwrap().unwrap();
    assert!(!guard.is_renewing());
    let bound = keepalive_client(&mut c, "ka").expect("bound to a connection");
    let end = Instant::now() + Duration::from_secs(1);
    while Instant::now() < end {
        let info = lock
            .info()
            .unwrap()
            .expect("the lease ran out despite KEEPALIVE");
        match info_field(&info, "token") {
            Some(Value::Int(t)) => assert_eq!(*t, guard.token()),
            other => panic!("{other:?}"),
        }
        sleep(Duration::from_millis(50));
    }
    assert_eq!(renew_calls(&mut c), before, "a client renewed");
    // A second guard of the same owner goes through the same connection:
    // dropping it leaves the first one's holding (and binding) alone.
    let inner = lock.try_acquire().unwrap().expect("reentrant");
    assert_eq!(inner.token(), guard.token());
    assert_eq!(inner.release().unwrap(), 1);
    assert_eq!(keepalive_client(&mut c, "ka"), Some(bound));
    sleep(Duration::from_millis(500));
    assert!(s.has("ka"), "the outer hold ended with the inner guard");
    assert_eq!(guard.release().unwrap(), 0);
    assert!(!s.has("ka"));
    // The pinned connection is closed with the last guard.
    wait_until(Duration::from_secs(2), || {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut c).unwrap();
        !list.lines().any(|l| l.starts_with(&format!("id={bound} ")))
    });
}

#[test]
fn keepalive_holding_ends_when_its_connection_closes() {
    let s = Server::start();
    let cl = s.client();
    let mut c = s.conn();
    let holder = Lock::new(&cl, "kill")
        .lease(Duration::from_secs(10))
        .keepalive(true);
    let guard = holder.acquire(None).unwrap().unwrap();
    let waiter = Lock::new(&cl, "kill");
    let t = std::thread::spawn(move || {
        waiter
            .acquire(Some(Duration::from_secs(5)))
            .map(|g| g.map(|g| g.token()))
    });
    wait_until(Duration::from_secs(5), || {
        stat(&mut s.conn(), "waiters") == 1
    });
    // The holder's connection goes away (as when its process dies): the lock
    // is handed over at once, not 10 s (the lease) later.
    let id = keepalive_client(&mut c, "kill").unwrap();
    let start = Instant::now();
    let _: () = redis::cmd("CLIENT")
        .arg("KILL")
        .arg("ID")
        .arg(id)
        .query(&mut c)
        .map(|_: i64| ())
        .unwrap();
    let token = t.join().unwrap().unwrap().expect("handed over");
    assert!(start.elapsed() < Duration::from_secs(1));
    assert!(token > guard.token());
    assert!(matches!(guard.release(), Err(Error::Lost(_))));
    // The lock is usable again (the waiter released it), on a new connection.
    let g = holder.try_acquire().unwrap().expect("free");
    let again = keepalive_client(&mut c, "kill").expect("bound");
    assert_ne!(again, id);
    assert_eq!(g.release().unwrap(), 0);
}

#[test]
fn keepalive_multi_lock_and_read_write_views() {
    let s = Server::start();
    let cl = s.client();
    let mut c = s.conn();
    let before = calls(&mut c, "rlock.renewall");
    let multi = MultiLock::new(&cl, ["k:1", "k:2"])
        .lease(Duration::from_millis(300))
        .keepalive(true);
    let g = multi.acquire(None).unwrap().unwrap();
    assert!(!g.is_renewing());
    let bound = keepalive_client(&mut c, "k:1");
    assert!(bound.is_some());
    assert_eq!(keepalive_client(&mut c, "k:2"), bound);
    sleep(Duration::from_secs(1));
    assert_eq!(owner_of(&mut c, "k:1").as_deref(), Some(multi.owner_name()));
    assert_eq!(owner_of(&mut c, "k:2").as_deref(), Some(multi.owner_name()));
    assert_eq!(calls(&mut c, "rlock.renewall"), before);
    assert_eq!(g.release().unwrap(), [0, 0]);
    assert_eq!(exists(&mut c, &["k:1", "k:2"]), 0);

    // RWLOCK views share one connection: releasing WRITE (a downgrade) keeps READ.
    let rw = ReadWriteLock::new(&cl, "krw")
        .lease(Duration::from_millis(300))
        .keepalive(true);
    let w = rw.write().acquire(None).unwrap().unwrap();
    let r = rw.read().try_acquire().unwrap().unwrap();
    assert!(!w.is_renewing() && !r.is_renewing());
    assert_eq!(w.release().unwrap(), 0);
    sleep(Duration::from_secs(1));
    assert!(s.has("krw"), "the read hold ended with the write guard");
    assert_eq!(r.release().unwrap(), 0);
    assert!(!s.has("krw"));
}

#[test]
fn deadlock_is_an_error_for_the_latest_waiter() {
    let s = Server::start();
    let cl = s.client();
    let mut c = s.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("rlock.deadlock-check-ms")
        .arg(100)
        .query(&mut c)
        .unwrap();
    let a1 = Lock::new(&cl, "d:1")
        .owner("A")
        .acquire(None)
        .unwrap()
        .unwrap();
    let b2 = Lock::new(&cl, "d:2")
        .owner("B")
        .acquire(None)
        .unwrap()
        .unwrap();
    // A waits for B ...
    let a2 = Lock::new(&cl, "d:2").owner("A");
    let t = std::thread::spawn(move || {
        a2.acquire(Some(Duration::from_secs(10)))
            .map(|g| g.map(|g| g.token()))
    });
    wait_until(Duration::from_secs(5), || {
        stat(&mut s.conn(), "waiters") == 1
    });
    // ... and B for A: B came last, B gets the error.
    let start = Instant::now();
    let e = Lock::new(&cl, "d:1")
        .owner("B")
        .acquire(Some(Duration::from_secs(10)))
        .unwrap_err();
    assert!(start.elapsed() < Duration::from_secs(2));
    match &e {
        Error::Deadlock { cycle } => assert_eq!(cycle, &["B", "A", "B"]),
        other => panic!("not a deadlock: {other}"),
    }
    assert_eq!(e.to_string(), "deadlock: wait-for cycle: B -> A -> B");
    assert_eq!(stat(&mut c, "deadlocks"), 1);
    // B gives up what it holds: A's wait is served.
    drop(b2);
    assert!(t.join().unwrap().unwrap().is_some());
    drop(a1);
}

#[test]
fn release_and_renew_do_not_wait_behind_a_clones_parked_acquisition() {
    // A keepalive semaphore holds a permit; a clone (the same owner) waits on
    // the pinned connection for a second one while another owner holds the
    // last. The holder's renew and release go through at once (not when the
    // wait times out), and the release serves the parked wait, which the
    // server binds to the pinned connection.
    let s = Server::start();
    let cl = s.client();
    let mut c = s.conn();
    another_holds_one_of_two(&mut c, "kr");
    let sem = Lock::semaphore(&cl, "kr", 2, 1).keepalive(true);
    let mut first = sem.try_acquire().unwrap().expect("2 of 2");
    let bound = semaphore_binding(&mut c, "kr", sem.owner_name()).expect("bound");
    let clone = sem.clone();
    let t = std::thread::spawn(move || {
        clone
            .acquire(Some(Duration::from_secs(10)))
            .map(|g| g.map(|g| (g.token(), g)))
    });
    wait_until(Duration::from_secs(5), || {
        stat(&mut s.conn(), "waiters") == 1
    });
    let start = Instant::now();
    first.renew().unwrap();
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "the renew waited behind the parked acquisition"
    );
    let token = first.token();
    let start = Instant::now();
    assert_eq!(first.release().unwrap(), 0);
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "the release waited behind the parked acquisition"
    );
    let (second, guard) = t.join().unwrap().unwrap().expect("served by the release");
    assert!(second > token, "a new tenure");
    assert_eq!(
        semaphore_binding(&mut c, "kr", sem.owner_name()),
        Some(bound),
        "bound to the pinned connection"
    );
    assert_eq!(guard.release().unwrap(), 0);
    // The pinned connection is closed with the last guard.
    wait_until(Duration::from_secs(2), || {
        let list: String = redis::cmd("CLIENT").arg("LIST").query(&mut c).unwrap();
        !list.lines().any(|l| l.starts_with(&format!("id={bound} ")))
    });
}

#[test]
fn a_clones_wait_for_the_pinned_connection_is_not_counted_against_its_own() {
    // A clone's acquisition queued behind another clone's parked one gets its
    // own BLOCK + margin from when it is sent: the time spent queued does not
    // make it time out, which would close the pinned connection and end the
    // holdings bound to it.
    let s = Server::start();
    let cl = s.client();
    let mut c = s.conn();
    another_holds_one_of_two(&mut c, "kq");
    let sem = Lock::semaphore(&cl, "kq", 2, 1)
        .keepalive(true)
        .wait_margin(Duration::from_millis(300));
    let held = sem.try_acquire().unwrap().expect("2 of 2");
    let a = sem.clone();
    let first = std::thread::spawn(move || a.acquire(Some(Duration::from_millis(1500))));
    wait_until(Duration::from_secs(5), || {
        stat(&mut s.conn(), "waiters") == 1
    });
    let b = sem.clone();
    let second = std::thread::spawn(move || b.acquire(Some(Duration::from_millis(300))));
    assert!(first.join().unwrap().unwrap().is_none(), "timed out: nil");
    assert!(second.join().unwrap().unwrap().is_none(), "timed out: nil");
    assert_eq!(
        held.release().unwrap(),
        0,
        "the holding outlived both waits"
    );
}

/// Another owner holds one permit of a semaphore of two at `key`.
fn another_holds_one_of_two(c: &mut redis::Connection, key: &str) {
    let _: i64 = redis::cmd("SEMAPHORE.ACQUIRE")
        .arg(&[key, "other", "LIMIT", "2", "PERMITS", "1", "PX", "30000"][..])
        .query(c)
        .unwrap();
}

/// The client id `owner`'s semaphore holding of `key` is bound to.
fn semaphore_binding(c: &mut redis::Connection, key: &str, owner: &str) -> Option<i64> {
    let reply: Value = redis::cmd("SEMAPHORE.INFO").arg(key).query(c).unwrap();
    let info = rlock_client::parse_info(reply)?;
    let Some(Value::Array(list)) = info_field(&info, "holders").cloned() else {
        return None;
    };
    list.into_iter().find_map(|h| {
        let h = rlock_client::parse_info(h)?;
        let o: String = redis::from_redis_value(info_field(&h, "owner")?).ok()?;
        match (o == owner, info_field(&h, "keepalive")) {
            (true, Some(Value::Int(id))) => Some(*id),
            _ => None,
        }
    })
}
