//! `CLIENT PAUSE WRITE` (also what Redis's `FAILOVER` does while the replica
//! catches up): Redis lets nothing change the dataset and aborts if anything
//! is propagated meanwhile. The module's own timers and hooks (lease ends,
//! hand-overs, KEEPALIVE renewals, the ends of closed connections' holdings)
//! wait for the pause to end, and the server lives through it.

mod common;

use std::thread::sleep;
use std::time::{Duration, Instant};

use common::*;

type Waiter = std::thread::JoinHandle<(redis::RedisResult<Value>, Duration)>;

/// Sets up everything the module would do on its own within the next 500 ms,
/// then pauses writes for a second. Returns the parked waiter and the
/// connection a KEEPALIVE holding is bound to.
fn work_falling_due_in_a_pause(master: &Server, c: &mut Connection) -> (Waiter, Connection) {
    // A KEEPALIVE holding renewed every 500 ms, and one whose connection closes.
    let mut bound = master.client();
    int(
        &mut bound,
        &["RLOCK.ACQUIRE", "ka", "o", "PX", "1500", "KEEPALIVE"],
    );
    let mut closing = master.client();
    int(
        &mut closing,
        &["RLOCK.ACQUIRE", "kc", "o", "PX", "60000", "KEEPALIVE"],
    );
    // A reader whose lease ends while another reads on.
    int(c, &["RWLOCK.ACQUIRE", "rw", "READ", "r1", "PX", "300"]);
    int(c, &["RWLOCK.ACQUIRE", "rw", "READ", "r2", "PX", "60000"]);
    // A lease that ends under a parked waiter.
    int(c, &["RLOCK.ACQUIRE", "k", "h", "PX", "300"]);
    let waiter = spawn_call(master, &["RLOCK.ACQUIRE", "k", "w", "BLOCK", "10000"]);
    wait_parked(c, 1);
    pause_writes(c, 1000);
    drop(closing);
    (waiter, bound)
}

#[test]
fn the_module_changes_nothing_while_writes_are_paused() {
    let master = Server::start();
    let replica = Server::start();
    replica.replicate_from(&master);
    let mut c = master.client();
    let (waiter, _bound) = work_falling_due_in_a_pause(&master, &mut c);
    let paused_at = Instant::now();
    let renewals = stat(&mut c, "keepalive_renewals");
    sleep(Duration::from_millis(600));
    // Past every short lease, still paused: nothing ended, nobody was served,
    // and the master is alive.
    assert_eq!(
        call(&mut c, &["PING"]).unwrap(),
        Value::SimpleString("PONG".into())
    );
    assert_eq!(stat(&mut c, "lease_expirations"), 0);
    assert_eq!(stat(&mut c, "waiters"), 1);
    assert_eq!(int(&mut c, &["EXISTS", "kc"]), 1);
    assert_eq!(stat(&mut c, "keepalive_renewals"), renewals);
    // Once the pause is over, all of it happens.
    let (reply, _) = waiter.join().unwrap();
    assert!(matches!(reply.unwrap(), Value::Int(_)));
    assert!(paused_at.elapsed() >= Duration::from_millis(900));
    wait_until(Duration::from_secs(3), || {
        int(&mut c, &["EXISTS", "kc"]) == 0
    });
    let info = info_map(&mut c, &["RWLOCK.INFO", "rw"]).unwrap();
    assert_eq!(as_int(&field(&info, "reader_count")), 1);
    // The KEEPALIVE holding is renewed again after the pause: alive past
    // the lease it had when the pause began.
    sleep(Duration::from_millis(800));
    assert!(stat(&mut c, "keepalive_renewals") > renewals);
    assert!(info_map(&mut c, &["RLOCK.INFO", "ka"]).is_some());
    let acked: i64 = cmd("WAIT").arg(1).arg(2000).query(&mut c).unwrap();
    assert_eq!(acked, 1);
    let mut r = replica.client();
    assert_eq!(digest(&mut c), digest(&mut r));
}

/// With no replica nothing is propagated, but a key past its TTL reads as
/// absent during a pause while it stays in place: a hand-over then would
/// write a new value over it.
#[test]
fn a_lease_ending_under_a_waiter_in_a_pause_with_no_replica() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "k", "h", "PX", "200"]);
    let w = spawn_call(&s, &["RLOCK.ACQUIRE", "k", "w", "BLOCK", "10000"]);
    wait_parked(&mut c, 1);
    pause_writes(&mut c, 700);
    let (reply, waited) = w.join().unwrap();
    assert!(matches!(reply.unwrap(), Value::Int(_)));
    assert!(waited >= Duration::from_millis(600), "{waited:?}");
    let info = info_map(&mut c, &["RLOCK.INFO", "k"]).unwrap();
    assert_eq!(as_string(&field(&info, "owner")), "w");
}
