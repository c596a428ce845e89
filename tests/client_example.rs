//! The Rust client example (examples/rust_client.rs) against a real server:
//! the module is compiled into this test, so no cargo is run from it.

mod common;

#[allow(dead_code)] // `main` and a few builder methods are for the example binary
#[path = "../examples/rust_client.rs"]
mod rust_client;

use std::sync::{Arc, Mutex};
use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;
use rust_client::{Kind, Lock, Mode};

fn client(s: &Server) -> redis::Client {
    redis::Client::open(format!("redis://127.0.0.1:{}/", s.port)).unwrap()
}

fn renew_calls(c: &mut Connection) -> i64 {
    let stats: String = cmd("INFO").arg("commandstats").query(c).unwrap();
    stats
        .lines()
        .find_map(|l| l.strip_prefix("cmdstat_rlock.renew:calls="))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().unwrap())
}

#[test]
fn guard_acquires_and_releases_on_drop() {
    let s = Server::start();
    let mut c = s.client();
    let lock = Lock::new(&client(&s), "g", "owner-1");
    {
        let guard = lock.acquire(None).unwrap().expect("free lock is granted");
        assert!(guard.token() > 0);
        assert!(guard.is_renewing());
        let info = info_map(&mut c, &["RLOCK.INFO", "g"]).unwrap();
        assert_eq!(as_string(&field(&info, "owner")), "owner-1");
        assert_eq!(as_int(&field(&info, "token")), guard.token());
        // Reentrant: a second guard is a second hold with the same token.
        let again = lock.try_acquire().unwrap().expect("reentrant");
        assert_eq!(again.token(), guard.token());
        assert_eq!(again.release().unwrap(), 1);
        // Another owner is refused while it is held.
        let other = Lock::new(&client(&s), "g", "owner-2");
        assert!(other.try_acquire().unwrap().is_none());
        let start = Instant::now();
        assert!(other
            .acquire(Some(Duration::from_millis(150)))
            .unwrap()
            .is_none());
        assert!(start.elapsed() >= Duration::from_millis(140));
    }
    assert_eq!(int(&mut c, &["EXISTS", "g"]), 0);
}

#[test]
fn renewal_keeps_a_short_lease_alive_and_stops_on_drop() {
    let s = Server::start();
    let mut c = s.client();
    let lock = Lock::new(&client(&s), "r", "renewer").lease(Duration::from_millis(300));
    let guard = lock.acquire(None).unwrap().unwrap();
    sleep(Duration::from_millis(1300));
    let info = info_map(&mut c, &["RLOCK.INFO", "r"]).expect("still held after 1.3 s");
    assert_eq!(as_string(&field(&info, "owner")), "renewer");
    assert_eq!(as_int(&field(&info, "token")), guard.token());
    assert!(!guard.is_lost());
    assert!(renew_calls(&mut c) >= 3);
    assert_eq!(guard.release().unwrap(), 0);
    // The thread was joined by release: no renewal after it.
    let before = renew_calls(&mut c);
    sleep(Duration::from_millis(400));
    assert_eq!(renew_calls(&mut c), before);
    assert_eq!(int(&mut c, &["EXISTS", "r"]), 0);
}

#[test]
fn a_lost_lock_is_noticed_by_the_renewal_thread() {
    let s = Server::start();
    let mut c = s.client();
    let lock = Lock::new(&client(&s), "l", "loser").lease(Duration::from_millis(150));
    let guard = lock.acquire(None).unwrap().unwrap();
    int(&mut c, &["RLOCK.FORCERELEASE", "l"]);
    wait_until(Duration::from_secs(2), || guard.is_lost());
    wait_until(Duration::from_secs(2), || !guard.is_renewing());
    let err = guard.release().unwrap_err();
    assert_eq!(err.code(), Some("NOTOWNER"));
}

#[test]
fn two_threads_contend_and_both_succeed_in_turn() {
    let s = Server::start();
    let spans = Arc::new(Mutex::new(Vec::new()));
    let threads: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|owner| {
            let lock = Lock::new(&client(&s), "shared", owner);
            let spans = spans.clone();
            std::thread::spawn(move || {
                let guard = lock.acquire(Some(Duration::from_secs(5))).unwrap().unwrap();
                let begin = Instant::now();
                sleep(Duration::from_millis(200));
                spans
                    .lock()
                    .unwrap()
                    .push((begin, Instant::now(), owner, guard.token()));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let mut spans = spans.lock().unwrap().clone();
    spans.sort();
    assert_eq!(spans.len(), 2);
    let mut owners: Vec<_> = spans.iter().map(|s| s.2).collect();
    owners.sort();
    assert_eq!(owners, ["a", "b"]);
    assert!(spans[0].1 <= spans[1].0, "holds overlapped");
    assert!(spans[1].3 > spans[0].3, "tokens must increase");
    let mut c = s.client();
    assert_eq!(int(&mut c, &["EXISTS", "shared"]), 0);
}

#[test]
fn pubsub_path_acquires_after_the_holder_releases() {
    let s = Server::start();
    let mut c = s.client();
    let holder = Lock::new(&client(&s), "ps", "holder")
        .try_acquire()
        .unwrap()
        .unwrap();
    let waiter = Lock::new(&client(&s), "ps", "subscriber");
    let handle = std::thread::spawn(move || {
        let start = Instant::now();
        let guard = waiter
            .acquire_via_pubsub(Some(Duration::from_secs(5)), Duration::from_secs(10))
            .unwrap();
        (guard.map(|g| g.token()), start.elapsed())
    });
    sleep(Duration::from_millis(200));
    assert!(!handle.is_finished(), "acquired while held");
    // Nobody is parked on the server: the waiter only subscribed.
    assert_eq!(stat(&mut c, "waiters"), 0);
    let holder_token = holder.token();
    drop(holder);
    let (token, waited) = handle.join().unwrap();
    assert!(token.expect("granted after the release") > holder_token);
    // Woken by the message, not by the 10 s safety poll.
    assert!(waited < Duration::from_secs(2), "{waited:?}");
}

#[test]
fn pubsub_path_times_out() {
    let s = Server::start();
    let _holder = Lock::new(&client(&s), "pst", "holder")
        .try_acquire()
        .unwrap()
        .unwrap();
    let waiter = Lock::new(&client(&s), "pst", "subscriber");
    let start = Instant::now();
    let got = waiter
        .acquire_via_pubsub(Some(Duration::from_millis(300)), Duration::from_secs(1))
        .unwrap();
    assert!(got.is_none());
    assert!(start.elapsed() >= Duration::from_millis(290));
}

#[test]
fn rwlock_guards() {
    let s = Server::start();
    let cl = client(&s);
    let r1 = Lock::new(&cl, "rw", "r1")
        .mode(Mode::Read)
        .try_acquire()
        .unwrap();
    let r2 = Lock::new(&cl, "rw", "r2")
        .mode(Mode::Read)
        .try_acquire()
        .unwrap();
    assert!(r1.is_some() && r2.is_some());
    let writer = Lock::new(&cl, "rw", "w").kind(Kind::ReadWrite);
    assert!(writer.try_acquire().unwrap().is_none());
    drop((r1, r2));
    let w = writer
        .try_acquire()
        .unwrap()
        .expect("free after the readers left");
    assert_eq!(w.release().unwrap(), 0);
    let fair = Lock::new(&cl, "fair", "f").kind(Kind::Fair);
    let g = fair.try_acquire().unwrap().unwrap();
    let mut c = s.client();
    let info = info_map(&mut c, &["FAIRLOCK.INFO", "fair"]).unwrap();
    assert_eq!(as_string(&field(&info, "kind")), "fairlock");
    drop(g);
}

#[test]
fn the_example_main_runs_against_a_server() {
    let s = Server::start();
    let log = rust_client::demo(s.port).unwrap();
    let text = log.join("\n");
    assert!(
        text.contains("still held after 700 ms with a 300 ms lease: true"),
        "{text}"
    );
    assert!(text.contains("released on drop: true"), "{text}");
    assert!(text.contains("worker-a held demo:shared"), "{text}");
    assert!(text.contains("worker-b held demo:shared"), "{text}");
    assert!(
        text.contains("pub/sub waiter acquired after release: true"),
        "{text}"
    );
}
