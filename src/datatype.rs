//! The lock data type as Redis registers it: its callbacks (RDB save and
//! load, AOF rewrite, digest, memory usage, free; the unlink hook is
//! `notify::on_unlink`) and the token high-water mark carried in the RDB.
//! Above `store` (the value), it may call into the machinery a load sets off
//! (tokens, leases).
//!
//! Every loader (RDB, RESTORE, RLOCK.SETSTATE, a rewritten lock in the AOF)
//! builds the state through `LockState::from_parts`, the one validation; a
//! one-holder lock read straight into its packed form is held to the same
//! rules (`LockState::lone_holds_valid`), both in `encoding::read_whole`.

use std::os::raw::{c_int, c_void};
use std::ptr;

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::ffi::{api, now_ms};
use crate::lock::encoding::{self, Layout, Whole};
use crate::lock::{Compact, Delta, Holder, Kind, LockState, Owner};
use crate::store::{Form, Stored};

/// RDB encoding version of a lock value: 3 is one compact string per lock
/// (`lock::encoding`), Redisson owners packed; 2 (owners as text) and 1 (a
/// framed item per field) still load.
const ENCODING_VERSION: c_int = 3;
const COMPACT_V2_VERSION: c_int = 2;
const FIELDS_VERSION: c_int = 1;

pub static LOCK_TYPE: RedisType = RedisType::new(
    "rlock-lck",
    ENCODING_VERSION,
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(rdb_load),
        rdb_save: Some(rdb_save),
        aof_rewrite: Some(aof_rewrite),
        mem_usage: Some(mem_usage),
        digest: Some(digest),
        free: Some(free),
        aux_load: Some(aux_load),
        aux_save: Some(aux_save),
        aux_save_triggers: raw::REDISMODULE_AUX_BEFORE_RDB as c_int,
        free_effort: Some(free_effort),
        unlink: None,
        copy: None,
        defrag: None,
        mem_usage2: None,
        free_effort2: None,
        unlink2: Some(crate::notify::on_unlink),
        copy2: None,
        aux_save2: None,
    },
);

/// The registered type (after the module's data types were created).
pub fn raw_type() -> *mut raw::RedisModuleType {
    *LOCK_TYPE.raw_type.borrow()
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    crate::ffi::contained("rdb save", (), || {
        with_encoding(Stored::from_raw(value), |bytes| {
            api!(RedisModule_SaveStringBuffer)(rdb, bytes.as_ptr().cast(), bytes.len())
        })
    })
}

/// Hands `f` the compact form of a stored lock (`lock::encoding`, current
/// layout); a packed lock's is built on the stack, from its block.
///
/// # Safety
/// A live value of the lock type.
unsafe fn with_encoding<R>(stored: Stored, f: impl FnOnce(&[u8]) -> R) -> R {
    match stored.form() {
        Form::Packed(c) => f((*c).encode().as_slice()),
        Form::Full(v) => {
            let s = &*v;
            f(&encoding::encode(
                s.kind(),
                s.limit(),
                s.holder_count(),
                s.iter(),
            ))
        }
    }
}

/// Loads a value from an RDB file, a full sync or `RESTORE`. Anything that is
/// not a state the commands could have made is refused: Redis then answers
/// `RESTORE` with "Bad data format" and refuses an RDB file, with this log line.
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    crate::ffi::contained("rdb load", ptr::null_mut(), || {
        let now = crate::role::load_clock_ms();
        let loaded = match load_value(rdb, encver, crate::token::max_accepted(now)) {
            Ok(loaded) => loaded,
            Err(why) => {
                crate::ffi::log_warning(&format!("rlock: refused a lock value: {why}"));
                return ptr::null_mut();
            }
        };
        match loaded {
            Whole::Packed(c) => {
                crate::token::observe(c.token());
                crate::lease::loaded(rdb, Some(c.deadline()), false, now);
                Stored::packed(c).raw()
            }
            Whole::State(state) => {
                state.iter().for_each(|h| crate::token::observe(h.token));
                let (earliest, indexed) = (state.earliest_deadline(), state.is_indexed());
                crate::lease::loaded(rdb, earliest, indexed, now);
                Stored::create(state).raw()
            }
        }
    })
}

unsafe fn load_value(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
    max_token: u64,
) -> Result<Whole, String> {
    let why = |e: &str| e.trim_start_matches("ERR ").to_string();
    let layout = match encver {
        ENCODING_VERSION => Layout::V3,
        COMPACT_V2_VERSION => Layout::V2,
        FIELDS_VERSION => {
            let (kind, limit, holders) = load_fields(rdb)?;
            return LockState::from_parts(kind, limit, holders, max_token)
                .map(Whole::State)
                .map_err(why);
        }
        _ => return Err(format!("unknown encoding version {encver}")),
    };
    let buf = LoadedBuffer::read(rdb)?;
    encoding::read_whole(buf.bytes(), layout, max_token).map_err(why)
}

/// The string `RedisModule_LoadStringBuffer` read, freed on drop.
struct LoadedBuffer(*mut std::os::raw::c_char, usize);

impl LoadedBuffer {
    unsafe fn read(rdb: *mut raw::RedisModuleIO) -> Result<LoadedBuffer, String> {
        let mut len = 0usize;
        let buf = api!(RedisModule_LoadStringBuffer)(rdb, &mut len);
        if buf.is_null() {
            return Err("short read".into());
        }
        let loaded = LoadedBuffer(buf, len);
        if api!(RedisModule_IsIOError)(rdb) != 0 {
            return Err("short read".into());
        }
        Ok(loaded)
    }

    fn bytes(&self) -> &[u8] {
        unsafe { std::slice::from_raw_parts(self.0.cast::<u8>(), self.1) }
    }
}

impl Drop for LoadedBuffer {
    fn drop(&mut self) {
        unsafe { api!(RedisModule_Free)(self.0.cast()) }
    }
}

/// Version 1 predates semaphores: locks only (limit 0).
unsafe fn load_fields(rdb: *mut raw::RedisModuleIO) -> Result<encoding::Decoded, String> {
    let failed = || api!(RedisModule_IsIOError)(rdb) != 0;
    let code = api!(RedisModule_LoadUnsigned)(rdb);
    let count = api!(RedisModule_LoadUnsigned)(rdb);
    if failed() {
        return Err("short read".into());
    }
    let kind = Kind::from_code(code).ok_or(format!("unknown lock kind {code}"))?;
    let mut holders = Vec::new();
    for _ in 0..count {
        let mut len = 0usize;
        let buf = api!(RedisModule_LoadStringBuffer)(rdb, &mut len);
        if buf.is_null() {
            return Err("short read".into());
        }
        let owner = Owner::new(std::slice::from_raw_parts(buf.cast::<u8>(), len));
        api!(RedisModule_Free)(buf.cast());
        let (reads, writes) = (
            api!(RedisModule_LoadUnsigned)(rdb),
            api!(RedisModule_LoadUnsigned)(rdb),
        );
        let (token, deadline) = (
            api!(RedisModule_LoadUnsigned)(rdb),
            api!(RedisModule_LoadSigned)(rdb),
        );
        if failed() {
            return Err("short read".into());
        }
        let count = |n: u64| u32::try_from(n).map_err(|_| "hold count out of range".to_string());
        holders.push(Holder {
            owner,
            reads: count(reads)?,
            writes: count(writes)?,
            token,
            deadline,
        });
    }
    Ok((kind, 0, holders))
}

/// AOF rewrite writes each lock as one `RLOCK.DELTA key <W step>`: the lock
/// in the compact form RDB stores (~37 bytes for a Redisson owner, which
/// Redis keeps as one embedded string while the command loads), read straight
/// back into its block. The key's TTL is not in it: Redis writes its own
/// `PEXPIREAT` after every key that has one.
unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    crate::ffi::contained("aof rewrite", (), || {
        let stored = Stored::from_raw(value);
        let mut delta = Delta::recording(stored.kind());
        with_encoding(stored, |bytes| delta.lock(bytes));
        let bytes = delta.bytes();
        // The key must go through "s": Redis passes a stack-allocated key
        // object here, which "s" copies and "v" would try to retain (a server
        // panic).
        api!(RedisModule_EmitAOF)(
            aof,
            crate::lock::delta::COMMAND.as_ptr(),
            c"sb".as_ptr(),
            key,
            bytes.as_ptr(),
            bytes.len(),
        );
    })
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    crate::ffi::contained("memory usage", 0, || value_bytes(value))
}

unsafe fn value_bytes(value: *const c_void) -> usize {
    let state = match Stored::from_raw(value.cast_mut()).form() {
        Form::Packed(_) => return std::mem::size_of::<Compact>(),
        Form::Full(v) => &*v,
    };
    let heap_owners: usize = state.iter().map(|h| h.owner.heap_bytes()).sum();
    // Indexed: each holder sits in three maps (by token, owner and deadline),
    // its owner twice.
    let per_holder = if state.is_indexed() {
        std::mem::size_of::<Holder>() + std::mem::size_of::<Owner>() + 2 * 16
    } else {
        0
    };
    std::mem::size_of::<LockState>()
        + heap_owners * (1 + state.is_indexed() as usize)
        + per_holder * state.holder_count()
}

unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    crate::ffi::contained("digest", (), || add_to_digest(md, value))
}

unsafe fn add_to_digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    let state = Stored::from_raw(value).state();
    api!(RedisModule_DigestAddLongLong)(md, state.kind().code() as i64);
    api!(RedisModule_DigestAddLongLong)(md, state.limit() as i64);
    api!(RedisModule_DigestEndSequence)(md);
    // Each holder is its own sequence, and Redis mixes sequences order-free.
    for h in state.iter() {
        api!(RedisModule_DigestAddStringBuffer)(md, h.owner.as_ptr().cast(), h.owner.len());
        for n in [h.reads as i64, h.writes as i64, h.token as i64, h.deadline] {
            api!(RedisModule_DigestAddLongLong)(md, n);
        }
        api!(RedisModule_DigestEndSequence)(md);
    }
}

/// Redis frees a value whose effort is above its lazy-free threshold (64) on
/// a background thread when it is removed lazily (`UNLINK`, `FLUSHALL ASYNC`,
/// the `lazyfree-lazy-*` settings): a lock with 100,000 readers took 6 ms of
/// the main thread to free. One unit per holder (its allocations), and at
/// least one: Redis reads 0 as "unknown, free it in the background", which
/// would send every lock the engine deletes once empty (a release, a lease's
/// end) to the background thread under `lazyfree-lazy-server-del` (Valkey's
/// default).
unsafe extern "C" fn free_effort(_key: *mut raw::RedisModuleString, value: *const c_void) -> usize {
    crate::ffi::contained("free effort", 1, || {
        Stored::from_raw(value.cast_mut()).outline().holders.max(1)
    })
}

/// May run on a background thread (lazy free): touches nothing but the value.
unsafe extern "C" fn free(value: *mut c_void) {
    crate::ffi::contained("free", (), || Stored::from_raw(value).free());
}

/// The token high-water mark travels in the RDB, ahead of the keys.
unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    crate::ffi::contained("aux save", (), || {
        if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
            api!(RedisModule_SaveUnsigned)(rdb, crate::token::last());
        }
    })
}

unsafe extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    crate::ffi::contained("aux load", crate::ffi::ERR, || {
        load_high_water_mark(rdb, encver, when)
    })
}

unsafe fn load_high_water_mark(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
    let known = (FIELDS_VERSION..=ENCODING_VERSION).contains(&encver);
    if !known || when != raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
        return crate::ffi::ERR;
    }
    let last = api!(RedisModule_LoadUnsigned)(rdb);
    if api!(RedisModule_IsIOError)(rdb) != 0 {
        return crate::ffi::ERR;
    }
    // A high-water mark out of range would poison every later token: ignored.
    if last <= crate::token::max_accepted(now_ms()) {
        crate::token::observe(last);
    } else {
        crate::ffi::log_warning("rlock: ignored an out-of-range token high-water mark in the RDB");
    }
    crate::ffi::OK
}
