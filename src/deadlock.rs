//! Deadlock detection (`rlock.deadlock-check-ms`). Once a waiter has been
//! parked that long, the wait-for graph of every queue and holder on this
//! server is built (`lock::WaitFor`) and searched for a cycle through one of
//! its waits; on a cycle, the waiter on it that started waiting last is
//! answered `DEADLOCK wait-for cycle: a -> b -> a` and leaves its queues, so
//! the others can go on. Each waiter is checked once: a cycle it closes later
//! is found when the waiter that closes it comes due. Runs on the server cron,
//! on a master, only when some waiter came due, and at most once per
//! `deadlock-check-ms`: the graph is built over every queue and opens every
//! queued key (~2 µs a key), and with waiters arriving all the time some
//! waiter is due on every cron tick (up to 80 a second with `dynamic-hz`), so
//! building it each time kept the server busy most of the time with 15,000
//! queued keys. A waiter is checked between one and two periods after it parked.

use std::sync::atomic::{AtomicI64, Ordering};

use crate::blocking;
use crate::config;
use crate::ffi::{now_ms, select_db, Ctx, Key, OwnedStr};
use crate::lock::{Cycle, WaitFor};
use crate::stats;
use crate::store::lock_at;

/// When the graph was last built (unix ms).
static LAST_CHECK: AtomicI64 = AtomicI64::new(0);

pub fn on_cron(ctx: *mut Ctx) {
    let check_ms = config::deadlock_check_ms();
    if check_ms <= 0 || !blocking::any_queued() || !crate::role::is_master() {
        return;
    }
    let now = now_ms();
    if now.saturating_sub(LAST_CHECK.load(Ordering::Relaxed)) < check_ms {
        return;
    }
    let due = blocking::take_unchecked(now.saturating_sub(check_ms));
    if due.is_empty() {
        return;
    }
    LAST_CHECK.store(now, Ordering::Relaxed);
    let mut graph = wait_for_graph(ctx, now);
    for id in due {
        if let Some(cycle) = graph.cycle_through(id) {
            graph.remove_waiter(cycle.victim);
            stats::bump(&stats::DEADLOCKS, 1);
            blocking::fail(cycle.victim, &message(&cycle));
        }
    }
}

fn message(cycle: &Cycle) -> String {
    let owners: Vec<String> = cycle
        .owners
        .iter()
        .map(|o| String::from_utf8_lossy(o).into_owned())
        .collect();
    format!("DEADLOCK wait-for cycle: {}", owners.join(" -> "))
}

/// The first waiter of a key waits for its holders, every other waiter for
/// the one just ahead (see `lock::waitfor`); except that a multi-key waiter
/// does not wait on a key its owner holds (it is granted that key at once).
fn wait_for_graph(ctx: *mut Ctx, now: i64) -> WaitFor {
    let mut graph = WaitFor::default();
    for blocking::QueuedKey { db, key, waiters } in blocking::queued_waiters() {
        let holders = holders(ctx, db, &key, now);
        for (i, (id, owner)) in waiters.iter().enumerate() {
            if holders.contains(owner) {
                continue;
            }
            match i.checked_sub(1) {
                None => holders.iter().for_each(|h| graph.add(*id, owner, h)),
                Some(ahead) => graph.add(*id, owner, &waiters[ahead].1),
            }
        }
    }
    graph
}

/// Owners of the live holds of a lock key.
fn holders(ctx: *mut Ctx, db: i32, key: &[u8], now: i64) -> Vec<Vec<u8>> {
    if !select_db(ctx, db) {
        return Vec::new();
    }
    let name = OwnedStr::new(key);
    let key = Key::open(ctx, name.ptr(), false);
    match lock_at(&key) {
        Ok(Some(v)) => unsafe { v.state() }
            .iter()
            .filter(|h| h.deadline >= now)
            .map(|h| h.owner.to_vec())
            .collect(),
        _ => Vec::new(),
    }
}
