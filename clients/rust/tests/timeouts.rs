//! An acquisition against a server that stops answering (SIGSTOP): it returns
//! a timeout error within its timeout plus the wait margin, for every lock
//! kind, keepalive or not, frozen before or during the wait.

mod common;

use std::sync::mpsc;
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;
use redis::Value;
use rlock_client::{Error, Lock, MultiLock, ReadWriteLock, Result};

const MARGIN: Duration = Duration::from_millis(500);
const WAIT: Duration = Duration::from_secs(1);
/// How long past timeout + margin a call may take before the test calls it
/// hung (scheduling on a busy machine, not the library's precision).
const SLACK: Duration = Duration::from_secs(5);

/// Thaws the server when dropped (also when a check panics).
struct Frozen<'a>(&'a mut Server);

impl<'a> Frozen<'a> {
    fn new(s: &'a mut Server) -> Frozen<'a> {
        s.freeze();
        Frozen(s)
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        self.0.thaw();
    }
}

fn waiters(s: &Server) -> i64 {
    stat(&mut s.conn(), "waiters")
}

/// Runs `f` on a thread; its outcome and how long it took come on the channel.
fn spawn<T: Send + 'static>(
    f: impl FnOnce() -> Result<T> + Send + 'static,
) -> mpsc::Receiver<(Result<T>, Duration)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let start = Instant::now();
        let r = f();
        let _ = tx.send((r, start.elapsed()));
    });
    rx
}

fn expect_timeout<T>(outcome: (Result<T>, Duration), what: &str) {
    let (r, took) = outcome;
    match r {
        Err(e) => assert!(e.is_timeout(), "{what}: not a timeout: {e}"),
        Ok(_) => panic!("{what}: answered while frozen"),
    }
    assert!(took < WAIT + MARGIN + SLACK, "{what}: took {took:?}");
}

type Waiter = Box<dyn FnOnce() -> Result<bool> + Send>;

#[test]
fn a_wait_parked_before_the_freeze_times_out() {
    let mut s = Server::start();
    let cl = s.client();
    // (name, the holder's command, the waiter)
    let kinds: Vec<(&str, Vec<&str>, Waiter)> = vec![
        ("Lock", vec!["RLOCK.ACQUIRE", "f:l", "h", "PX", "60000"], {
            let l = Lock::new(&cl, "f:l").wait_margin(MARGIN);
            Box::new(move || l.acquire(Some(WAIT)).map(|g| g.is_some()))
        }),
        (
            "Lock::fair",
            vec!["FAIRLOCK.ACQUIRE", "f:f", "h", "PX", "60000"],
            {
                let l = Lock::fair(&cl, "f:f").wait_margin(MARGIN);
                Box::new(move || l.acquire(Some(WAIT)).map(|g| g.is_some()))
            },
        ),
        (
            "ReadWriteLock::write",
            vec!["RWLOCK.ACQUIRE", "f:rw", "READ", "h", "PX", "60000"],
            {
                let l = ReadWriteLock::new(&cl, "f:rw").wait_margin(MARGIN);
                Box::new(move || l.write().acquire(Some(WAIT)).map(|g| g.is_some()))
            },
        ),
        (
            "MultiLock",
            vec!["RLOCK.ACQUIRE", "{f}:2", "h", "PX", "60000"],
            {
                let l = MultiLock::new(&cl, ["{f}:1", "{f}:2"]).wait_margin(MARGIN);
                Box::new(move || l.acquire(Some(WAIT)).map(|g| g.is_some()))
            },
        ),
        (
            "Lock::semaphore",
            vec![
                "SEMAPHORE.ACQUIRE",
                "f:s",
                "h",
                "LIMIT",
                "1",
                "PERMITS",
                "1",
                "PX",
                "60000",
            ],
            {
                let l = Lock::semaphore(&cl, "f:s", 1, 1).wait_margin(MARGIN);
                Box::new(move || l.acquire(Some(WAIT)).map(|g| g.is_some()))
            },
        ),
        (
            "Lock keepalive",
            vec!["RLOCK.ACQUIRE", "f:k", "h", "PX", "60000"],
            {
                let l = Lock::new(&cl, "f:k").keepalive(true).wait_margin(MARGIN);
                Box::new(move || l.acquire(Some(WAIT)).map(|g| g.is_some()))
            },
        ),
    ];
    for (name, holder, waiter) in kinds {
        let mut c = s.conn();
        let _: Value = redis::cmd(holder[0])
            .arg(&holder[1..])
            .query(&mut c)
            .unwrap();
        let rx = spawn(waiter);
        wait_until(Duration::from_secs(5), || waiters(&s) == 1);
        let outcome = {
            let _frozen = Frozen::new(&mut s);
            rx.recv_timeout(WAIT + MARGIN + SLACK)
                .unwrap_or_else(|_| panic!("{name}: the wait did not return while frozen"))
        };
        expect_timeout(outcome, name);
        // Thawed: the abandoned waiter was not granted (its BLOCK time ran
        // out while frozen).
        wait_until(Duration::from_secs(5), || waiters(&s) == 0);
        let _: () = redis::cmd("FLUSHALL").query(&mut c).unwrap();
    }
}

#[test]
fn a_wait_that_timed_out_leaves_nothing_behind() {
    // After a timeout the same lock acquires again on a fresh connection:
    // the late answer to the abandoned wait reaches nobody.
    let mut s = Server::start();
    let cl = s.client();
    for keepalive in [false, true] {
        let mut c = s.conn();
        let _: i64 = redis::cmd("RLOCK.ACQUIRE")
            .arg(&["again", "h", "PX", "60000"][..])
            .query(&mut c)
            .unwrap();
        let lock = Lock::new(&cl, "again")
            .keepalive(keepalive)
            .wait_margin(MARGIN);
        let l2 = lock.clone();
        let rx = spawn(move || l2.acquire(Some(WAIT)).map(|g| g.is_some()));
        wait_until(Duration::from_secs(5), || waiters(&s) == 1);
        let outcome = {
            let _frozen = Frozen::new(&mut s);
            rx.recv_timeout(WAIT + MARGIN + SLACK)
                .expect("the wait did not return while frozen")
        };
        expect_timeout(outcome, "wait");
        wait_until(Duration::from_secs(5), || waiters(&s) == 0);
        let _: i64 = redis::cmd("RLOCK.RELEASE")
            .arg(&["again", "h"][..])
            .query(&mut c)
            .unwrap();
        let g = lock
            .acquire(Some(WAIT))
            .unwrap()
            .expect("granted on a fresh connection");
        assert_eq!(g.release().unwrap(), 0);
    }
}

#[test]
fn a_freeze_before_the_connection_is_set_up_times_out() {
    let mut s = Server::start();
    let cl = s.client();
    for keepalive in [false, true] {
        let lock = Lock::new(&cl, "setup")
            .keepalive(keepalive)
            .wait_margin(MARGIN);
        let _frozen = Frozen::new(&mut s);
        let rx = spawn(move || lock.acquire(Some(WAIT)).map(|g| g.is_some()));
        let outcome = rx
            .recv_timeout(WAIT + MARGIN + SLACK)
            .unwrap_or_else(|_| panic!("keepalive {keepalive}: the set-up did not return"));
        expect_timeout(outcome, "set-up");
    }
}

fn holders(c: &mut redis::Connection, key: &str) -> Vec<String> {
    let reply: Value = redis::cmd("SEMAPHORE.INFO").arg(key).query(c).unwrap();
    let info = rlock_client::parse_info(reply).expect("held");
    let Some(Value::Array(list)) = rlock_client::info_field(&info, "holders").cloned() else {
        panic!("no holders list");
    };
    list.into_iter()
        .map(|h| {
            let h = rlock_client::parse_info(h).unwrap();
            redis::from_redis_value(rlock_client::info_field(&h, "owner").unwrap()).unwrap()
        })
        .collect()
}

#[test]
fn keepalive_holdings_on_an_abandoned_connection_end() {
    // A keepalive semaphore holds a permit and a clone waits for a second one
    // on the pinned connection; the server freezes. The wait is abandoned
    // and the connection closed: once thawed, the server ends the holding
    // bound to it (not 60 s, its lease, later).
    let mut s = Server::start();
    let cl = s.client();
    let mut c = s.conn();
    let _: i64 = redis::cmd("SEMAPHORE.ACQUIRE")
        .arg(&["ks", "other", "LIMIT", "2", "PERMITS", "1", "PX", "60000"][..])
        .query(&mut c)
        .unwrap();
    let sem = Lock::semaphore(&cl, "ks", 2, 1)
        .keepalive(true)
        .lease(Duration::from_secs(60))
        .wait_margin(MARGIN);
    let held = sem.try_acquire().unwrap().expect("2 of 2");
    let clone = sem.clone();
    let rx = spawn(move || clone.acquire(Some(WAIT)).map(|g| g.is_some()));
    wait_until(Duration::from_secs(5), || waiters(&s) == 1);
    let outcome = {
        let _frozen = Frozen::new(&mut s);
        rx.recv_timeout(WAIT + MARGIN + SLACK)
            .expect("the keepalive wait did not return while frozen")
    };
    expect_timeout(outcome, "keepalive wait");
    wait_until(Duration::from_secs(5), || {
        holders(&mut c, "ks") == ["other".to_string()]
    });
    assert!(matches!(held.release(), Err(Error::Lost(_))));
}

#[test]
fn a_guard_from_before_the_pinned_connection_failed_is_lost() {
    // A keepalive lock holds; a clone's wait on the pinned connection is
    // abandoned (the server froze), which ends the holding. Another clone
    // then acquires again: a new tenure on a new connection. The guard from
    // before the failure is told Lost and its release sends nothing: it must
    // not drop the new tenure's hold.
    let mut s = Server::start();
    let cl = s.client();
    let mut c = s.conn();
    let _: i64 = redis::cmd("SEMAPHORE.ACQUIRE")
        .arg(&["kg", "other", "LIMIT", "2", "PERMITS", "1", "PX", "60000"][..])
        .query(&mut c)
        .unwrap();
    let sem = Lock::semaphore(&cl, "kg", 2, 1)
        .keepalive(true)
        .lease(Duration::from_secs(60))
        .wait_margin(MARGIN);
    let mut old = sem.try_acquire().unwrap().expect("2 of 2");
    let clone = sem.clone();
    let rx = spawn(move || clone.acquire(Some(WAIT)).map(|g| g.is_some()));
    wait_until(Duration::from_secs(5), || waiters(&s) == 1);
    let outcome = {
        let _frozen = Frozen::new(&mut s);
        rx.recv_timeout(WAIT + MARGIN + SLACK)
            .expect("the keepalive wait did not return while frozen")
    };
    expect_timeout(outcome, "keepalive wait");
    wait_until(Duration::from_secs(5), || {
        holders(&mut c, "kg") == ["other".to_string()]
    });
    let owner = sem.owner_name().to_string();
    let new = sem.clone().try_acquire().unwrap().expect("a new tenure");
    assert_eq!(holders(&mut c, "kg"), ["other".to_string(), owner.clone()]);
    let releases = |c: &mut redis::Connection| -> i64 {
        let info: redis::InfoDict = redis::cmd("INFO").arg("commandstats").query(c).unwrap();
        let calls = |name: &str| {
            info.get::<String>(name)
                .and_then(|v| {
                    v.split(',')
                        .find_map(|f| f.strip_prefix("calls=").map(|n| n.parse::<i64>().unwrap()))
                })
                .unwrap_or(0)
        };
        calls("cmdstat_semaphore.release") + calls("cmdstat_semaphore.renew")
    };
    let before = releases(&mut c);
    assert!(matches!(old.renew(), Err(Error::Lost(_))));
    assert!(old.is_lost());
    assert!(matches!(old.release(), Err(Error::Lost(_))));
    assert_eq!(releases(&mut c), before, "the stale guard sent a command");
    assert_eq!(
        holders(&mut c, "kg"),
        ["other".to_string(), owner.clone()],
        "the stale guard's release dropped the new tenure's hold"
    );
    assert!(!new.is_lost());
    assert_eq!(new.release().unwrap(), 0);
    assert_eq!(holders(&mut c, "kg"), ["other".to_string()]);
}

#[test]
fn waits_longer_than_the_margin_still_work() {
    // The margin bounds how late the answer may be, not the wait: BLOCK 0
    // and a BLOCK longer than the margin are served.
    let s = Server::start();
    let cl = s.client();
    let mut c = s.conn();
    for keepalive in [false, true] {
        for timeout in [None, Some(Duration::from_secs(3))] {
            let _: i64 = redis::cmd("RLOCK.ACQUIRE")
                .arg(&["long", "h", "PX", "60000"][..])
                .query(&mut c)
                .unwrap();
            let lock = Lock::new(&cl, "long")
                .keepalive(keepalive)
                .wait_margin(Duration::from_millis(200));
            let rx = spawn(move || lock.acquire(timeout).map(|g| g.map(|g| g.release())));
            wait_until(Duration::from_secs(5), || waiters(&s) == 1);
            sleep(Duration::from_millis(600)); // three margins
            let _: i64 = redis::cmd("RLOCK.RELEASE")
                .arg(&["long", "h"][..])
                .query(&mut c)
                .unwrap();
            let (r, _) = rx.recv_timeout(Duration::from_secs(10)).unwrap();
            let released = r.unwrap_or_else(|e| panic!("{keepalive} {timeout:?}: {e}"));
            assert_eq!(released.expect("granted").unwrap(), 0);
        }
    }
}
