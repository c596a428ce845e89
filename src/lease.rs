//! Lease deadlines the module must act on itself, and the one module timer
//! that enforces them.
//!
//! A lock key's TTL is its latest deadline, so Redis's own expiry (active cycle
//! or on access) ends a lock whose holders all run out, and the type's unlink
//! hook reports it. The module watches a deadline only where waiting for Redis
//! is not enough:
//! - a key with parked waiters: the first of them is handed the lock at the
//!   first millisecond the lease allows (deadline + 1), not when Redis gets to
//!   it, and at that millisecond's first microsecond (`waker`), not when
//!   Redis's millisecond clock fires the timer;
//! - a key with several holders (readers): each one's lease is its own and
//!   ends before the key's TTL;
//! - a key restored by `RESTORE`: its TTL is whatever the caller gave, until
//!   the timer, on the next turn of the event loop, makes it the latest
//!   deadline (and propagates it).
//!
//! So a lock with one holder and nobody waiting costs the schedule nothing, and
//! an idle server with a million leased locks has nothing scheduled at all.
//! The schedule is kept on every role (replicas apply the same changes), so a
//! promotion only arms the timer; the timer itself acts only on a master.
//! An entry names its key's database, and follows the value through `SWAPDB`.
//!
//! The same timer runs deferred "serve" passes (a waiter left the head of a
//! queue, a lock key was deleted or expired under its waiters) and reports the
//! keys Redis expired, because those are found in callbacks where the keyspace
//! must not be written. Each tick works for a bounded time, oldest first, then
//! lets the event loop answer clients and continues on the next turn; a tick
//! that fires late (the turn before was long) first lets clients have a turn.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

use redis_module::raw;

use crate::ffi::{api, now_ms, Ctx, OwnedStr};
use crate::lock::{Kind, LockState};
use crate::timer::{self, Armed};

/// A key name with its database.
type DbKey = (i32, Box<[u8]>);

/// Watched keys by the millisecond their earliest hold is over, plus each
/// key's entry, so an entry can be moved or removed exactly.
#[derive(Default)]
struct Deadlines {
    buckets: BTreeMap<i64, Vec<DbKey>>,
    due_of: HashMap<DbKey, i64>,
}

impl Deadlines {
    /// Watches `key` at `due` unless it is already watched at or before then.
    fn insert(&mut self, due: i64, db: i32, key: &[u8]) -> bool {
        let id: DbKey = (db, key.into());
        match self.due_of.get(&id) {
            Some(&old) if old <= due => return false,
            Some(&old) => self.drop_from_bucket(old, &id),
            None => {}
        }
        self.buckets.entry(due).or_default().push(id.clone());
        self.due_of.insert(id, due);
        true
    }

    fn remove(&mut self, db: i32, key: &[u8]) -> bool {
        if self.due_of.is_empty() {
            return false;
        }
        let id: DbKey = (db, key.into());
        match self.due_of.remove(&id) {
            Some(due) => {
                self.drop_from_bucket(due, &id);
                self.release_spare_capacity();
                true
            }
            None => false,
        }
    }

    /// Many watched keys must not pin their peak size once all are gone.
    fn release_spare_capacity(&mut self) {
        if self.due_of.is_empty() && self.due_of.capacity() > 64 {
            self.due_of = HashMap::new();
        }
    }

    fn drop_from_bucket(&mut self, due: i64, id: &DbKey) {
        if let Some(bucket) = self.buckets.get_mut(&due) {
            if let Some(i) = bucket.iter().position(|k| k == id) {
                bucket.swap_remove(i);
            }
            if bucket.is_empty() {
                self.buckets.remove(&due);
            }
        }
    }

    fn first_due(&self) -> Option<i64> {
        self.buckets.keys().next().copied()
    }

    /// Takes up to `max` entries due at or before `now`, earliest first.
    fn pop_due(&mut self, now: i64, max: usize) -> Vec<(i64, DbKey)> {
        let mut out = Vec::new();
        while out.len() < max {
            let Some(mut entry) = self.buckets.first_entry() else {
                break;
            };
            let due = *entry.key();
            if due > now {
                break;
            }
            let bucket = entry.get_mut();
            let take = bucket.len().min(max - out.len());
            for id in bucket.drain(..take) {
                self.due_of.remove(&id);
                out.push((due, id));
            }
            if bucket.is_empty() {
                entry.remove();
            }
        }
        self.release_spare_capacity();
        out
    }

    fn retain_dbs(&mut self, keep: impl Fn(i32) -> bool) {
        for bucket in self.buckets.values_mut() {
            bucket.retain(|(db, _)| keep(*db));
        }
        self.buckets.retain(|_, b| !b.is_empty());
        self.due_of.retain(|(db, _), _| keep(*db));
    }

    /// Gives every entry the database number `renumber` maps its own to.
    fn renumber(&mut self, renumber: impl Fn(i32) -> i32) {
        for bucket in self.buckets.values_mut() {
            bucket.iter_mut().for_each(|(db, _)| *db = renumber(*db));
        }
        self.due_of = std::mem::take(&mut self.due_of)
            .into_iter()
            .map(|((db, key), due)| ((renumber(db), key), due))
            .collect();
    }

    fn len(&self) -> usize {
        self.due_of.len()
    }

    /// The key's entry, if it has one.
    fn due(&self, db: i32, key: &[u8]) -> Option<i64> {
        if self.due_of.is_empty() {
            return None;
        }
        self.due_of.get(&(db, key.into())).copied()
    }
}

#[derive(Default)]
struct Schedule {
    expiries: Deadlines,
    /// Keys Redis removed in the last millisecond of their lease, by the
    /// millisecond after it: nothing is granted there until then.
    graces: Deadlines,
    serves: HashMap<(i32, Vec<u8>), IfAbsent>,
    /// Keys a `RESTORE` loaded a lock into, to watch once the command is over.
    restored: VecDeque<DbKey>,
    /// Keys Redis expired, whose keyspace event is still to fire: the names
    /// Redis expired them by, held rather than copied (a storm queues
    /// hundreds of thousands from inside Redis's expire cycle).
    expired: VecDeque<(i32, OwnedStr, Kind)>,
    timer: Option<Armed>,
    /// The last tick fired late and left its work to the next one.
    yielded: bool,
}

impl Schedule {
    /// Work only a master acts on: a replica (or a load) drops it.
    fn drop_pending(&mut self) {
        self.serves.clear();
        self.expired.clear();
        self.restored.clear();
        self.graces = Deadlines::default();
    }
}

thread_local! {
    static SCHEDULE: RefCell<Schedule> = RefCell::new(Schedule::default());
}

/// Whether any key is closed (`close_until_after`), kept beside the schedule
/// as a plain global: every acquire of a free key asks, and a thread-local
/// in a loaded module is a call into the dynamic linker.
static ANY_CLOSED: AtomicBool = AtomicBool::new(false);

fn with<R>(f: impl FnOnce(&mut Schedule) -> R) -> R {
    SCHEDULE.with(|s| {
        let s = &mut *s.borrow_mut();
        let out = f(s);
        ANY_CLOSED.store(s.graces.len() > 0, Ordering::Relaxed);
        out
    })
}

fn active() -> bool {
    crate::role::is_master() && !crate::role::is_loading()
}

/// Watches the key's earliest deadline when the module must act on it (it has
/// waiters, or several holders). Cheap when nothing is needed or it already is.
#[inline]
pub fn watch(ctx: *mut Ctx, db: i32, key: &[u8], state: &LockState, waiting: bool) {
    if waiting || state.is_indexed() {
        watch_earliest(ctx, db, key, state);
    }
}

#[inline(never)]
fn watch_earliest(ctx: *mut Ctx, db: i32, key: &[u8], state: &LockState) {
    if let Some(earliest) = state.earliest_deadline() {
        watch_at(ctx, db, key, earliest.saturating_add(1));
    }
}

fn watch_at(ctx: *mut Ctx, db: i32, key: &[u8], due: i64) {
    if with(|s| s.expiries.insert(due, db, key)) && active() {
        arm(ctx);
    }
}

/// A value was just loaded (RDB, full sync, `RESTORE`): watch it when it has
/// several holders, when it came from `RESTORE` (whose TTL is the caller's), or
/// when a lease in it already ended (the key's TTL in a file is not proof that
/// the lock ends with it: a damaged or hand-made RDB, or a lock key whose TTL
/// was changed, would otherwise keep a lock whose leases all ended in the
/// keyspace until that TTL, or for ever).
///
/// # Safety
/// `rdb` must be the IO context of the value being loaded.
pub unsafe fn loaded(rdb: *mut raw::RedisModuleIO, earliest: Option<i64>, indexed: bool, now: i64) {
    let restored = !crate::role::is_loading();
    // While loading, `now` is a reading shared with the values loaded just
    // before (`role::load_clock_ms`): a deadline within a second after it is
    // judged by the clock itself.
    let ended = earliest
        .is_some_and(|d| d < now || (d <= now.saturating_add(1_000) && d < crate::ffi::now_ms()));
    if !(restored || ended || indexed) {
        return;
    }
    let (Some(name_of), Some(db_of), Some(earliest)) = (
        raw::RedisModule_GetKeyNameFromIO,
        raw::RedisModule_GetDbIdFromIO,
        earliest,
    ) else {
        return;
    };
    let name = name_of(rdb);
    if name.is_null() {
        return;
    }
    let key = crate::ffi::bytes(name);
    let ctx = crate::ffi::module_context();
    if restored && active() {
        // Not yet: after this callback Redis may still drop the value (a bad
        // EOF marker after it, an ABSTTL already past), which would leave an
        // entry for a key that never held it, kept until its deadline (maybe
        // never); and with REPLACE it unlinks the key's old value afterwards,
        // whose hook would remove an entry made now, leaving a lock whose
        // leases all ended in the keyspace. The timer looks at the key as the
        // command left it (`watch_restored`), on the next turn of the event loop.
        with(|s| s.restored.push_back((db_of(rdb), key.into())));
        arm(ctx);
        return;
    }
    watch_at(ctx, db_of(rdb), key, earliest.saturating_add(1));
}

/// Watches a key a `RESTORE` loaded, if it holds a lock now, and gives it the
/// lock's latest deadline as TTL.
fn watch_restored(ctx: *mut Ctx, db: i32, key: &[u8]) {
    if !crate::ffi::select_db(ctx, db) {
        return;
    }
    let name = crate::ffi::OwnedStr::new(key);
    let Some((earliest, latest, ttl)) = lock_deadlines(ctx, name.ptr()) else {
        return;
    };
    if ttl != latest {
        align_ttl(ctx, name.ptr(), latest);
    }
    watch_at(ctx, db, key, earliest.saturating_add(1));
}

/// The earliest and latest deadline of the lock at a key, and the key's TTL
/// (absolute, or `REDISMODULE_NO_EXPIRE`); `None` if it holds no lock.
fn lock_deadlines(ctx: *mut Ctx, name: *mut crate::ffi::RStr) -> Option<(i64, i64, i64)> {
    let k = crate::ffi::Key::open(ctx, name, false);
    let Ok(Some(v)) = crate::store::lock_at(&k) else {
        return None;
    };
    let state = unsafe { v.state() };
    let ttl = unsafe { api!(RedisModule_GetAbsExpire)(k.raw) };
    Some((state.earliest_deadline()?, state.latest_deadline()?, ttl))
}

/// Makes a restored lock's TTL its latest deadline (SPEC: `PTTL key` is the
/// latest deadline). `RESTORE` sets the caller's TTL, or none; left so, `PTTL`
/// was wrong until the lease timer fired at the first deadline, and an RDB
/// saved meanwhile (`DEBUG RELOAD`, a restart) loaded the lock with no TTL and
/// no watch, never to expire. The
/// TTL is propagated as `PEXPIREAT` after the `RESTORE`, so replicas and the
/// AOF keep the same one. A lock whose leases all ended is left as it is: its
/// watch, due at once, ends it on the next tick and propagates that. The key
/// is opened for writing only here, and signalled as modified by hand (the
/// module opts out of the implicit signal, see `init`).
fn align_ttl(ctx: *mut Ctx, name: *mut crate::ffi::RStr, latest: i64) {
    if latest < now_ms() {
        return;
    }
    let k = crate::ffi::Key::open(ctx, name, true);
    unsafe {
        if api!(RedisModule_SetAbsExpire)(k.raw, latest) != crate::ffi::OK {
            return;
        }
        api!(RedisModule_SignalModifiedKey)(ctx, name);
    }
    crate::effect::replicate_ttl(ctx, name, latest);
}

/// Drops the key's entry: its value is leaving the keyspace (released, deleted,
/// expired or renamed by Redis). Main thread only.
pub fn unwatch(db: i32, key: &[u8]) {
    with(|s| s.expiries.remove(db, key));
}

/// Deadlines being watched.
pub fn watched() -> usize {
    SCHEDULE.with(|s| s.try_borrow().map(|s| s.expiries.len()).unwrap_or(0))
}

/// Forgets the entries of flushed databases (`None`: all of them).
pub fn forget_db(db: Option<i32>) {
    with(|s| {
        s.expiries.retain_dbs(|d| db.is_some_and(|x| x != d));
        s.graces.retain_dbs(|d| db.is_some_and(|x| x != d));
    });
}

/// Redis removed the key in the last millisecond of its lease, `deadline`: a
/// hold is valid through its deadline millisecond, and lookups keep a key
/// through it, but Redis 8's active expiry takes it at that millisecond
/// already. The key stays closed to grants until the millisecond after, when
/// its waiters (and any that parked meanwhile) are served. Main thread only.
pub fn close_until_after(ctx: *mut Ctx, db: i32, key: &[u8], deadline: i64) {
    with(|s| {
        // An entry of an earlier lease whose end the timer has not reached.
        s.graces.remove(db, key);
        s.graces.insert(deadline.saturating_add(1), db, key)
    });
    if active() {
        arm(ctx);
    }
}

/// Whether any key is closed (`closed` can be true of some key).
pub fn any_closed() -> bool {
    ANY_CLOSED.load(Ordering::Relaxed)
}

/// Whether the absent key's last lease still runs at `now` (see
/// `close_until_after`): a request must not be granted it yet.
pub fn closed(db: i32, key: &[u8], now: i64) -> bool {
    ANY_CLOSED.load(Ordering::Relaxed)
        && with(|s| s.graces.due(db, key).is_some_and(|opens| opens > now))
}

/// The number a database has after `SWAPDB a b` for the one numbered `db`
/// before: the two trade numbers, every other keeps its own.
pub fn across_swap(db: i32, (a, b): (i32, i32)) -> i32 {
    match db {
        _ if db == a => b,
        _ if db == b => a,
        _ => db,
    }
}

/// `SWAPDB a b`: the values of the two databases traded numbers, and the
/// entries about a value follow it: its deadline, and a key a `RESTORE` loaded
/// into. Serve passes stay, since they are about queues, and a queue is its
/// waiters' (who stay in the database they selected); the caller asks for a
/// pass over every queue of both. So do the keyspace events of keys Redis
/// expired: they report an expiry in the database it happened in, where Redis
/// published its own `expired` event. O(entries): only keys with waiters or
/// several holders have one, and SWAPDB is rare.
pub fn swap_dbs(a: i32, b: i32) {
    with(|s| {
        s.expiries.renumber(|db| across_swap(db, (a, b)));
        s.graces.renumber(|db| across_swap(db, (a, b)));
        s.restored
            .iter_mut()
            .for_each(|(db, _)| *db = across_swap(*db, (a, b)));
    });
}

/// What an absent key means to a deferred serve pass.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum IfAbsent {
    /// Its last lease ended: the first waiter takes a new lock.
    Grant,
    /// It was deleted, flushed, renamed or overwritten: waiters must retry.
    Retry,
}

/// Asks for a serve pass over a key's queue on the next turn of the event loop.
/// Several requests for one key merge and the latest reason wins: on a lease
/// expiry Redis calls the unlink hook (`Retry`) just before the `expired`
/// event (`Grant`).
pub fn schedule_serve(ctx: *mut Ctx, db: i32, key: &[u8], if_absent: IfAbsent) {
    let first = with(|s| {
        s.serves.insert((db, key.to_vec()), if_absent);
        s.serves.len() == 1
    });
    if first {
        arm(ctx);
    }
}

/// Whether the key was removed under its waiters and their serve pass (which
/// tells them to retry) has not run yet.
pub fn removal_pending(db: i32, key: &[u8]) -> bool {
    with(|s| s.serves.get(&(db, key.to_vec())) == Some(&IfAbsent::Retry))
}

/// Fires, about a millisecond later, the keyspace event of a key that Redis
/// expired: it is found in the unlink hook, in the middle of Redis's delete,
/// where other modules' keyspace subscribers must not run.
pub fn schedule_expiry_event(ctx: *mut Ctx, db: i32, keyname: OwnedStr, kind: Kind) {
    let first = with(|s| {
        s.expired.push_back((db, keyname, kind));
        s.expired.len() == 1
    });
    if first {
        arm(ctx);
    }
}

fn next_due(s: &Schedule) -> Option<i64> {
    if !s.serves.is_empty() || !s.restored.is_empty() {
        return Some(0);
    }
    // Keyspace events of expired keys come in storms (Redis's expire cycle
    // removes ~20,000 keys in one go) and nothing waits on them: one slice per
    // millisecond lets the event loop sleep in between, where a timer due at
    // once would keep it spinning, and the server's core busy, until all are out.
    let events = (!s.expired.is_empty()).then(|| now_ms() + 1);
    [events, lease_end(s)].into_iter().flatten().min()
}

/// The first millisecond a lease's end lets a waiter in.
fn lease_end(s: &Schedule) -> Option<i64> {
    [s.expiries.first_due(), s.graces.first_due()]
        .into_iter()
        .flatten()
        .min()
}

/// (Re)arms the Redis timer for the earliest pending work.
fn arm(ctx: *mut Ctx) {
    arm_not_before(ctx, i64::MIN);
}

/// Arms the timer for the earliest pending work, but not before the
/// millisecond `floor`.
fn arm_not_before(ctx: *mut Ctx, floor: i64) {
    if !active() {
        return;
    }
    let stale = with(|s| {
        let due = next_due(s)?.max(floor);
        timer::take_for(&mut s.timer, due).map(|old| (old, due))
    });
    let Some((old, due)) = stale else { return };
    let armed = timer::arm(ctx, old, due, on_timer);
    with(|s| s.timer = Some(armed));
    // A lease's end is when a waiter gets the lock: the waker brings the
    // timer forward to the microsecond `due` begins, where Redis's own
    // millisecond clock would fire it up to 2 ms later.
    if armed.delay_ms > 0 && with(|s| lease_end(s) == Some(due)) {
        crate::waker::wake_at(due.saturating_mul(1000), on_wake);
    }
}

/// The waker's call at the microsecond the armed timer's work is due: if
/// Redis has not fired the timer yet, it fires now, later in this same turn of
/// the event loop (timers run after the events that woke it; not while Redis
/// serves events in the middle of a load or a long script, where none runs).
unsafe extern "C" fn on_wake(_data: *mut c_void) {
    crate::ffi::contained("lease wake-up", (), || {
        if !active() {
            return;
        }
        let now_us = crate::ffi::micros();
        let pending = with(|s| match s.timer {
            Some(Armed { due, .. }) if due.saturating_mul(1000) <= now_us => s.timer.take(),
            _ => None,
        });
        if let Some(old) = pending {
            let ctx = crate::ffi::module_context();
            let armed = timer::arm(ctx, Some(old), old.due, on_timer);
            with(|s| s.timer = Some(armed));
        }
    })
}

/// Work of one timer tick before the event loop gets a turn. A command read
/// in a tick's turn is answered after it, and after Redis's cron too when the
/// cron falls due in that turn (25 ms in a storm of expiries): so ticks are
/// short, and a backlog is worked off in many of them, a millisecond apart.
const TICK_BUDGET_US: i64 = 500;
/// Entries taken from the schedule between two looks at the clock (a
/// hand-over to a waiter costs ~6 µs: a batch overruns the budget by ~0.1 ms).
const BATCH: usize = 16;
/// Keyspace events of expired keys stop this long after the tick began: they
/// wait for nothing, and a tick's turn of the event loop can be the one before
/// Redis's cron, whose expire cycle may take 25 ms more (a client's command
/// read in that turn is answered after both).
const EVENTS_BUDGET_US: i64 = 200;

/// A tick that fires this much after its time found the event loop busy.
const LATE_US: i64 = 2_000;

unsafe extern "C" fn on_timer(ctx: *mut Ctx, _data: *mut c_void) {
    crate::ffi::contained("lease timer", (), || {
        let fired = with(|s| s.timer.take());
        if active() && crate::role::writes_paused() {
            arm_not_before(ctx, now_ms() + crate::role::PAUSE_RETRY_MS);
            return;
        }
        let late = fired.is_some_and(|t| crate::ffi::micros() - t.fires_at_us >= LATE_US);
        if active() && late && !with(|s| std::mem::replace(&mut s.yielded, true)) {
            // The turn before this one was long: Redis's cron with its
            // expire cycle (25 ms in a storm of expiries) or a slow command.
            // Clients whose commands came in meanwhile are answered after
            // this turn's timers, so this tick leaves them one turn first,
            // once: the next tick works however late it is.
            arm_not_before(ctx, now_ms() + 1);
            return;
        }
        with(|s| s.yielded = false);
        if active() {
            run_slice(ctx);
        } else {
            with(Schedule::drop_pending);
        }
        arm(ctx);
    })
}

/// The most urgent work first — hand-overs to parked waiters (due leases,
/// then serve passes), then restored keys to watch, then keyspace events of
/// expired keys (within `EVENTS_BUDGET_US`) — each oldest first; stops once the
/// budget is spent and leaves the rest for the next tick, so a storm of events
/// never delays a hand-over.
fn run_slice(ctx: *mut Ctx) {
    let start = crate::ffi::micros();
    let spent = || crate::ffi::micros() - start >= TICK_BUDGET_US;
    let now = now_ms();
    let _finished = drain(
        &spent,
        || with(|s| s.expiries.pop_due(now, BATCH)),
        |(at, (db, key))| crate::engine::expire_due(ctx, db, &key, at),
    ) && drain(
        &spent,
        || with(|s| s.graces.pop_due(now, BATCH)),
        |(_, (db, key))| crate::engine::serve_queue(ctx, db, &key, IfAbsent::Grant),
    ) && drain(
        &spent,
        || {
            with(|s| {
                let keys: Vec<_> = s.serves.keys().take(BATCH).cloned().collect();
                let taken: Vec<_> = keys
                    .into_iter()
                    .map(|k| {
                        let why = s.serves.remove(&k).expect("listed");
                        (k, why)
                    })
                    .collect();
                taken
            })
        },
        |((db, key), if_absent)| crate::engine::serve_queue(ctx, db, &key, if_absent),
    ) && drain(
        &spent,
        || with(|s| s.restored.drain(..s.restored.len().min(BATCH)).collect()),
        |(db, key): DbKey| watch_restored(ctx, db, &key),
    ) && drain(
        &|| crate::ffi::micros() - start >= EVENTS_BUDGET_US,
        || with(|s| s.expired.drain(..s.expired.len().min(BATCH)).collect()),
        |(db, keyname, kind)| crate::notify::expiry_event(ctx, db, &keyname, kind),
    );
}

/// Runs `each` over batches from `take` until none is left (true) or the
/// budget is spent (false).
fn drain<T>(
    spent: &dyn Fn() -> bool,
    mut take: impl FnMut() -> Vec<T>,
    mut each: impl FnMut(T),
) -> bool {
    loop {
        let batch = take();
        if batch.is_empty() {
            return true;
        }
        batch.into_iter().for_each(&mut each);
        if spent() {
            return false;
        }
    }
}

/// This server became a replica: the timer stops; the schedule is kept, since
/// the replica applies its master's changes and may be promoted.
pub fn pause(ctx: *mut Ctx) {
    let old = with(|s| {
        s.drop_pending();
        s.timer.take()
    });
    timer::stop(ctx, old);
}

/// Loading ended or this server was promoted: act on the schedule from now on
/// (holds that ran out meanwhile are ended on the next tick).
pub fn resume(ctx: *mut Ctx) {
    if active() {
        arm(ctx);
    }
}

#[cfg(test)]
mod tests {
    use super::Deadlines;

    fn popped(d: &mut Deadlines, now: i64, max: usize) -> Vec<(i64, i32, Vec<u8>)> {
        d.pop_due(now, max)
            .into_iter()
            .map(|(due, (db, k))| (due, db, k.to_vec()))
            .collect()
    }

    #[test]
    fn deadlines_pop_in_order_move_and_remove_exactly() {
        let mut d = Deadlines::default();
        assert!(d.insert(20, 0, b"b"));
        assert!(d.insert(10, 0, b"a"));
        assert!(d.insert(10, 1, b"a"));
        assert!(d.insert(30, 0, b"c"));
        assert!(
            !d.insert(40, 0, b"c"),
            "a later due keeps the earlier entry"
        );
        assert!(d.insert(25, 0, b"c"), "an earlier due moves it");
        assert_eq!(d.len(), 4);
        assert_eq!(d.first_due(), Some(10));
        assert_eq!(d.due(0, b"c"), Some(25));
        assert_eq!(d.due(1, b"c"), None, "another database's key");
        assert!(d.remove(1, b"a"));
        assert!(!d.remove(1, b"a"), "already gone");
        assert!(!d.remove(0, b"zz"), "never there");
        assert_eq!(
            popped(&mut d, 20, 10),
            vec![(10, 0, b"a".to_vec()), (20, 0, b"b".to_vec())]
        );
        assert_eq!(d.first_due(), Some(25));
        d.insert(40, 2, b"x");
        d.retain_dbs(|db| db != 0);
        assert_eq!(d.len(), 1);
        assert_eq!(d.first_due(), Some(40));
    }

    #[test]
    fn popping_is_bounded_and_resumes_where_it_stopped() {
        let mut d = Deadlines::default();
        for i in 0..10u8 {
            d.insert(5, 0, &[i]);
        }
        d.insert(6, 0, b"late");
        assert_eq!(popped(&mut d, 100, 4).len(), 4);
        assert_eq!(popped(&mut d, 100, 4).len(), 4);
        let rest = popped(&mut d, 100, 4);
        assert_eq!(rest.len(), 3);
        assert_eq!(rest[2].2, b"late".to_vec());
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn renumbering_moves_entries_between_databases_exactly() {
        let mut d = Deadlines::default();
        d.insert(10, 0, b"k");
        d.insert(20, 1, b"k");
        d.insert(30, 2, b"k");
        d.renumber(|db| super::across_swap(db, (0, 1)));
        assert_eq!(
            popped(&mut d, 20, 10),
            vec![(10, 1, b"k".to_vec()), (20, 0, b"k".to_vec())]
        );
        d.insert(5, 1, b"x");
        d.renumber(|db| super::across_swap(db, (2, 1)));
        assert!(d.remove(2, b"x"), "found under its new number");
        assert!(!d.remove(2, b"k"), "moved to db1");
        assert!(d.remove(1, b"k"));
        assert_eq!(d.len(), 0);
    }
}
