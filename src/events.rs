//! Server events that move the lease machinery: loading done, role changed,
//! databases flushed or swapped, configs changed.

use std::os::raw::c_void;

use redis_module::raw::{self, RedisModuleEvent};

use crate::ffi::{api, now_ms, select_db, Ctx, Key, OwnedStr, OK};
use crate::{blocking, eviction, keepalive, lease, min_replicas, role, token};

unsafe extern "C" fn on_role_change(
    ctx: *mut Ctx,
    _eid: RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    crate::ffi::contained("role change", (), || {
        role::refresh(ctx);
        role::listener_seen();
        if subevent == raw::REDISMODULE_EVENT_REPLROLECHANGED_NOW_MASTER {
            // Promotion: a new token epoch, above the deposed master's.
            token::start_epoch(now_ms());
            // This server now expires leases and serves waiters.
            lease::resume(ctx);
        } else {
            lease::pause(ctx);
            // Connections do not follow a role change: holdings keep their
            // last replicated deadline.
            keepalive::clear();
        }
    })
}

unsafe extern "C" fn on_loading(
    ctx: *mut Ctx,
    _eid: RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    crate::ffi::contained("loading", (), || match subevent {
        raw::REDISMODULE_SUBEVENT_LOADING_ENDED | raw::REDISMODULE_SUBEVENT_LOADING_FAILED => {
            // After a restart or a full sync: a new token epoch (see token.rs).
            token::start_epoch(now_ms());
            role::set_loading(false);
            role::refresh(ctx);
            lease::resume(ctx);
        }
        _ => {
            role::set_loading(true);
            // A reloaded holding is not bound (SPEC: restarts keep no bindings).
            keepalive::clear();
        }
    })
}

thread_local! {
    /// The queued keys a flush found holding a value as it started.
    static FLUSHED: std::cell::RefCell<Vec<(i32, Vec<u8>)>> =
        const { std::cell::RefCell::new(Vec::new()) };
}

/// After FLUSHDB/FLUSHALL the lock values are gone but their waiters are not:
/// those of a key that held a value are told to retry. The check is deferred
/// because DEBUG RELOAD flushes too, then loads the same locks back, and its
/// waiters should keep waiting. A key that only waiters have (a multi-key
/// reservation) lost nothing: its waiters keep waiting, as they would have.
unsafe extern "C" fn on_flush(
    ctx: *mut Ctx,
    _eid: RedisModuleEvent,
    subevent: u64,
    data: *mut c_void,
) {
    crate::ffi::contained("flush", (), || {
        if data.is_null() {
            return;
        }
        let info = &*(data as *const raw::RedisModuleFlushInfo);
        let db = (info.dbnum != -1).then_some(info.dbnum);
        if subevent == raw::REDISMODULE_SUBEVENT_FLUSHDB_START {
            let held = blocking::queued_keys(db)
                .into_iter()
                .filter(|(db, key)| holds_value(ctx, *db, key))
                .collect();
            FLUSHED.with(|f| *f.borrow_mut() = held);
            return;
        }
        lease::forget_db(db);
        for (db, key) in FLUSHED.with(|f| std::mem::take(&mut *f.borrow_mut())) {
            lease::schedule_serve(ctx, db, &key, lease::IfAbsent::Retry);
        }
    })
}

fn holds_value(ctx: *mut Ctx, db: i32, key: &[u8]) -> bool {
    let name = OwnedStr::new(key);
    select_db(ctx, db) && !Key::open(ctx, name.ptr(), false).is_empty()
}

/// SWAPDB: the values of two databases traded numbers; clients did not (each
/// stays in the database it selected), so neither did the parked waiters.
/// Lease deadlines and KEEPALIVE bindings follow their values; every queue of
/// the two databases is then served against what its database holds now: an
/// absent key means retry, a lock of the waiters' family is waited on (and
/// watched at its own deadlines), anything else is WRONGTYPE.
unsafe extern "C" fn on_swapdb(
    ctx: *mut Ctx,
    _eid: RedisModuleEvent,
    _sub: u64,
    data: *mut c_void,
) {
    crate::ffi::contained("swapdb", (), || {
        if data.is_null() {
            return;
        }
        let info = &*(data as *const raw::RedisModuleSwapDbInfo);
        let (a, b) = (info.dbnum_first, info.dbnum_second);
        // `SWAPDB n n` succeeds and changes nothing.
        if a == b {
            return;
        }
        lease::swap_dbs(a, b);
        keepalive::swap_dbs(a, b);
        for (db, key) in [a, b]
            .into_iter()
            .flat_map(|db| blocking::queued_keys(Some(db)))
        {
            lease::schedule_serve(ctx, db, &key, lease::IfAbsent::Retry);
        }
    })
}

/// A child was forked: if it is a replica's full sync, effects must go out.
unsafe extern "C" fn on_fork(
    ctx: *mut Ctx,
    _eid: RedisModuleEvent,
    subevent: u64,
    _data: *mut c_void,
) {
    crate::ffi::contained("fork", (), || {
        if subevent == raw::REDISMODULE_SUBEVENT_FORK_CHILD_BORN {
            role::refresh(ctx);
        }
    })
}

unsafe extern "C" fn on_replica_change(
    _ctx: *mut Ctx,
    _eid: RedisModuleEvent,
    _sub: u64,
    _data: *mut c_void,
) {
    crate::ffi::contained("replica change", (), || {
        role::listener_seen();
        min_replicas::replicas_changed();
    })
}

/// A client connected or disconnected: a closed connection ends the
/// KEEPALIVE holdings bound to it.
unsafe extern "C" fn on_client_change(
    ctx: *mut Ctx,
    _eid: RedisModuleEvent,
    sub: u64,
    data: *mut c_void,
) {
    crate::ffi::contained("client change", (), || {
        if sub == raw::REDISMODULE_SUBEVENT_CLIENT_CHANGE_DISCONNECTED && !data.is_null() {
            let info = &*(data as *const raw::RedisModuleClientInfo);
            keepalive::client_gone(ctx, info.id);
        }
    })
}

/// serverCron ticked: keeps the min-replicas verdict fresh (when configured).
unsafe extern "C" fn on_cron(ctx: *mut Ctx, _eid: RedisModuleEvent, _sub: u64, _data: *mut c_void) {
    crate::ffi::contained("cron", (), || {
        min_replicas::on_cron();
        crate::deadlock::on_cron(ctx);
    })
}

/// CONFIG SET: min-replicas-* may have changed.
unsafe extern "C" fn on_config_change(
    ctx: *mut Ctx,
    _eid: RedisModuleEvent,
    _sub: u64,
    _data: *mut c_void,
) {
    crate::ffi::contained("config change", (), || {
        min_replicas::read_config(ctx);
        eviction::check(ctx);
    })
}

pub fn subscribe(ctx: *mut Ctx) -> bool {
    crate::ffi::init_module_context(ctx);
    role::refresh(ctx);
    min_replicas::read_config(ctx);
    eviction::check(ctx);
    // The first token epoch starts at load (a restart with no dataset
    // fires no loading event).
    token::start_epoch(now_ms());
    let events: [(u64, raw::RedisModuleEventCallback); 9] = [
        (
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            Some(on_role_change),
        ),
        (raw::REDISMODULE_EVENT_LOADING, Some(on_loading)),
        (raw::REDISMODULE_EVENT_FLUSHDB, Some(on_flush)),
        (raw::REDISMODULE_EVENT_SWAPDB, Some(on_swapdb)),
        (raw::REDISMODULE_EVENT_FORK_CHILD, Some(on_fork)),
        (
            raw::REDISMODULE_EVENT_REPLICA_CHANGE,
            Some(on_replica_change),
        ),
        (raw::REDISMODULE_EVENT_CONFIG, Some(on_config_change)),
        (raw::REDISMODULE_EVENT_CRON_LOOP, Some(on_cron)),
        (raw::REDISMODULE_EVENT_CLIENT_CHANGE, Some(on_client_change)),
    ];
    // No keyspace-event subscription: the type's unlink hook sees every removal
    // of a lock key, and other keys' events never call into the module.
    events.into_iter().all(|(id, cb)| unsafe {
        api!(RedisModule_SubscribeToServerEvent)(ctx, RedisModuleEvent { id, dataver: 1 }, cb) == OK
    })
}
