//! (f) Expiry storm: many leases that end in the same millisecond, some with
//! a waiter parked behind them, against Redis's own expiry of as many
//! `SET ... PX` keys with the same deadline. A separate connection PINGs in a
//! tight loop throughout: its worst round trip is how long the server left
//! its clients unanswered.

use std::time::{Duration, Instant};

use crate::locks::{now_us, owner, Family, Impl, Lock};
use crate::readers::{collect_replies, park_clients};
use crate::scale::{load_locks, native_waiting, wait_until};
use crate::server::{Pinger, Server, Stall};
use crate::{cmd, Env};

pub const NATIVE: Lock = Lock::new(Impl::Native, Family::Reentrant);

/// Storms per side, the sides taking turns. A round's worst PING is one
/// sample: one preemption of the server on a 2-core machine raises it by
/// several ms (the "quiet" column shows the machine's own), so the targets take
/// the median of the rounds.
pub const ROUNDS: usize = 3;

pub struct Storm {
    pub lock: Lock,
    /// Which of the `ROUNDS` storms of its side this was (from 1).
    pub round: usize,
    pub leases: usize,
    pub waiters: usize,
    /// Deadlines actually set (PEXPIRETIME of a sample of keys), relative to
    /// the common target, ms.
    pub spread_ms: (i64, i64),
    pub sampled: usize,
    /// PINGs in flight from the target deadline until all leases ended.
    pub stall: Stall,
    /// Worst PING in the second before the deadline (the machine's own noise).
    pub quiet: Stall,
    /// From the target deadline until only the waiters' keys are left.
    pub all_ended_ms: Option<f64>,
    /// From the target deadline until the last waiter's grant was read (as
    /// it came).
    pub waiters_served_ms: Option<f64>,
    pub served: usize,
    /// INFO rlock `rlock_lease_expirations` afterwards (native).
    pub expirations: Option<i64>,
}

/// Unix ms -> an `Instant` on this process's monotonic clock.
fn instant_of(unix_ms: i64) -> Instant {
    let (now, unix_now) = (Instant::now(), now_us());
    let d = unix_ms * 1000 - unix_now;
    if d >= 0 {
        now + Duration::from_micros(d as u64)
    } else {
        now - Duration::from_micros((-d) as u64)
    }
}

/// `n` leases taken (2 connections, pipelined 128 deep: short queues keep the
/// deadlines close) with `PX` computed
/// per call as the common target deadline minus the client's clock, so that
/// all end in the same millisecond up to the time a batch waits in the
/// pipeline; `waiters` of the keys get one parked `BLOCK 0` waiter each.
pub fn run(env: &Env, lock: Lock, n: usize, waiters: usize, round: usize) -> Storm {
    // The target deadline: far enough out for the load (~300k calls/s seen
    // here; planned for half of that, the machine being shared) plus the
    // waiters' connections and 1 s of quiet pings; if the load was slower
    // than that, again with twice the time.
    let mut lead_ms = 2_500 + (n as i64) / 150;
    loop {
        if let Some(s) = try_run(env, lock, n, waiters, round, lead_ms) {
            return s;
        }
        crate::progress(&format!(
            "  loading took over {lead_ms} ms: again, with more time"
        ));
        lead_ms *= 2;
    }
}

fn try_run(
    env: &Env,
    lock: Lock,
    n: usize,
    waiters: usize,
    round: usize,
    lead_ms: i64,
) -> Option<Storm> {
    let module = lock.with_module().then_some(env.module.as_path());
    let srv = Server::start_with(module, Some(waiters + 64), false);
    env.scripts.load(&mut srv.conn());
    let target = now_us() / 1000 + lead_ms;
    let t0 = Instant::now();
    load_locks(env, &srv, lock, "storm:", (n, 2, 128), move |_| {
        (target - now_us() / 1000).max(1) as u64
    });
    crate::progress(&format!(
        "  {}: {n} leases loaded in {:.1} s",
        lock.label(),
        t0.elapsed().as_secs_f64()
    ));
    if Instant::now() + Duration::from_millis(1_500) > instant_of(target) {
        return None;
    }
    let mut c = srv.conn();
    let step = (n / 1000).max(1);
    let mut lo = i64::MAX;
    let mut hi = i64::MIN;
    let mut sampled = 0;
    for i in (0..n).step_by(step) {
        let d = cmd!(c; "PEXPIRETIME", format!("storm:{i:08}"))
            .expect("PEXPIRETIME")
            .int()
            .expect("deadline");
        assert!(d > 0, "storm:{i:08} has no deadline ({d})");
        lo = lo.min(d - target);
        hi = hi.max(d - target);
        sampled += 1;
    }
    let mut parked = park_clients(srv.port, waiters, |w, i| {
        lock.queue_acquire(
            w,
            &env.scripts,
            &format!("storm:{i:08}"),
            &owner(300 + i as u64, 1),
            30_000,
            Some(0),
        )
    });
    if waiters > 0 {
        wait_until(
            &format!("{waiters} waiters"),
            Duration::from_secs(60),
            || native_waiting(&srv) == waiters as i64,
        );
    }
    let deadline = instant_of(target);
    if Instant::now() + Duration::from_millis(1_050) > deadline {
        return None;
    }
    std::thread::sleep(
        (deadline - Duration::from_secs(1)).saturating_duration_since(Instant::now()),
    );
    let pinger = Pinger::start(srv.port);
    let give_up = deadline + Duration::from_secs(30);
    // The waiters' replies, timed as they come (a thread asleep in poll()
    // between them), while this one polls the key count every millisecond.
    let collector = std::thread::spawn(move || {
        let replies = collect_replies(
            &mut parked,
            give_up.saturating_duration_since(Instant::now()),
        );
        (parked, replies)
    });
    std::thread::sleep(deadline.saturating_duration_since(Instant::now()));
    let mut ended_at = None;
    while Instant::now() < give_up {
        let keys = cmd!(c; "DBSIZE").expect("DBSIZE").int().expect("DBSIZE");
        if keys as usize <= waiters {
            ended_at = Some(Instant::now());
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    let (parked, replies) = collector.join().expect("reply collector");
    let served: Vec<Instant> = replies
        .iter()
        .flatten()
        .filter(|(_, v)| lock.acquire_result(v) == Ok(None))
        .map(|(t, _)| *t)
        .collect();
    let end = ended_at
        .unwrap_or(give_up)
        .max(served.iter().copied().max().unwrap_or(deadline));
    std::thread::sleep(Duration::from_millis(20));
    let log = pinger.stop();
    let ms = |t: Instant| t.saturating_duration_since(deadline).as_secs_f64() * 1000.0;
    let expirations =
        (lock.imp == Impl::Native).then(|| srv.info_i64("rlock", "rlock_lease_expirations"));
    let out = Some(Storm {
        lock,
        round,
        leases: n,
        waiters,
        spread_ms: (lo, hi),
        sampled,
        stall: log.window(deadline, end),
        quiet: log.within(
            deadline - Duration::from_secs(1),
            deadline - Duration::from_millis(50),
        ),
        all_ended_ms: ended_at.map(ms),
        waiters_served_ms: (served.len() == waiters && waiters > 0)
            .then(|| ms(served.iter().copied().max().unwrap_or(deadline))),
        served: served.len(),
        expirations,
    });
    drop(srv);
    drop(parked);
    out
}
