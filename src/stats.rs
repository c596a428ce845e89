//! Counters behind the `INFO rlock` section.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use std::os::raw::c_int;

use redis_module::raw::RedisModuleInfoCtx;

use crate::ffi::api;

/// Lock values made (main thread only) and freed (on any thread: Redis frees
/// the values of a lazy flush or `UNLINK` in a background thread). Alive in
/// the keyspace: made - freed (each with at least one holder).
static LOCKS_MADE: AtomicI64 = AtomicI64::new(0);
static LOCKS_FREED: AtomicI64 = AtomicI64::new(0);
pub static GRANTS: AtomicU64 = AtomicU64::new(0);
pub static CONTENDED_GRANTS: AtomicU64 = AtomicU64::new(0);
pub static WAIT_TIMEOUTS: AtomicU64 = AtomicU64::new(0);
pub static LEASE_EXPIRATIONS: AtomicU64 = AtomicU64::new(0);
pub static FORCED_RELEASES: AtomicU64 = AtomicU64::new(0);
pub static TOKENS_ISSUED: AtomicU64 = AtomicU64::new(0);
pub static DEADLOCKS: AtomicU64 = AtomicU64::new(0);
pub static KEEPALIVE_RENEWALS: AtomicU64 = AtomicU64::new(0);

/// Adds `n` to a counter of the main thread's (every change runs there): a
/// load and a store, where an atomic add is a locked instruction, a full
/// barrier that costs each acquire ~20 cycles per counter.
pub fn bump(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed) + n, Ordering::Relaxed);
}

/// A lock value was made (main thread).
pub fn lock_made() {
    LOCKS_MADE.store(LOCKS_MADE.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
}

/// A lock value was freed (any thread).
pub fn lock_freed() {
    LOCKS_FREED.fetch_add(1, Ordering::Relaxed);
}

fn locks() -> i64 {
    LOCKS_MADE.load(Ordering::Relaxed) - LOCKS_FREED.load(Ordering::Relaxed)
}

fn get(counter: &AtomicU64) -> i64 {
    counter.load(Ordering::Relaxed) as i64
}

pub unsafe extern "C" fn info(ctx: *mut RedisModuleInfoCtx, _for_crash_report: c_int) {
    crate::ffi::contained("INFO", (), || add_section(ctx))
}

unsafe fn add_section(ctx: *mut RedisModuleInfoCtx) {
    // Redis prefixes each field with the module name: `rlock_locks`, ...
    api!(RedisModule_InfoAddSection)(ctx, std::ptr::null());
    let fields: [(&str, i64); 13] = [
        ("locks", locks().max(0)),
        ("waiters", crate::blocking::parked() as i64),
        ("grants", get(&GRANTS)),
        ("contended_grants", get(&CONTENDED_GRANTS)),
        ("wait_timeouts", get(&WAIT_TIMEOUTS)),
        ("lease_expirations", get(&LEASE_EXPIRATIONS)),
        ("forced_releases", get(&FORCED_RELEASES)),
        ("tokens_issued", get(&TOKENS_ISSUED)),
        ("last_token", crate::token::last() as i64),
        ("lease_schedule", crate::lease::watched() as i64),
        ("deadlocks", get(&DEADLOCKS)),
        ("keepalive_holds", crate::keepalive::count() as i64),
        ("keepalive_renewals", get(&KEEPALIVE_RENEWALS)),
    ];
    for (name, value) in fields {
        let name = std::ffi::CString::new(name).expect("static name");
        api!(RedisModule_InfoAddFieldLongLong)(ctx, name.as_ptr(), value);
    }
}
