//! Lease deadlines and the one module timer that enforces them.
//!
//! An ordered set holds (due, db, key) for every key with holders, due being
//! the first millisecond at which its earliest hold is expired. A single Redis
//! timer is armed for the first entry, so an idle server with a million leased
//! locks wakes only when a lease actually ends. The value remembers the due
//! time of its entry (`LockValue::armed`): the entry is removed when the key
//! goes away (`unwatch`), and a renewal that only pushes the deadline later
//! keeps the old entry, which then fires early, finds nothing due, and moves.
//!
//! The same timer also runs deferred "serve" passes (a waiter left the head of
//! a queue, a lock key was deleted or expired under its waiters), because those
//! are discovered in callbacks where the keyspace must not be written.
//!
//! Timers act only on a master: replicas wait for the master's effects. The
//! schedule is rebuilt from the keyspace when loading ends and on promotion.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::os::raw::c_void;

use redis_module::raw;

use crate::ffi::{api, now_ms, Ctx};
use crate::lock::Kind;
use crate::store::LockValue;

/// Lock keys by the millisecond their earliest hold expires. Leases of one
/// length arrive in due order, so buckets keep an insert to one integer search
/// and a push (a set ordered by (due, key) compared key bytes every time).
/// A key name with its database.
type DbKey = (i32, Box<[u8]>);

#[derive(Default)]
struct Deadlines {
    buckets: BTreeMap<i64, Vec<DbKey>>,
    len: usize,
}

impl Deadlines {
    fn insert(&mut self, due: i64, db: i32, key: &[u8]) {
        self.buckets.entry(due).or_default().push((db, key.into()));
        self.len += 1;
    }

    fn remove(&mut self, due: i64, db: i32, key: &[u8]) -> bool {
        let Some(bucket) = self.buckets.get_mut(&due) else {
            return false;
        };
        let Some(i) = bucket.iter().position(|(d, k)| *d == db && **k == *key) else {
            return false;
        };
        bucket.swap_remove(i);
        if bucket.is_empty() {
            self.buckets.remove(&due);
        }
        self.len -= 1;
        true
    }

    fn first_due(&self) -> Option<i64> {
        self.buckets.keys().next().copied()
    }

    /// Takes every entry due at or before `now`.
    fn pop_due(&mut self, now: i64) -> Vec<(i64, i32, Box<[u8]>)> {
        let mut out = Vec::new();
        while let Some(entry) = self.buckets.first_entry() {
            if *entry.key() > now {
                break;
            }
            let (due, bucket) = entry.remove_entry();
            out.extend(bucket.into_iter().map(|(db, key)| (due, db, key)));
        }
        self.len -= out.len();
        out
    }

    fn retain_dbs(&mut self, keep: impl Fn(i32) -> bool) {
        for bucket in self.buckets.values_mut() {
            bucket.retain(|(db, _)| keep(*db));
        }
        self.buckets.retain(|_, b| !b.is_empty());
        self.len = self.buckets.values().map(Vec::len).sum();
    }

    fn len(&self) -> usize {
        self.len
    }
}

/// Longest single wait of the Redis timer (one hour).
const MAX_TIMER_DELAY_MS: i64 = 3_600_000;

#[derive(Default)]
struct Schedule {
    expiries: Deadlines,
    serves: HashMap<(i32, Vec<u8>), IfAbsent>,
    /// Keys Redis expired, to report (stats, channel, keyspace event).
    expired: Vec<(i32, Vec<u8>, Kind)>,
    /// The armed Redis timer and the time it fires at.
    timer: Option<(raw::RedisModuleTimerID, i64)>,
}

thread_local! {
    static SCHEDULE: RefCell<Schedule> = RefCell::new(Schedule::default());
}

fn with<R>(f: impl FnOnce(&mut Schedule) -> R) -> R {
    SCHEDULE.with(|s| f(&mut s.borrow_mut()))
}

fn active() -> bool {
    crate::role::is_master() && !crate::role::is_loading()
}

/// Makes sure the key's earliest deadline is watched. Cheap when it already is.
pub fn watch(ctx: *mut Ctx, db: i32, key: &[u8], value: &mut LockValue) {
    let Some(earliest) = value.state.earliest_deadline() else {
        return;
    };
    if !active() {
        return;
    }
    let due = earliest.saturating_add(1);
    if value.armed != 0 && value.armed <= due {
        return;
    }
    let old = std::mem::replace(&mut value.armed, due);
    with(|s| {
        if old != 0 {
            s.expiries.remove(old, db, key);
        }
        s.expiries.insert(due, db, key);
    });
    arm(ctx);
}

/// Drops the key's entry: its value is leaving the keyspace (released, deleted,
/// expired or renamed by Redis). Main thread only.
pub fn unwatch(db: i32, key: &[u8], value: &mut LockValue) {
    let armed = std::mem::take(&mut value.armed);
    if armed != 0 {
        with(|s| s.expiries.remove(armed, db, key));
    }
}

/// Deadlines being watched (one per lock key with holders, on a master).
pub fn watched() -> usize {
    SCHEDULE.with(|s| s.try_borrow().map(|s| s.expiries.len()).unwrap_or(0))
}

/// Forgets the entries of flushed databases (`None`: all of them).
pub fn forget_db(db: Option<i32>) {
    with(|s| s.expiries.retain_dbs(|d| db.is_some_and(|x| x != d)));
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

/// Reports, on the next turn of the event loop, the holds of a key that Redis
/// expired (found in the unlink hook, where nothing may be published).
pub fn schedule_expiry_report(ctx: *mut Ctx, db: i32, key: &[u8], kind: Kind) {
    with(|s| s.expired.push((db, key.to_vec(), kind)));
    arm(ctx);
}

fn next_due(s: &Schedule) -> Option<i64> {
    if !s.serves.is_empty() || !s.expired.is_empty() {
        return Some(0);
    }
    s.expiries.first_due()
}

/// (Re)arms the Redis timer for the earliest pending work.
fn arm(ctx: *mut Ctx) {
    let stale = with(|s| {
        let due = next_due(s)?;
        match s.timer {
            Some((_, at)) if at <= due => None,
            _ => Some((s.timer.take(), due)),
        }
    });
    let Some((old, due)) = stale else { return };
    unsafe {
        if let Some((id, _)) = old {
            api!(RedisModule_StopTimer)(ctx, id, std::ptr::null_mut());
        }
        // Redis turns the delay into microseconds on its own clock: a lease
        // decades long would overflow it and fire at once, forever. A capped
        // timer that fires early finds nothing due and re-arms.
        let delay = due.saturating_sub(now_ms()).clamp(0, MAX_TIMER_DELAY_MS);
        let id = api!(RedisModule_CreateTimer)(ctx, delay, Some(on_timer), std::ptr::null_mut());
        with(|s| s.timer = Some((id, due)));
    }
}

unsafe extern "C" fn on_timer(ctx: *mut Ctx, _data: *mut c_void) {
    crate::ffi::contained("lease timer", (), || {
        let now = now_ms();
        let (expired, serves, expiries) = with(|s| {
            s.timer = None;
            let serves: Vec<_> = s.serves.drain().collect();
            (
                std::mem::take(&mut s.expired),
                serves,
                s.expiries.pop_due(now),
            )
        });
        if active() {
            for (db, key, kind) in expired {
                crate::notify::report_expiry(ctx, db, &key, kind);
            }
            for ((db, key), if_absent) in serves {
                crate::engine::serve_queue(ctx, db, &key, if_absent);
            }
            for (at, db, key) in expiries {
                crate::engine::expire_due(ctx, db, &key, at);
            }
        }
        arm(ctx);
    })
}

/// Forgets every deadline and stops the timer (this server became a replica).
pub fn clear(ctx: *mut Ctx) {
    let old = with(std::mem::take);
    if let Some((id, _)) = old.timer {
        unsafe { api!(RedisModule_StopTimer)(ctx, id, std::ptr::null_mut()) };
    }
}

/// Rebuilds the schedule from every lock key in every database (after loading,
/// on promotion). Holds that ran out meanwhile are expired on the next timer tick.
pub fn rebuild(ctx: *mut Ctx) {
    clear(ctx);
    if !active() {
        return;
    }
    let original_db = crate::ffi::selected_db(ctx);
    let mut db = 0;
    while crate::ffi::select_db(ctx, db) {
        let mut found: Vec<(Vec<u8>, i64)> = Vec::new();
        unsafe {
            let cursor = api!(RedisModule_ScanCursorCreate)();
            while api!(RedisModule_Scan)(
                ctx,
                cursor,
                Some(collect_lock),
                (&mut found as *mut Vec<_>).cast(),
            ) != 0
            {}
            api!(RedisModule_ScanCursorDestroy)(cursor);
        }
        with(|s| {
            found
                .into_iter()
                .for_each(|(key, due)| s.expiries.insert(due, db, &key))
        });
        db += 1;
    }
    crate::ffi::select_db(ctx, original_db);
    arm(ctx);
}

unsafe extern "C" fn collect_lock(
    _ctx: *mut Ctx,
    keyname: *mut raw::RedisModuleString,
    key: *mut raw::RedisModuleKey,
    privdata: *mut c_void,
) {
    if key.is_null()
        || api!(RedisModule_KeyType)(key) != raw::REDISMODULE_KEYTYPE_MODULE as i32
        || api!(RedisModule_ModuleTypeGetType)(key) != crate::store::lock_type()
    {
        return;
    }
    let value = &mut *(api!(RedisModule_ModuleTypeGetValue)(key) as *mut LockValue);
    if let Some(earliest) = value.state.earliest_deadline() {
        value.armed = earliest.saturating_add(1);
        let found = &mut *(privdata as *mut Vec<(Vec<u8>, i64)>);
        found.push((crate::ffi::bytes(keyname).to_vec(), value.armed));
    }
}

#[cfg(test)]
mod tests {
    use super::Deadlines;

    #[test]
    fn deadlines_pop_in_order_and_remove_exactly() {
        let mut d = Deadlines::default();
        d.insert(20, 0, b"b");
        d.insert(10, 0, b"a");
        d.insert(10, 1, b"a");
        d.insert(30, 0, b"c");
        assert_eq!(d.len(), 4);
        assert_eq!(d.first_due(), Some(10));
        assert!(d.remove(10, 1, b"a"));
        assert!(!d.remove(10, 1, b"a"), "already gone");
        assert!(!d.remove(20, 0, b"a"), "wrong key");
        let popped: Vec<_> = d
            .pop_due(20)
            .into_iter()
            .map(|(due, db, k)| (due, db, k.to_vec()))
            .collect();
        assert_eq!(popped, vec![(10, 0, b"a".to_vec()), (20, 0, b"b".to_vec())]);
        assert_eq!(d.first_due(), Some(30));
        d.insert(40, 2, b"x");
        d.retain_dbs(|db| db != 0);
        assert_eq!(d.len(), 1);
        assert_eq!(d.first_due(), Some(40));
    }
}
