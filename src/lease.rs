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
use std::collections::{BTreeSet, HashMap};
use std::os::raw::c_void;

use redis_module::raw;

use crate::ffi::{api, is_loading, is_master, now_ms, Ctx};
use crate::store::LockValue;

/// Longest single wait of the Redis timer (one hour).
const MAX_TIMER_DELAY_MS: i64 = 3_600_000;

#[derive(Default)]
struct Schedule {
    expiries: BTreeSet<(i64, i32, Vec<u8>)>,
    serves: HashMap<(i32, Vec<u8>), IfAbsent>,
    /// The armed Redis timer and the time it fires at.
    timer: Option<(raw::RedisModuleTimerID, i64)>,
}

thread_local! {
    static SCHEDULE: RefCell<Schedule> = RefCell::new(Schedule::default());
}

fn with<R>(f: impl FnOnce(&mut Schedule) -> R) -> R {
    SCHEDULE.with(|s| f(&mut s.borrow_mut()))
}

fn active(ctx: *mut Ctx) -> bool {
    is_master(ctx) && !is_loading(ctx)
}

/// Makes sure the key's earliest deadline is watched. Cheap when it already is.
pub fn watch(ctx: *mut Ctx, db: i32, key: &[u8], value: &mut LockValue) {
    let Some(earliest) = value.state.earliest_deadline() else {
        return;
    };
    if !active(ctx) {
        return;
    }
    let due = earliest.saturating_add(1);
    if value.armed != 0 && value.armed <= due {
        return;
    }
    let old = std::mem::replace(&mut value.armed, due);
    with(|s| {
        if old != 0 {
            s.expiries.remove(&(old, db, key.to_vec()));
        }
        s.expiries.insert((due, db, key.to_vec()));
    });
    arm(ctx);
}

/// Drops the key's entry: its value is leaving the keyspace (released, deleted,
/// expired or renamed by Redis). Main thread only.
pub fn unwatch(db: i32, key: &[u8], value: &mut LockValue) {
    let armed = std::mem::take(&mut value.armed);
    if armed != 0 {
        with(|s| s.expiries.remove(&(armed, db, key.to_vec())));
    }
}

/// Deadlines being watched (one per lock key with holders, on a master).
pub fn watched() -> usize {
    SCHEDULE.with(|s| s.try_borrow().map(|s| s.expiries.len()).unwrap_or(0))
}

/// Forgets the entries of flushed databases (`None`: all of them).
pub fn forget_db(db: Option<i32>) {
    with(|s| s.expiries.retain(|(_, d, _)| db.is_some_and(|x| x != *d)));
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

fn next_due(s: &Schedule) -> Option<i64> {
    if !s.serves.is_empty() {
        return Some(0);
    }
    s.expiries.first().map(|(due, _, _)| *due)
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
        let (serves, expiries) = with(|s| {
            s.timer = None;
            let serves: Vec<_> = s.serves.drain().collect();
            let mut due = Vec::new();
            while s.expiries.first().is_some_and(|(at, _, _)| *at <= now) {
                due.extend(s.expiries.pop_first());
            }
            (serves, due)
        });
        if active(ctx) {
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
    if !active(ctx) {
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
            s.expiries
                .extend(found.into_iter().map(|(key, due)| (due, db, key)))
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
