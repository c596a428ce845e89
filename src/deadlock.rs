//! Deadlock detection (`rlock.deadlock-check-ms`). Once a waiter has been
//! parked that long it is checked once: if one of its waits lies on a cycle
//! of the wait-for graph (`lock::WaitFor`), the waiter on that cycle that
//! started waiting last is answered `DEADLOCK wait-for cycle: a -> b -> a`
//! and leaves its queues, so the others can go on. A cycle it closes later is
//! found when the waiter that closes it comes due. A key's waiters are
//! checked again when its value is replaced under them (`SWAPDB`, another
//! lock renamed or restored over the key: `blocking::recheck_queue`), since
//! they then wait for other holders, which closes cycles no new wait closed.
//!
//! Runs on the server cron, on a master. A pass starts at most once per
//! `deadlock-check-ms`, when some waiter came due, so a waiter is checked
//! between one and two periods after it parked. A pass costs what it must
//! examine, not the whole server: the graph is built from the due waiters'
//! owners only, following their waits to the owners they wait for and those
//! owners' own parked waits (`blocking::parked_waits`), opening only the keys
//! met on the way.
//!
//! A pass is cut into slices of about `SLICE_BUDGET` of building per cron
//! tick, as Redis's active expiry is: a burst of waiters that came due
//! together is checked over several ticks. Each slice builds its graph anew
//! and answers within its tick, with nothing else running, so every cycle
//! reported is real at that moment and every cycle present then is found.
//! A waiter already in the slice's graph (reached from a newer one, e.g. in
//! the same queue) costs nothing to add, so a long queue is checked in the
//! slice that builds it, not rebuilt once per slice.
//!
//! What one waiter's check needs is never cut: the last waiter of a long
//! queue reaches the whole queue. Such a queue is cheap, though: the owners
//! in it that wait nowhere else are read in one go (`blocking::parked_waits`)
//! and contracted into one run (`WaitFor::queue_run`), of which only a few
//! members become nodes, so the whole queue costs its reading (one lookup
//! per waiter). Measured (README "Deadlock detection"): 19,000 waiters in
//! one queue take ~10-14 ms per pass, the check of each waiter included
//! (~5-8 ms of it reading the queue; the whole-graph pass took 16-31 ms);
//! 15,000 waiters on as many keys, which cost a 30-70 ms stall per pass when
//! the whole graph was built, cost ~1 ms per tick.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Duration, Instant};

use crate::blocking::{self, Unchecked};
use crate::config;
use crate::ffi::{now_ms, select_db, Ctx, Key, OwnedStr};
use crate::lock::{Ahead, Cycle, Node, Owner, WaitFor};
use crate::stats;
use crate::store::lock_at;

/// Building time one cron tick spends before it stops taking due waiters
/// (Redis's fast expire cycle takes 1 ms). One waiter's graph is always
/// built whole: a check needs everything its waits reach.
const SLICE_BUDGET: Duration = Duration::from_millis(1);

/// When the current pass started (unix ms).
static LAST_CHECK: AtomicI64 = AtomicI64::new(0);
/// The pass under way checks the waiters parked at or before this (unix
/// ms); `NO_PASS` when none is.
static PASS_CUTOFF: AtomicI64 = AtomicI64::new(NO_PASS);
const NO_PASS: i64 = i64::MIN;

pub fn on_cron(ctx: *mut Ctx) {
    let check_ms = config::deadlock_check_ms();
    if check_ms <= 0 || !blocking::any_queued() || !crate::role::is_master() {
        PASS_CUTOFF.store(NO_PASS, Ordering::Relaxed);
        return;
    }
    let now = now_ms();
    let Some(cutoff) = pass_cutoff(now, check_ms) else {
        return;
    };
    check_slice(ctx, now, cutoff);
    let done = blocking::newest_unchecked(cutoff).is_none();
    if done {
        PASS_CUTOFF.store(NO_PASS, Ordering::Relaxed);
    }
}

/// The cutoff of the pass under way, or of a new one if it is time for one
/// and some waiter is due.
fn pass_cutoff(now: i64, check_ms: i64) -> Option<i64> {
    let cutoff = PASS_CUTOFF.load(Ordering::Relaxed);
    if cutoff != NO_PASS {
        return Some(cutoff);
    }
    if now.saturating_sub(LAST_CHECK.load(Ordering::Relaxed)) < check_ms {
        return None;
    }
    let cutoff = now.saturating_sub(check_ms);
    blocking::newest_unchecked(cutoff)?;
    LAST_CHECK.store(now, Ordering::Relaxed);
    PASS_CUTOFF.store(cutoff, Ordering::Relaxed);
    Some(cutoff)
}

/// Takes due waiters, newest first, until the budget is spent, builds the
/// graph their waits reach, and answers the cycles through them.
fn check_slice(ctx: *mut Ctx, now: i64, cutoff: i64) {
    let started = Instant::now();
    let mut slice = Slice::new(ctx, now);
    let mut due = Vec::new();
    while let Some(waiter) = blocking::take_newest_unchecked(cutoff) {
        let in_graph = slice.graph.has(waiter.1);
        if !in_graph && !due.is_empty() && started.elapsed() >= SLICE_BUDGET {
            blocking::put_back_unchecked(waiter);
            break;
        }
        if !in_graph {
            slice.grow_from(waiter.1);
        }
        due.push(waiter);
    }
    slice.answer_cycles(due);
}

/// The graph one tick builds, and what it met on the way.
struct Slice {
    ctx: *mut Ctx,
    now: i64,
    graph: WaitFor,
    /// (db, key) -> nodes of the owners of its live holds, each key opened
    /// once.
    holders: HashMap<(i32, Vec<u8>), Vec<Node>>,
    /// Waiters queued on a key their owner holds (they have no edge there).
    on_held_keys: HashSet<u64>,
}

impl Slice {
    fn new(ctx: *mut Ctx, now: i64) -> Slice {
        Slice {
            ctx,
            now,
            graph: WaitFor::default(),
            holders: HashMap::new(),
            on_held_keys: HashSet::new(),
        }
    }

    /// Adds the waits of `id`'s owner and everything they reach.
    fn grow_from(&mut self, id: u64) {
        let Some(owner) = blocking::owner_of(id) else {
            return;
        };
        let Slice {
            ctx,
            now,
            graph,
            holders,
            on_held_keys,
        } = self;
        let mut to = Vec::new();
        graph.grow(&owner, &mut |graph, node| {
            expand(*ctx, *now, graph, holders, on_held_keys, node, &mut to)
        });
    }

    /// Checks each due waiter; answers the victim of each cycle found.
    ///
    /// A victim leaves its queues as it is answered, and whoever queued
    /// behind it then waits for whom it waited for: reachability only
    /// shrinks, within the victim's strongly connected component, so the
    /// graph still answers exactly for every other component. Waiters of the
    /// victim's component are checked again on the next tick, on a fresh
    /// graph. When the victim waited on a key its owner holds, the rest of
    /// the slice waits too: the waiter behind it waited past it already
    /// (`lock::direct_waits`), so this is only a precaution.
    fn answer_cycles(&self, due: Vec<Unchecked>) {
        let mut changed: HashSet<u32> = HashSet::new();
        let mut all_changed = false;
        for waiter in due {
            let component = self.graph.component_of(waiter.1);
            if all_changed || component.is_some_and(|c| changed.contains(&c)) {
                blocking::put_back_unchecked(waiter);
                continue;
            }
            let Some(cycle) = self.graph.cycle_through(waiter.1) else {
                continue;
            };
            changed.extend(component);
            all_changed |= self.on_held_keys.contains(&cycle.victim);
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

/// Adds the parked waits of `node`'s owner, each to whom it waits for on
/// each of its keys (`direct_waits`), and with them those of the owners met
/// ahead in its queues that wait nowhere else (`WaitFor::queue_run`).
fn expand(
    ctx: *mut Ctx,
    now: i64,
    graph: &mut WaitFor,
    holders: &mut HashMap<(i32, Vec<u8>), Vec<Node>>,
    on_held_keys: &mut HashSet<u64>,
    node: Node,
    to: &mut Vec<Node>,
) {
    if !graph.describe(node) {
        return;
    }
    let owner = graph.name(node).clone();
    // A member of a queue's run read earlier needs no reading again.
    if blocking::sole_wait(&owner).is_some_and(|id| graph.materialize(node, id)) {
        return;
    }
    for wait in blocking::parked_waits(&owner) {
        // Its own waits first, in one call: a waiter's edges are together.
        to.clear();
        let mut keys = Vec::with_capacity(wait.on.len());
        for on in wait.on {
            let mut ahead = on.ahead;
            // Only a waiter ahead that waits elsewhere too may need reading past.
            let key = ahead
                .last()
                .is_some_and(|a| !a.sole)
                .then(|| on.key.clone());
            let held_by = holders
                .entry((wait.db, on.key))
                .or_insert_with_key(|(db, key)| {
                    let owners = holders_of(ctx, *db, key, now);
                    owners.iter().map(|h| graph.node(h)).collect()
                });
            if let Some(key) = key {
                read_past_holders(wait.db, &key, &mut ahead, held_by, graph);
            }
            if graph.waits_on_key(node, &ahead, held_by, to) {
                on_held_keys.insert(wait.id);
            }
            keys.push((ahead, held_by.clone()));
        }
        graph.wait(node, wait.id, to);
        for (ahead, held_by) in keys {
            graph.queue_run(ahead, &held_by);
        }
    }
}

/// `ahead` (a waiter's `QueuedOn::ahead`) ends at the first waiter ahead
/// whose owner waits elsewhere too. If that owner holds the key, its waiter
/// has no wait there and whoever is behind it waits for the waiters ahead of
/// it as well (`lock::direct_waits`): the queue is read on past it.
fn read_past_holders(
    db: i32,
    key: &[u8],
    ahead: &mut Vec<Ahead>,
    held_by: &[Node],
    graph: &WaitFor,
) {
    while let Some(last) = ahead.last() {
        let held = held_by.iter().any(|h| graph.name(*h)[..] == last.owner[..]);
        if last.sole || !held {
            return;
        }
        let more = blocking::waiters_ahead(db, key, last.id);
        if more.is_empty() {
            return;
        }
        ahead.extend(more);
    }
}

/// Owners of the live holds of a lock key.
fn holders_of(ctx: *mut Ctx, db: i32, key: &[u8], now: i64) -> Vec<Owner> {
    if !select_db(ctx, db) {
        return Vec::new();
    }
    let name = OwnedStr::new(key);
    let key = Key::open(ctx, name.ptr(), false);
    match lock_at(&key) {
        Ok(Some(v)) => unsafe { v.state() }
            .iter()
            .filter(|h| h.deadline >= now)
            .map(|h| Owner::new(&h.owner))
            .collect(),
        _ => Vec::new(),
    }
}
