//! What observers see: the unlock channel `__rlock@<db>__:<key>`, keyspace
//! events of class `d`, and the bookkeeping when Redis itself removes a lock key
//! (its TTL, which is the latest lease deadline, ran out; or DEL, RENAME...).

use std::ffi::CStr;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use crate::config;
use crate::ffi::{api, bytes, module_context, now_ms, Ctx, OwnedStr, RStr};
use crate::lease::IfAbsent;
use crate::lock::{EndReason, Kind};
use crate::stats;

/// Publishes why a hold ended on the key's unlock channel.
pub fn publish(ctx: *mut Ctx, db: i32, key: &[u8], reason: EndReason) {
    if !config::notify_channel() {
        return;
    }
    let channel = CHANNEL.with(|buf| {
        let mut buf = buf.borrow_mut();
        buf.clear();
        buf.extend_from_slice(b"__rlock@");
        // Redis's db ids are never negative.
        buf.extend_from_slice(crate::lock::decimal(db.unsigned_abs().into(), &mut [0; 20]));
        buf.extend_from_slice(b"__:");
        buf.extend_from_slice(key);
        OwnedStr::new(&buf)
    });
    unsafe { api!(RedisModule_PublishMessage)(ctx, channel.ptr(), message(reason)) };
}

thread_local! {
    /// The channel name is built here: every release and every expiry publishes.
    static CHANNEL: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The message for `reason`, created once and kept: Redis copies a published
/// message into each subscriber's reply, so one string serves every publish.
fn message(reason: EndReason) -> *mut RStr {
    static MESSAGES: [AtomicPtr<RStr>; 3] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 3];
    let slot = &MESSAGES[match reason {
        EndReason::Released => 0,
        EndReason::Expired => 1,
        EndReason::Forced => 2,
    }];
    let kept = slot.load(Ordering::Relaxed);
    if !kept.is_null() {
        return kept;
    }
    let word = reason.word();
    let created = unsafe {
        api!(RedisModule_CreateString)(std::ptr::null_mut(), word.as_ptr().cast(), word.len())
    };
    slot.store(created, Ordering::Relaxed);
    created
}

/// What happened to a lock, as a keyspace event.
#[derive(Clone, Copy)]
pub enum Event {
    Acquire,
    End(EndReason),
}

/// `<family>.<event>`, e.g. `rlock.acquire`.
fn event_name(kind: Kind, event: Event) -> &'static CStr {
    use EndReason::*;
    match (kind, event) {
        (Kind::Reentrant, Event::Acquire) => c"rlock.acquire",
        (Kind::Reentrant, Event::End(Released)) => c"rlock.release",
        (Kind::Reentrant, Event::End(Expired)) => c"rlock.expire",
        (Kind::Reentrant, Event::End(Forced)) => c"rlock.force",
        (Kind::Fair, Event::Acquire) => c"fairlock.acquire",
        (Kind::Fair, Event::End(Released)) => c"fairlock.release",
        (Kind::Fair, Event::End(Expired)) => c"fairlock.expire",
        (Kind::Fair, Event::End(Forced)) => c"fairlock.force",
        (Kind::ReadWrite, Event::Acquire) => c"rwlock.acquire",
        (Kind::ReadWrite, Event::End(Released)) => c"rwlock.release",
        (Kind::ReadWrite, Event::End(Expired)) => c"rwlock.expire",
        (Kind::ReadWrite, Event::End(Forced)) => c"rwlock.force",
        (Kind::Semaphore, Event::Acquire) => c"semaphore.acquire",
        (Kind::Semaphore, Event::End(Released)) => c"semaphore.release",
        (Kind::Semaphore, Event::End(Expired)) => c"semaphore.expire",
        (Kind::Semaphore, Event::End(Forced)) => c"semaphore.force",
    }
}

/// Fires the event on the key, class `d` (subject to notify-keyspace-events).
pub fn keyspace(ctx: *mut Ctx, kind: Kind, event: Event, keyname: *mut RStr) {
    if !config::notify_keyspace() {
        return;
    }
    let name = event_name(kind, event);
    unsafe {
        api!(RedisModule_NotifyKeyspaceEvent)(
            ctx,
            raw::REDISMODULE_NOTIFY_MODULE,
            name.as_ptr(),
            keyname,
        )
    };
}

/// Answer to waiters whose lock key was deleted, renamed, flushed or migrated
/// under them. Cluster clients retry TRYAGAIN, and the retry follows MOVED/ASK.
pub const KEY_GONE_ERR: &str = "TRYAGAIN the lock key was deleted or moved while waiting; retry";

/// The type's unlink2 hook: Redis is removing one of our keys from the
/// keyspace (its TTL ran out, DEL, RENAME, MOVE, MIGRATE, overwrite, eviction).
/// Only lock keys pay for this; the module subscribes to no keyspace events,
/// so other commands never call into it.
///
/// The value says why: when every hold is past its deadline the lease ended
/// (Redis expired the key: report it, and the first waiter takes a new lock);
/// otherwise the lock was removed under its holder (published as `forced`),
/// and the waiters are told to retry (or get WRONGTYPE if something else now
/// lives at the key).
pub unsafe extern "C" fn on_unlink(octx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    crate::ffi::contained("unlink hook", (), || {
        let lock = crate::store::Stored::from_raw(value.cast_mut()).outline();
        let keyname = api!(RedisModule_GetKeyNameFromOptCtx)(octx);
        let key = bytes(keyname);
        let db = api!(RedisModule_GetDbIdFromOptCtx)(octx);
        crate::lease::unwatch(db, key);
        // The engine deletes a lock once its last hold is gone and reports that
        // itself; a replica reports nothing (the master does).
        if lock.holders == 0 || !crate::role::is_master() {
            return;
        }
        let ctx = module_context();
        // A hold is valid through its deadline millisecond and Redis 7.0 expires
        // a key once that millisecond is over; Redis 8's active expiry already
        // removes it during that millisecond. Either way the lease ended (only
        // a removal before the deadline is a deletion), but in the second case
        // nobody may have the lock before the millisecond after.
        let now = now_ms();
        let expired = lock.latest_deadline.is_some_and(|d| d <= now);
        if lock.latest_deadline == Some(now) {
            crate::lease::close_until_after(ctx, db, key, now);
        }
        if expired {
            // Published at once, as Redis publishes its own `expired` event on
            // its expire path: a deferred report would keep the event loop
            // spinning through an expiry storm. The keyspace event waits for
            // the next tick (see `lease::schedule_expiry_event`).
            stats::bump(&stats::LEASE_EXPIRATIONS, lock.holders as u64);
            publish(ctx, db, key, EndReason::Expired);
            if config::notify_keyspace() {
                crate::lease::schedule_expiry_event(ctx, db, OwnedStr::hold(keyname), lock.kind);
            }
        } else if !crate::role::is_loading() {
            // Removed under its holders (DEL, eviction, RENAME or MOVE away,
            // an overwrite): the holds ended as by FORCERELEASE (Redisson's
            // force unlock is a DEL), and the channel's subscribers would
            // otherwise wait out the lease before they try again.
            publish(ctx, db, key, EndReason::Forced);
        }
        if crate::blocking::any_queued() && crate::blocking::queue_len(db, key) > 0 {
            let if_absent = if expired {
                // The waiters are served under the limit in force.
                if lock.limit > 0 {
                    crate::blocking::keep_limit(db, key, lock.limit);
                }
                IfAbsent::Grant
            } else {
                IfAbsent::Retry
            };
            crate::lease::schedule_serve(ctx, db, key, if_absent);
        }
    })
}

/// Fires the keyspace event of a key Redis expired.
pub fn expiry_event(ctx: *mut Ctx, db: i32, keyname: &OwnedStr, kind: Kind) {
    if crate::ffi::select_db(ctx, db) {
        keyspace(ctx, kind, Event::End(EndReason::Expired), keyname.ptr());
    }
}
