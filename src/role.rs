//! What this server is right now, cached from server events so the hot path
//! does not ask Redis (RM_GetContextFlags computes many flags per call):
//! master or replica, loading or not, and whether effects have anywhere to go.
//!
//! Propagation: Redis drops a replicated effect when AOF is off and there is
//! neither a replica nor a replication backlog. Building `RLOCK.SETSTATE` for
//! nothing was half the cost of an acquire, so it is skipped until the first
//! sign of a listener, and then always made (the flag never clears):
//! - at load: AOF on, this server a replica, or replicas/backlog present;
//! - on every fork: a replica's full sync forks before any later command runs,
//!   and the commands before the fork are inside the snapshot it receives;
//! - on any replica or role change.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU32, Ordering};

use redis_module::raw;

use crate::ffi::{api, ctx_flags, Ctx};

static MASTER: AtomicBool = AtomicBool::new(true);
static LOADING: AtomicBool = AtomicBool::new(false);
static PROPAGATE: AtomicBool = AtomicBool::new(false);
/// The clock reading loaded values share, and how many more may use it.
static LOAD_CLOCK: AtomicI64 = AtomicI64::new(0);
static LOAD_CLOCK_LEFT: AtomicU32 = AtomicU32::new(0);

/// Values loaded per clock reading while the server loads. Reading the clock
/// once per value took 3.6% of an RDB load of one-holder locks (a vDSO call
/// each, perf); 128 values load in well under a millisecond.
const LOAD_CLOCK_VALUES: u32 = 128;

pub fn is_master() -> bool {
    MASTER.load(Ordering::Relaxed)
}

pub fn is_loading() -> bool {
    LOADING.load(Ordering::Relaxed)
}

/// Whether replicated effects can reach a replica or the AOF.
pub fn propagates() -> bool {
    PROPAGATE.load(Ordering::Relaxed)
}

/// Whether clients are paused for writes (`CLIENT PAUSE`, a failover). Redis
/// then lets nothing change the dataset, and asserts that nothing is
/// propagated (the server dies if a module does), while a key past its TTL
/// reads as absent but stays in place. So the module's own timers and hooks
/// change no lock meanwhile: they try again once the pause is over, as
/// Redis's own expiry does.
pub fn writes_paused() -> bool {
    unsafe { api!(RedisModule_AvoidReplicaTraffic)() != 0 }
}

/// How often work held back by a pause looks again.
pub const PAUSE_RETRY_MS: i64 = 10;

pub fn set_loading(loading: bool) {
    LOADING.store(loading, Ordering::Relaxed);
    LOAD_CLOCK_LEFT.store(0, Ordering::Relaxed);
}

/// The time a value being loaded is judged at (its tokens' bound, whether its
/// leases already ended): while the server loads, a reading at most
/// `LOAD_CLOCK_VALUES` values old, so never later than the time itself; at any
/// other moment (`RESTORE`) a fresh one.
pub fn load_clock_ms() -> i64 {
    let left = LOAD_CLOCK_LEFT.load(Ordering::Relaxed);
    if left > 0 && is_loading() {
        LOAD_CLOCK_LEFT.store(left - 1, Ordering::Relaxed);
        return LOAD_CLOCK.load(Ordering::Relaxed);
    }
    let now = crate::ffi::now_ms();
    if is_loading() {
        LOAD_CLOCK.store(now, Ordering::Relaxed);
        LOAD_CLOCK_LEFT.store(LOAD_CLOCK_VALUES - 1, Ordering::Relaxed);
    }
    now
}

/// A replica attached or left, or the role changed: effects go out from now on.
pub fn listener_seen() {
    PROPAGATE.store(true, Ordering::Relaxed);
}

/// Re-reads the role and looks for listeners (at load, on fork, on role change).
pub fn refresh(ctx: *mut Ctx) {
    let flags = ctx_flags(ctx);
    MASTER.store(
        flags & raw::REDISMODULE_CTX_FLAGS_MASTER != 0,
        Ordering::Relaxed,
    );
    set_loading(flags & raw::REDISMODULE_CTX_FLAGS_LOADING != 0);
    let aof_or_replica = raw::REDISMODULE_CTX_FLAGS_AOF | raw::REDISMODULE_CTX_FLAGS_SLAVE;
    if flags & aof_or_replica != 0 || replicas_or_backlog(ctx) {
        listener_seen();
    }
}

fn replicas_or_backlog(ctx: *mut Ctx) -> bool {
    unsafe {
        let info = api!(RedisModule_GetServerInfo)(ctx, c"replication".as_ptr());
        if info.is_null() {
            return true;
        }
        let field = |name: &std::ffi::CStr| {
            let mut err = 0;
            let v = api!(RedisModule_ServerInfoGetFieldSigned)(info, name.as_ptr(), &mut err);
            // An unknown field counts as "maybe": better to replicate for nothing.
            if err != 0 {
                1
            } else {
                v
            }
        };
        let found = field(c"connected_slaves") > 0 || field(c"repl_backlog_active") != 0;
        api!(RedisModule_FreeServerInfo)(ctx, info);
        found
    }
}
