//! Lock, fair lock and read-write lock against a real server.

mod common;

use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;
use redis::Value;
use rlock_client::{info_field, Error, Lock, ReadWriteLock};

fn int(v: Option<&Value>) -> i64 {
    match v {
        Some(Value::Int(i)) => *i,
        other => panic!("not an integer: {other:?}"),
    }
}

fn text(v: Option<&Value>) -> String {
    redis::from_redis_value(v.expect("field")).unwrap()
}

#[test]
fn guard_acquires_renews_and_releases_on_drop() {
    let s = Server::start();
    let lock = Lock::new(&s.client(), "g").lease(Duration::from_secs(5));
    {
        let guard = lock.acquire(None).unwrap().expect("a free lock is granted");
        assert!(guard.token() > 0);
        assert!(guard.is_renewing());
        let info = lock.info().unwrap().expect("held");
        assert_eq!(text(info_field(&info, "owner")), lock.owner_name());
        assert_eq!(int(info_field(&info, "token")), guard.token());
        // Reentrant: a second guard of the same owner, same token, two holds.
        let again = lock.try_acquire().unwrap().expect("reentrant");
        assert_eq!(again.token(), guard.token());
        assert_eq!(again.release().unwrap(), 1);
    }
    assert!(!s.has("g"), "dropping the guard releases");
}

#[test]
fn busy_lock_try_is_none_and_block_times_out_with_none() {
    let s = Server::start();
    let cl = s.client();
    let _held = Lock::new(&cl, "busy").acquire(None).unwrap().unwrap();
    let other = Lock::new(&cl, "busy");
    assert!(other.try_acquire().unwrap().is_none());
    let start = Instant::now();
    assert!(other
        .acquire(Some(Duration::from_millis(200)))
        .unwrap()
        .is_none());
    assert!(start.elapsed() >= Duration::from_millis(190));
    assert_eq!(stat(&mut s.conn(), "waiters"), 0);
}

#[test]
fn waiter_is_handed_the_lock_with_a_larger_token() {
    let s = Server::start();
    let cl = s.client();
    let holder = Lock::new(&cl, "h").acquire(None).unwrap().unwrap();
    let first = holder.token();
    let waiter = Lock::new(&cl, "h");
    let t = std::thread::spawn(move || {
        waiter
            .acquire(Some(Duration::from_secs(5)))
            .map(|g| g.map(|g| g.token()))
    });
    wait_until(Duration::from_secs(5), || {
        stat(&mut s.conn(), "waiters") == 1
    });
    assert_eq!(holder.release().unwrap(), 0);
    let second = t.join().unwrap().unwrap().expect("handed over");
    assert!(second > first);
}

#[test]
fn renewal_keeps_a_300ms_lease_alive_for_2s() {
    let s = Server::start();
    let mut c = s.conn();
    let lock = Lock::new(&s.client(), "r").lease(Duration::from_millis(300));
    let guard = lock.acquire(None).unwrap().unwrap();
    let before = renew_calls(&mut c);
    let end = Instant::now() + Duration::from_secs(2);
    while Instant::now() < end {
        let info = lock
            .info()
            .unwrap()
            .expect("the lease ran out despite renewal");
        assert_eq!(int(info_field(&info, "token")), guard.token());
        sleep(Duration::from_millis(50));
    }
    assert!(renew_calls(&mut c) - before >= 5);
    assert!(!guard.is_lost());
    assert!(Lock::new(&s.client(), "r").try_acquire().unwrap().is_none());
    assert_eq!(guard.release().unwrap(), 0);
    let calls = renew_calls(&mut c);
    sleep(Duration::from_millis(300));
    assert_eq!(renew_calls(&mut c), calls, "renewal went on after release");
}

#[test]
fn lost_lock_is_reported() {
    let s = Server::start();
    let reports = Arc::new(Mutex::new(Vec::<String>::new()));
    let r2 = reports.clone();
    let lock = Lock::new(&s.client(), "lost")
        .lease(Duration::from_millis(300))
        .on_lost(move |why| r2.lock().unwrap().push(why.to_string()));
    let guard = lock.acquire(None).unwrap().unwrap();
    let forced: i64 = redis::cmd("RLOCK.FORCERELEASE")
        .arg("lost")
        .query(&mut s.conn())
        .unwrap();
    assert_eq!(forced, 1);
    wait_until(Duration::from_secs(2), || guard.is_lost());
    assert!(matches!(guard.check(), Err(Error::Lost(_))));
    assert_eq!(reports.lock().unwrap().len(), 1);
    assert!(reports.lock().unwrap()[0].contains("NOTOWNER"));
    // The renewal thread ends after it reported the loss.
    wait_until(Duration::from_secs(2), || !guard.is_renewing());
    assert!(matches!(guard.release(), Err(Error::Lost(_))));
}

#[test]
fn lost_when_no_renewal_gets_through_for_a_lease() {
    let mut s = Server::start();
    let lock = Lock::new(&s.client(), "gone").lease(Duration::from_millis(300));
    let guard = lock.acquire(None).unwrap().unwrap();
    s.kill();
    wait_until(Duration::from_secs(3), || guard.is_lost());
}

#[test]
fn pubsub_path_waits_without_a_parked_connection() {
    let s = Server::start();
    let cl = s.client();
    let holder = Lock::new(&cl, "ps").acquire(None).unwrap().unwrap();
    let first = holder.token();
    let waiter = Lock::new(&cl, "ps");
    let t = std::thread::spawn(move || {
        waiter
            .acquire_via_pubsub(Some(Duration::from_secs(5)), Duration::from_secs(10))
            .map(|g| g.map(|g| g.token()))
    });
    let mut c = s.conn();
    wait_until(Duration::from_secs(5), || {
        let n: Vec<(String, i64)> = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg("__rlock@0__:ps")
            .query(&mut c)
            .unwrap();
        n[0].1 == 1
    });
    sleep(Duration::from_millis(100));
    assert_eq!(stat(&mut c, "waiters"), 0, "the pub/sub path must not park");
    let start = Instant::now();
    drop(holder);
    let token = t
        .join()
        .unwrap()
        .unwrap()
        .expect("granted after the release");
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "the message, not the poll"
    );
    assert!(token > first);
}

#[test]
fn pubsub_path_retries_at_the_lease_end() {
    let s = Server::start();
    let mut c = s.conn();
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("rlock.notify-channel")
        .arg("no")
        .query(&mut c)
        .unwrap();
    // A holder that never renews nor releases (raw command, no guard).
    let _: i64 = redis::cmd("RLOCK.ACQUIRE")
        .arg("quiet")
        .arg("gone")
        .arg("PX")
        .arg(400)
        .query(&mut c)
        .unwrap();
    let start = Instant::now();
    let guard = Lock::new(&s.client(), "quiet")
        .acquire_via_pubsub(Some(Duration::from_secs(5)), Duration::from_secs(10))
        .unwrap()
        .expect("granted at the end of the holder's lease");
    let waited = start.elapsed();
    assert!(
        waited > Duration::from_millis(300) && waited < Duration::from_millis(1500),
        "{waited:?}"
    );
    drop(guard);
}

#[test]
fn pubsub_path_times_out_with_none() {
    let s = Server::start();
    let cl = s.client();
    let _held = Lock::new(&cl, "pst").acquire(None).unwrap().unwrap();
    let start = Instant::now();
    let got = Lock::new(&cl, "pst")
        .acquire_via_pubsub(Some(Duration::from_millis(300)), Duration::from_secs(1))
        .unwrap();
    assert!(got.is_none());
    assert!(start.elapsed() >= Duration::from_millis(290));
}

#[test]
fn fair_lock_serves_parked_waiters_in_arrival_order() {
    let s = Server::start();
    let cl = s.client();
    let holder = Lock::fair(&cl, "fair").acquire(None).unwrap().unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for i in 0..3 {
        let lock = Lock::fair(&cl, "fair").owner(format!("w{i}"));
        let order = order.clone();
        threads.push(std::thread::spawn(move || {
            let g = lock.acquire(Some(Duration::from_secs(5))).unwrap().unwrap();
            order.lock().unwrap().push(lock.owner_name().to_string());
            drop(g);
        }));
        wait_until(Duration::from_secs(5), || {
            stat(&mut s.conn(), "waiters") == i + 1
        });
    }
    let info = Lock::fair(&cl, "fair").info().unwrap().unwrap();
    assert_eq!(text(info_field(&info, "kind")), "fairlock");
    drop(holder);
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), ["w0", "w1", "w2"]);
}

#[test]
fn read_write_lock_views() {
    let s = Server::start();
    let cl = s.client();
    let a = ReadWriteLock::new(&cl, "rw");
    let b = ReadWriteLock::new(&cl, "rw");
    let ra = a.read().try_acquire().unwrap().expect("shared");
    let rb = b.read().try_acquire().unwrap().expect("shared");
    assert!(ReadWriteLock::new(&cl, "rw")
        .write()
        .try_acquire()
        .unwrap()
        .is_none());
    // Upgrading would deadlock: refused at once, even with a wait.
    let e = a.write().acquire(Some(Duration::from_secs(1))).unwrap_err();
    assert!(matches!(e, Error::Redis(_)), "{e}");
    drop((ra, rb));
    let w = a.write().try_acquire().unwrap().expect("free");
    assert!(b.read().try_acquire().unwrap().is_none());
    // The writer may read too; releasing WRITE then downgrades.
    let r = a.read().try_acquire().unwrap().expect("writer reads");
    assert_eq!(r.token(), w.token());
    assert_eq!(w.release().unwrap(), 0);
    let info = a.read().info().unwrap().unwrap();
    assert_eq!(text(info_field(&info, "mode")), "read");
    let rb = b
        .read()
        .try_acquire()
        .unwrap()
        .expect("downgraded: readers enter");
    drop((r, rb));
    assert!(!s.has("rw"));
}

#[test]
fn tokens_increase_and_threads_never_overlap() {
    let s = Server::start();
    let cl = s.client();
    let inside = Arc::new(Mutex::new((0, 0, Vec::new())));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let cl = cl.clone();
            let inside = inside.clone();
            std::thread::spawn(move || {
                for _ in 0..5 {
                    let g = Lock::new(&cl, "c")
                        .acquire(Some(Duration::from_secs(10)))
                        .unwrap()
                        .unwrap();
                    {
                        let mut st = inside.lock().unwrap();
                        st.0 += 1;
                        st.1 = st.1.max(st.0);
                        st.2.push(g.token());
                    }
                    sleep(Duration::from_millis(5));
                    inside.lock().unwrap().0 -= 1;
                    drop(g);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let st = inside.lock().unwrap();
    assert_eq!(st.1, 1, "two holders at once");
    assert_eq!(st.2.len(), 20);
    assert!(st.2.windows(2).all(|w| w[0] < w[1]), "{:?}", st.2);
}
