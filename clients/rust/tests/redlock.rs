//! RedLock over 5 independent servers: quorum, validity, dead and frozen servers.

mod common;

use std::time::{Duration, Instant};

use common::*;
use rlock_client::RedLock;

const LEASE: Duration = Duration::from_secs(10);

fn five() -> Vec<Server> {
    (0..5).map(|_| Server::start()).collect()
}

fn redlock(servers: &[Server]) -> RedLock {
    let clients: Vec<_> = servers.iter().map(|s| s.client()).collect();
    RedLock::new(&clients, "res").lease(LEASE)
}

fn holders(servers: &[Server]) -> Vec<bool> {
    servers.iter().map(|s| s.has("res")).collect()
}

#[test]
fn all_grant_and_a_second_redlock_is_refused() {
    let s = five();
    let rl = redlock(&s);
    let start = Instant::now();
    let g = rl.try_acquire().unwrap().expect("all five grant");
    let elapsed = start.elapsed();
    assert_eq!(g.granted(), 5);
    assert!(g.validity() <= LEASE - rl.drift());
    assert!(g.validity() + elapsed + Duration::from_millis(1) >= LEASE - rl.drift());
    assert_eq!(holders(&s), [true; 5]);
    let other = redlock(&s);
    assert!(other.try_acquire().unwrap().is_none());
    assert_eq!(
        holders(&s),
        [true; 5],
        "the failed attempt released only its own"
    );
    assert_eq!(g.release(), 5);
    assert_eq!(holders(&s), [false; 5]);
    assert!(other.try_acquire().unwrap().is_some());
}

#[test]
fn acquires_with_two_killed_and_release_reaches_every_reachable_server() {
    let mut s = five();
    s[1].kill();
    s[3].kill();
    let rl = redlock(&s);
    let g = rl.try_acquire().unwrap().expect("3 of 5 is a quorum");
    assert_eq!(g.granted(), 3);
    assert_eq!(g.tokens()[1], None);
    assert_eq!(g.tokens()[3], None);
    assert_eq!(holders(&s), [true, false, true, false, true]);
    assert_eq!(g.release(), 3);
    assert_eq!(holders(&s), [false; 5]);
}

#[test]
fn fails_with_three_killed_and_leaves_no_holds() {
    let mut s = five();
    for i in [0, 2, 4] {
        s[i].kill();
    }
    let rl = redlock(&s);
    assert!(rl.try_acquire().unwrap().is_none());
    assert_eq!(holders(&s), [false; 5]);
    let start = Instant::now();
    assert!(rl
        .acquire(Some(Duration::from_millis(500)))
        .unwrap()
        .is_none());
    assert!(start.elapsed() >= Duration::from_millis(450));
    assert_eq!(holders(&s), [false; 5]);
}

#[test]
fn frozen_server_is_skipped_within_the_server_timeout() {
    let mut s = five();
    s[2].freeze();
    let rl = redlock(&s).server_timeout(Duration::from_millis(200));
    let start = Instant::now();
    let g = rl.try_acquire().unwrap().expect("4 of 5");
    let elapsed = start.elapsed();
    assert_eq!(g.granted(), 4);
    assert_eq!(g.tokens()[2], None);
    assert!(
        elapsed >= Duration::from_millis(190) && elapsed < Duration::from_millis(600),
        "{elapsed:?}"
    );
    // The validity shrank by the time spent on the frozen server.
    assert!(g.validity() <= LEASE - rl.drift() - Duration::from_millis(190));
    let start = Instant::now();
    assert_eq!(g.release(), 4);
    assert!(start.elapsed() < Duration::from_millis(600));
    assert_eq!(holders(&s), [false; 5]);
}

#[test]
fn validity_shrinks_with_elapsed_time() {
    let mut s = five();
    let fast = redlock(&s);
    let v1 = fast.try_acquire().unwrap().unwrap().validity();
    s[0].freeze();
    let slow = redlock(&s).server_timeout(Duration::from_millis(300));
    let v2 = slow.try_acquire().unwrap().unwrap().validity();
    assert!(v2 + Duration::from_millis(250) < v1, "{v2:?} vs {v1:?}");
    // The time spent eats a 250 ms lease: 4 grants are not enough, and the
    // answering servers give theirs back. (The frozen one is left out: a
    // command it got before freezing runs when it thaws; the lease bounds it.)
    let short = redlock(&s)
        .server_timeout(Duration::from_millis(300))
        .lease(Duration::from_millis(250));
    assert!(short.try_acquire().unwrap().is_none());
    assert_eq!(holders(&s), [false; 5]);
}

#[test]
fn extend_renews_on_a_quorum() {
    let mut s = five();
    let rl = redlock(&s).lease(Duration::from_millis(500));
    let mut g = rl.try_acquire().unwrap().unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(g.extend().unwrap());
    std::thread::sleep(Duration::from_millis(300)); // past the first lease
    assert_eq!(holders(&s), [true; 5]);
    drop(g);
    assert_eq!(holders(&s), [false; 5], "dropping the guard releases");
    let mut g = rl.try_acquire().unwrap().unwrap();
    for i in [0, 1, 2] {
        s[i].kill();
    }
    assert!(!g.extend().unwrap());
}

#[test]
fn a_server_listed_twice_is_refused() {
    // It would count twice towards the quorum: one live server of three
    // listed as a majority.
    let s = Server::start();
    let other_db = redis::Client::open(format!("redis://127.0.0.1:{}/1", s.port)).unwrap();
    for servers in [vec![s.client(), s.client()], vec![s.client(), other_db]] {
        let rl = RedLock::new(&servers, "res").lease(LEASE);
        let e = rl.try_acquire().err().expect("refused");
        assert!(e.to_string().contains("listed twice"), "{e}");
        assert!(!s.has("res"));
    }
}
