//! rlock: distributed locks as native Redis commands.
//!
//! This file only registers things with Redis. The lock algorithms are in
//! `lock` (pure, no FFI); `engine` applies them to keys; `blocking`, `lease`,
//! `store`, `notify` and `token` are the Redis-facing machinery they share.

mod answered;
mod blocking;
mod commands;
mod config;
mod datatype;
mod deadlock;
mod docs;
mod effect;
mod engine;
mod events;
mod eviction;
mod ffi;
mod keepalive;
mod lease;
pub mod lock;
mod min_replicas;
mod notify;
mod role;
mod stats;
mod store;
mod timer;
mod token;
mod waker;

use std::ffi::CString;
use std::os::raw::c_int;

use redis_module::configuration::ConfigurationFlags;
use redis_module::{redis_module, Context, RedisString, Status};

use crate::datatype::LOCK_TYPE;
use crate::ffi::{api, Ctx, RStr};
use crate::lock::Kind;

// Unit tests run without Redis, so they keep the system allocator.
#[cfg(not(test))]
type ModuleAllocator = redis_module::alloc::RedisAlloc;
#[cfg(not(test))]
const MODULE_ALLOCATOR: ModuleAllocator = redis_module::alloc::RedisAlloc;
#[cfg(test)]
type ModuleAllocator = std::alloc::System;
#[cfg(test)]
const MODULE_ALLOCATOR: ModuleAllocator = std::alloc::System;

type Handler = unsafe extern "C" fn(*mut Ctx, *mut *mut RStr, c_int) -> c_int;

macro_rules! handler {
    ($f:path, $kind:expr) => {{
        unsafe extern "C" fn h(ctx: *mut Ctx, argv: *mut *mut RStr, argc: c_int) -> c_int {
            commands::run(ctx, argv, argc, |c, a| $f(c, a, $kind))
        }
        h as Handler
    }};
}

macro_rules! family {
    ($prefix:literal, $kind:expr) => {
        [
            (
                concat!($prefix, ".acquire"),
                handler!(commands::acquire, $kind),
                "write deny-oom blocking",
            ),
            (
                concat!($prefix, ".release"),
                handler!(commands::release, $kind),
                "write",
            ),
            (
                concat!($prefix, ".renew"),
                handler!(commands::renew, $kind),
                "write",
            ),
            (
                concat!($prefix, ".forcerelease"),
                handler!(commands::force_release, $kind),
                "write",
            ),
            (
                concat!($prefix, ".info"),
                handler!(commands::info, $kind),
                "readonly",
            ),
        ]
    };
}

unsafe extern "C" fn setstate_handler(ctx: *mut Ctx, argv: *mut *mut RStr, argc: c_int) -> c_int {
    commands::run(ctx, argv, argc, commands::setstate)
}

macro_rules! multi_key {
    ($f:path) => {{
        unsafe extern "C" fn h(ctx: *mut Ctx, argv: *mut *mut RStr, argc: c_int) -> c_int {
            if api!(RedisModule_IsKeysPositionRequest)(ctx) != 0 {
                return commands::report_key_positions(ctx, argv, argc);
            }
            commands::run(ctx, argv, argc, $f)
        }
        h as Handler
    }};
}

unsafe extern "C" fn delta_handler(ctx: *mut Ctx, argv: *mut *mut RStr, argc: c_int) -> c_int {
    commands::run(ctx, argv, argc, commands::delta)
}

unsafe extern "C" fn deltas_handler(ctx: *mut Ctx, argv: *mut *mut RStr, argc: c_int) -> c_int {
    commands::run(ctx, argv, argc, commands::deltas)
}

/// Every command takes its one key at position 1, except `RLOCK.DELTAS`
/// (`key delta` pairs: every other argument from 1 on) and the multi-key
/// commands (`numkeys key [key ...]`): ACL and `COMMAND GETKEYS` find their
/// keys through the key spec set by `docs::describe`; Redis Cluster's routing
/// (which on 7.0 and 8.2 reads only the legacy key range, here 0, 0, 0) asks
/// the command itself (`getkeys-api`).
fn register_commands(ctx: *mut Ctx) -> bool {
    let families = [
        family!("rlock", Kind::Reentrant),
        family!("fairlock", Kind::Fair),
        family!("rwlock", Kind::ReadWrite),
        family!("semaphore", Kind::Semaphore),
    ];
    let internal = [
        (
            "rlock.setstate",
            setstate_handler as Handler,
            "write deny-oom",
        ),
        ("rlock.delta", delta_handler as Handler, "write deny-oom"),
    ];
    let multi_key = [
        (
            "rlock.acquireall",
            multi_key!(commands::acquire_all),
            "write deny-oom blocking getkeys-api",
        ),
        (
            "rlock.releaseall",
            multi_key!(commands::release_all),
            "write getkeys-api",
        ),
        (
            "rlock.renewall",
            multi_key!(commands::renew_all),
            "write getkeys-api",
        ),
    ];
    // `key delta` pairs: keys at 1, 3, 5...
    let pairs = ("rlock.deltas", deltas_handler as Handler, "write deny-oom");
    let one_key = families.iter().flatten().chain(internal.iter());
    let create = |(name, handler, flags): &(&str, Handler, &str), (first, last, step)| {
        let (name, flags) = (CString::new(*name).unwrap(), CString::new(*flags).unwrap());
        (unsafe {
            api!(RedisModule_CreateCommand)(
                ctx,
                name.as_ptr(),
                Some(*handler),
                flags.as_ptr(),
                first,
                last,
                step,
            ) == ffi::OK
        }) && docs::describe(ctx, &name)
    };
    one_key.into_iter().all(|c| create(c, (1, 1, 1)))
        && create(&pairs, (1, -1, 2))
        && multi_key.iter().all(|c| create(c, (0, 0, 0)))
}

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    let args: Vec<&[u8]> = args.iter().map(|a| a.as_slice()).collect();
    if let Err(e) = config::apply_module_args(&args) {
        ctx.log_warning(&format!("rlock: {e}"));
        return Status::Err;
    }
    store::set_lock_type(datatype::raw_type());
    // Loaders check every read (RESTORE and RDB payloads are untrusted input).
    // A key opened for writing is not signalled as modified when closed: a
    // lock command opens its key for writing before it knows whether it will
    // change anything, and a busy ACQUIRE must not abort a `WATCH` on the key:
    // the engine signals real changes.
    let options = redis_module::raw::REDISMODULE_OPTIONS_HANDLE_IO_ERRORS
        | redis_module::raw::REDISMODULE_OPTION_NO_IMPLICIT_SIGNAL_MODIFIED;
    unsafe { api!(RedisModule_SetModuleOptions)(ctx.ctx, options as c_int) };
    // Replaces the crate's default INFO callback with the `rlock` section.
    let info = unsafe { api!(RedisModule_RegisterInfoFunc)(ctx.ctx, Some(stats::info)) } == ffi::OK;
    if info && register_commands(ctx.ctx) && events::subscribe(ctx.ctx) {
        Status::Ok
    } else {
        Status::Err
    }
}

redis_module! {
    name: "rlock",
    version: 1,
    allocator: (ModuleAllocator, MODULE_ALLOCATOR),
    data_types: [LOCK_TYPE],
    init: init,
    configurations: [
        i64: [
            ["default-lease-ms", &config::DEFAULT_LEASE_MS, 30_000, 1, config::MAX_LEASE_MS, ConfigurationFlags::DEFAULT, None],
            ["deadlock-check-ms", &config::DEADLOCK_CHECK_MS, 1000, 0, config::MAX_LEASE_MS, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [
            ["notify-channel", &config::NOTIFY_CHANNEL, true, ConfigurationFlags::DEFAULT, None],
            ["notify-keyspace", &config::NOTIFY_KEYSPACE, true, ConfigurationFlags::DEFAULT, None],
        ],
        enum: [],
        // loadmodule arguments are validated by config::apply_module_args.
        module_args_as_configuration: false,
    ]
}
