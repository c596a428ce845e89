//! Semaphores (`Lock::semaphore`, `SEMAPHORE.*`) against a real server.

mod common;

use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;
use redis::Value;
use rlock_client::{info_field, Error, Lock};

fn int(v: Option<&Value>) -> i64 {
    match v {
        Some(Value::Int(i)) => *i,
        other => panic!("not an integer: {other:?}"),
    }
}

fn used(lock: &Lock) -> i64 {
    lock.info()
        .unwrap()
        .map_or(0, |info| int(info_field(&info, "used")))
}

#[test]
fn permits_up_to_the_limit_and_release_counts() {
    let s = Server::start();
    let cl = s.client();
    let a = Lock::semaphore(&cl, "s", 5, 2);
    let b = Lock::semaphore(&cl, "s", 5, 2);
    let ga = a.try_acquire().unwrap().expect("2 of 5");
    let gb = b.try_acquire().unwrap().expect("4 of 5");
    assert!(gb.token() > ga.token());
    assert!(Lock::semaphore(&cl, "s", 5, 2)
        .try_acquire()
        .unwrap()
        .is_none());
    assert_eq!(used(&a), 4);
    let info = a.info().unwrap().unwrap();
    assert_eq!(int(info_field(&info, "limit")), 5);
    assert_eq!(int(info_field(&info, "available")), 1);
    // One permit more for `a` fits, under the same token.
    let one_more = Lock::semaphore(&cl, "s", 5, 1).owner(a.owner_name());
    let g1 = one_more.try_acquire().unwrap().expect("5 of 5");
    assert_eq!(g1.token(), ga.token());
    assert_eq!(g1.release().unwrap(), 2, "a's 2 permits are left");
    assert_eq!(ga.release().unwrap(), 0);
    assert_eq!(gb.release().unwrap(), 0);
    assert!(!s.has("s"));
}

#[test]
fn a_release_hands_permits_to_a_parked_waiter() {
    let s = Server::start();
    let cl = s.client();
    let holder = Lock::semaphore(&cl, "w", 2, 2)
        .acquire(None)
        .unwrap()
        .unwrap();
    let first = holder.token();
    let waiter = Lock::semaphore(&cl, "w", 2, 1);
    let t = std::thread::spawn(move || {
        waiter
            .acquire(Some(Duration::from_secs(5)))
            .map(|g| g.map(|g| g.token()))
    });
    wait_until(Duration::from_secs(5), || {
        stat(&mut s.conn(), "waiters") == 1
    });
    let start = Instant::now();
    holder.release().unwrap();
    let token = t.join().unwrap().unwrap().expect("handed over");
    assert!(start.elapsed() < Duration::from_secs(2));
    assert!(token > first);
    // Busy: a try is None, a BLOCK wait times out with None.
    let _full = Lock::semaphore(&cl, "full", 1, 1)
        .acquire(None)
        .unwrap()
        .unwrap();
    let other = Lock::semaphore(&cl, "full", 1, 1);
    assert!(other.try_acquire().unwrap().is_none());
    assert!(other
        .acquire(Some(Duration::from_millis(200)))
        .unwrap()
        .is_none());
}

#[test]
fn renewal_keeps_a_300ms_lease_alive_for_2s() {
    let s = Server::start();
    let lock = Lock::semaphore(&s.client(), "r", 3, 2).lease(Duration::from_millis(300));
    let guard = lock.acquire(None).unwrap().unwrap();
    assert!(guard.is_renewing());
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert_eq!(used(&lock), 2, "the lease ran out despite renewal");
        sleep(Duration::from_millis(50));
    }
    assert_eq!(guard.release().unwrap(), 0);
}

#[test]
fn a_lost_holding_is_reported() {
    let s = Server::start();
    let reports = Arc::new(Mutex::new(Vec::<String>::new()));
    let r2 = reports.clone();
    let lock = Lock::semaphore(&s.client(), "lost", 2, 1)
        .lease(Duration::from_millis(300))
        .on_lost(move |why| r2.lock().unwrap().push(why.to_string()));
    let guard = lock.acquire(None).unwrap().unwrap();
    let forced: i64 = redis::cmd("SEMAPHORE.FORCERELEASE")
        .arg("lost")
        .query(&mut s.conn())
        .unwrap();
    assert_eq!(forced, 1);
    wait_until(Duration::from_secs(2), || guard.is_lost());
    assert!(matches!(guard.check(), Err(Error::Lost(_))));
    let reports = reports.lock().unwrap().clone();
    assert_eq!(reports.len(), 1);
    assert!(reports[0].contains("NOTOWNER"), "{reports:?}");
    // The renewal thread ends after it reported the loss.
    wait_until(Duration::from_secs(2), || !guard.is_renewing());
    assert!(matches!(guard.release(), Err(Error::Lost(_))));
}

#[test]
fn guards_of_one_lock_share_a_token_and_a_partial_return_wakes_the_pubsub_path() {
    let s = Server::start();
    let cl = s.client();
    let lock = Lock::semaphore(&cl, "part", 2, 1);
    let g1 = lock.try_acquire().unwrap().expect("1 of 2");
    let g2 = lock.try_acquire().unwrap().expect("2 of 2");
    assert_eq!(g1.token(), g2.token(), "one holding, one token");
    assert_eq!(used(&lock), 2);
    let waiter = Lock::semaphore(&cl, "part", 2, 1);
    let t = std::thread::spawn(move || {
        waiter
            .acquire_via_pubsub(Some(Duration::from_secs(10)), Duration::from_secs(10))
            .map(|g| g.map(|g| g.token()))
    });
    let mut c = s.conn();
    wait_until(Duration::from_secs(5), || {
        let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("__rlock@0__:part")
            .query(&mut c)
            .unwrap();
        n[0].1 == 1
    });
    assert_eq!(stat(&mut c, "waiters"), 0, "the pub/sub path must not park");
    let start = Instant::now();
    assert_eq!(g1.release().unwrap(), 1, "one permit returned, one kept");
    let token = t.join().unwrap().unwrap().expect("granted");
    assert!(
        start.elapsed() < Duration::from_millis(2500),
        "the `released` message, not the poll"
    );
    assert!(token > g2.token());
    // The waiter's guard was dropped in its thread; dropping g2 returns the last permit.
    drop(g2);
    assert!(!s.has("part"));
}

#[test]
fn threads_contend_and_never_exceed_the_limit() {
    let s = Server::start();
    let cl = s.client();
    // (permits inside, peak, tokens)
    let inside = Arc::new(Mutex::new((0u32, 0u32, Vec::new())));
    let threads: Vec<_> = [1u32, 1, 2, 2, 3, 4]
        .into_iter()
        .map(|permits| {
            let cl = cl.clone();
            let inside = inside.clone();
            std::thread::spawn(move || {
                for _ in 0..4 {
                    let g = Lock::semaphore(&cl, "pool", 4, permits)
                        .acquire(Some(Duration::from_secs(20)))
                        .unwrap()
                        .expect("granted within 20 s");
                    {
                        let mut st = inside.lock().unwrap();
                        st.0 += permits;
                        st.1 = st.1.max(st.0);
                        st.2.push(g.token());
                    }
                    sleep(Duration::from_millis(5));
                    inside.lock().unwrap().0 -= permits;
                    assert_eq!(g.release().unwrap(), 0);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut st = inside.lock().unwrap();
    assert!(st.1 <= 4, "{} permits held at once", st.1);
    st.2.sort_unstable();
    st.2.dedup();
    assert_eq!(st.2.len(), 24, "a token per holding");
    assert!(!s.has("pool"));
}

#[test]
fn keepalive_and_pubsub_paths() {
    let s = Server::start();
    let cl = s.client();
    let lock = Lock::semaphore(&cl, "ka", 1, 1)
        .lease(Duration::from_millis(300))
        .keepalive(true);
    let guard = lock.acquire(None).unwrap().unwrap();
    assert!(!guard.is_renewing(), "the server renews");
    sleep(Duration::from_millis(800));
    assert_eq!(used(&lock), 1, "renewed by the server past its lease");
    let waiter = Lock::semaphore(&cl, "ka", 1, 1);
    let t = std::thread::spawn(move || {
        waiter
            .acquire_via_pubsub(Some(Duration::from_secs(5)), Duration::from_secs(10))
            .map(|g| g.map(|g| g.token()))
    });
    wait_until(Duration::from_secs(5), || {
        let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("__rlock@0__:ka")
            .query(&mut s.conn())
            .unwrap();
        n[0].1 == 1
    });
    assert_eq!(stat(&mut s.conn(), "waiters"), 0, "no parked connection");
    let first = guard.token();
    assert_eq!(guard.release().unwrap(), 0);
    assert!(t.join().unwrap().unwrap().expect("granted") > first);
}
