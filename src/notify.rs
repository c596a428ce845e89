//! What observers see: the unlock channel `__rlock@<db>__:<key>`, keyspace
//! events of class `d`, and the bookkeeping when Redis itself removes a lock key
//! (its TTL, which is the latest lease deadline, ran out; or DEL, FLUSHALL...).

use std::cell::RefCell;
use std::ffi::CStr;
use std::os::raw::{c_char, c_int, c_void};
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use crate::config;
use crate::ffi::{api, bytes, selected_db, Ctx, OwnedStr, RStr};
use crate::lease::IfAbsent;
use crate::lock::{EndReason, Kind};
use crate::stats;

/// Publishes why a hold ended on the key's unlock channel.
pub fn publish(ctx: *mut Ctx, db: i32, key: &[u8], reason: EndReason) {
    if !config::notify_channel() {
        return;
    }
    let mut channel = format!("__rlock@{db}__:").into_bytes();
    channel.extend_from_slice(key);
    let channel = OwnedStr::new(&channel);
    let message = OwnedStr::new(reason.word().as_bytes());
    unsafe { api!(RedisModule_PublishMessage)(ctx, channel.ptr(), message.ptr()) };
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

/// The lock key Redis is removing right now, seen by the type's unlink hook
/// just before the keyspace event that says why.
struct Unlinked {
    db: i32,
    key: Vec<u8>,
    kind: Kind,
    holders: usize,
}

/// A context of this module for callbacks that get none (the unlink hook).
static MODULE_CONTEXT: AtomicPtr<Ctx> = AtomicPtr::new(std::ptr::null_mut());

pub fn init(ctx: *mut Ctx) {
    let detached = unsafe { api!(RedisModule_GetDetachedThreadSafeContext)(ctx) };
    MODULE_CONTEXT.store(detached, Ordering::Relaxed);
}

fn module_context() -> *mut Ctx {
    MODULE_CONTEXT.load(Ordering::Relaxed)
}

thread_local! {
    static UNLINKED: RefCell<Option<Unlinked>> = const { RefCell::new(None) };
}

/// The type's unlink2 hook: remember what was there until the event arrives.
pub unsafe extern "C" fn on_unlink(octx: *mut raw::RedisModuleKeyOptCtx, value: *const c_void) {
    crate::ffi::contained("unlink hook", (), || {
        // Redis hands the value as const, but it is ours until `free`, and the
        // lease entry of a key that leaves the keyspace must go with it.
        let v = &mut *(value as *mut crate::store::LockValue);
        let key = bytes(api!(RedisModule_GetKeyNameFromOptCtx)(octx)).to_vec();
        let db = api!(RedisModule_GetDbIdFromOptCtx)(octx);
        crate::lease::unwatch(db, &key, v);
        if crate::blocking::any_queued() && crate::blocking::queue_len(db, &key) > 0 {
            // Overwritten (SET...) or removed: the serve pass answers the
            // waiters (WRONGTYPE, or a new holder after expiry), unless the
            // keyspace event that follows has already told them to retry.
            crate::lease::schedule_serve(module_context(), db, &key, IfAbsent::Retry);
        }
        let record = Unlinked {
            db,
            key,
            kind: v.state.kind,
            holders: v.state.holders.len(),
        };
        UNLINKED.with(|u| *u.borrow_mut() = Some(record));
    })
}

/// The engine deletes keys itself and reports that itself.
pub fn forget_unlinked() {
    UNLINKED.with(|u| u.borrow_mut().take());
}

/// Generic, expired and evicted keyspace events, for every key. Keys that are
/// not locks and have no waiters cost one comparison.
pub unsafe extern "C" fn on_keyspace_event(
    ctx: *mut Ctx,
    _type: c_int,
    event: *const c_char,
    keyname: *mut RStr,
) -> c_int {
    crate::ffi::contained("keyspace event", crate::ffi::OK, || {
        let db = selected_db(ctx);
        let key = bytes(keyname);
        let unlinked = UNLINKED
            .with(|u| u.borrow_mut().take())
            .filter(|u| u.db == db && u.key == key);
        if let Some(u) = unlinked {
            if CStr::from_ptr(event).to_bytes() == b"expired" {
                stats::bump(&stats::LEASE_EXPIRATIONS, u.holders as u64);
                publish(ctx, db, key, EndReason::Expired);
                keyspace(ctx, u.kind, Event::End(EndReason::Expired), keyname);
            }
        }
        if crate::blocking::any_queued() && crate::blocking::queue_len(db, key) > 0 {
            let lease_ended = CStr::from_ptr(event).to_bytes() == b"expired";
            if lease_ended {
                crate::lease::schedule_serve(ctx, db, key, IfAbsent::Grant);
            } else if !crate::ffi::Key::open(ctx, keyname, false).is_empty() {
                // Still there (a new TTL, overwritten...): the serve pass sorts it out.
                crate::lease::schedule_serve(ctx, db, key, IfAbsent::Retry);
            } else {
                // Deleted, renamed, migrated to another node: this lock is not
                // here any more, so its waiters must not be handed a new one.
                crate::blocking::fail_all(db, key, KEY_GONE_ERR);
            }
        }
        crate::ffi::OK
    })
}
