//! The lock data type: one module type for every lock family (the family lives
//! in the value). RDB save/load, AOF rewrite, digest, memory usage, free.
//!
//! Only held state is stored. Waiters are live connections and belong to
//! `blocking`. Every loader (RDB, RESTORE, RLOCK.SETSTATE) builds the state
//! through `LockState::from_holders`, the one validation; a one-holder lock
//! read straight into its packed form is held to the same rules
//! (`LockState::lone_holds_valid`).

use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::atomic::Ordering;

use redis_module::native_types::RedisType;
use redis_module::raw;

use crate::ffi::{api, now_ms, Key};
use crate::lock::encoding::{self, Layout};
use crate::lock::{err, Compact, Delta, Holder, Kind, LockState, Owner};
use crate::stats;

/// RDB encoding version of a lock value: 3 is one compact string per lock
/// (`lock::encoding`), Redisson owners packed; 2 (owners as text) and 1 (a
/// framed item per field) still load.
pub const ENCODING_VERSION: c_int = 3;
const COMPACT_V2_VERSION: c_int = 2;
const FIELDS_VERSION: c_int = 1;

/// A lock key's value as Redis holds it: a boxed `LockState`, or a
/// one-holder lock packed into a `Compact` block (48 bytes against 80),
/// marked by the low bit of the pointer (both blocks are 8-aligned).
#[derive(Clone, Copy)]
pub struct Stored(*mut c_void);

const PACKED: usize = 1;

pub enum Form {
    Full(*mut LockState),
    Packed(*mut Compact),
}

/// A stored lock's state: borrowed, or unpacked from a `Compact`.
pub enum StateRef<'a> {
    Full(&'a LockState),
    Unpacked(LockState),
}

impl std::ops::Deref for StateRef<'_> {
    type Target = LockState;

    fn deref(&self) -> &LockState {
        match self {
            StateRef::Full(s) => s,
            StateRef::Unpacked(s) => s,
        }
    }
}

impl Stored {
    pub fn from_raw(p: *mut c_void) -> Stored {
        Stored(p)
    }

    pub fn raw(self) -> *mut c_void {
        self.0
    }

    /// The value for `state`: packed when it fits.
    pub fn create(mut state: LockState) -> Stored {
        Stored::create_from(&mut state)
    }

    /// As `create`; a packed value leaves `state` as it was, a boxed one takes it.
    fn create_from(state: &mut LockState) -> Stored {
        match Compact::pack(state) {
            Some(c) => Stored::packed(c),
            None => {
                stats::LOCKS.fetch_add(1, Ordering::Relaxed);
                Stored(boxed(state).cast())
            }
        }
    }

    pub fn packed(c: Compact) -> Stored {
        stats::LOCKS.fetch_add(1, Ordering::Relaxed);
        Stored(Box::into_raw(Box::new(c)).map_addr(|a| a | PACKED).cast())
    }

    pub fn form(self) -> Form {
        if self.0.addr() & PACKED != 0 {
            Form::Packed(self.0.map_addr(|a| a & !PACKED).cast())
        } else {
            Form::Full(self.0.cast())
        }
    }

    /// # Safety
    /// A live value of the lock type.
    pub unsafe fn kind(self) -> Kind {
        match self.form() {
            Form::Full(v) => (*v).kind(),
            Form::Packed(c) => (*c).kind(),
        }
    }

    /// # Safety
    /// A live value of the lock type, not changed while the result lives.
    pub unsafe fn state<'a>(self) -> StateRef<'a> {
        match self.form() {
            Form::Full(v) => StateRef::Full(&*v),
            Form::Packed(c) => StateRef::Unpacked((*c).unpack()),
        }
    }

    /// # Safety
    /// A live value of the lock type.
    pub unsafe fn outline(self) -> Outline {
        match self.form() {
            Form::Full(v) => Outline {
                kind: (*v).kind(),
                holders: (*v).holder_count(),
                latest_deadline: (*v).latest_deadline(),
            },
            Form::Packed(c) => Outline {
                kind: (*c).kind(),
                holders: (*c).holder_count(),
                latest_deadline: Some((*c).deadline()).filter(|_| (*c).holder_count() > 0),
            },
        }
    }

    /// # Safety
    /// A live value of the lock type, no longer in the keyspace.
    pub unsafe fn free(self) {
        stats::LOCKS.fetch_sub(1, Ordering::Relaxed);
        match self.form() {
            Form::Full(v) => drop(Box::from_raw(v)),
            Form::Packed(c) => drop(Box::from_raw(c)),
        }
    }
}

/// Stores `state` at an open key that holds no value: packed when it fits,
/// else boxed (returned, to read the state from).
///
/// # Safety
/// `key` is open for writing and empty.
pub unsafe fn put(key: &Key, state: &mut LockState) -> Option<*mut LockState> {
    let stored = Stored::create_from(state);
    api!(RedisModule_ModuleTypeSetValue)(key.raw, lock_type(), stored.raw());
    match stored.form() {
        Form::Full(p) => Some(p),
        Form::Packed(_) => None,
    }
}

/// Writes a changed packed lock back: in its block when it still fits, else
/// as a boxed state (returned) in place of the block.
///
/// # Safety
/// `key` is open for writing and holds `block`.
pub unsafe fn repack(
    key: &Key,
    block: *mut Compact,
    state: &mut LockState,
) -> Option<*mut LockState> {
    if let Some(packed) = Compact::pack(state) {
        *block = packed;
        return None;
    }
    let full = boxed(state);
    let mut old = ptr::null_mut();
    api!(RedisModule_ModuleTypeReplaceValue)(key.raw, lock_type(), full.cast(), &mut old);
    drop(Box::from_raw(block));
    Some(full)
}

/// Moves `state` into a box of its own (leaving an empty state behind).
fn boxed(state: &mut LockState) -> *mut LockState {
    Box::into_raw(Box::new(std::mem::replace(
        state,
        LockState::new(state.kind()),
    )))
}

/// What the unlink hook reads of a value leaving the keyspace, without
/// unpacking it (an expiry storm reads half a million).
pub struct Outline {
    pub kind: Kind,
    pub holders: usize,
    pub latest_deadline: Option<i64>,
}

/// The lock at an open key: `Err(())` if the key holds anything else.
pub fn lock_at(key: &Key) -> Result<Option<Stored>, ()> {
    Ok(key
        .module_value::<c_void>(lock_type())?
        .map(Stored::from_raw))
}

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
        free_effort: None,
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

pub fn lock_type() -> *mut raw::RedisModuleType {
    *LOCK_TYPE.raw_type.borrow()
}

/// Parses `RLOCK.SETSTATE key kind n [owner reads writes token deadline]...`
/// after the key (AOF files of earlier versions). Strict: anything else is an error.
pub fn parse_setstate(args: &[&[u8]], max_token: u64) -> Result<LockState, &'static str> {
    fn num<T: std::str::FromStr>(b: &[u8]) -> Result<T, &'static str> {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("ERR invalid number in RLOCK.SETSTATE")
    }
    let (kind, count, rest) = match args {
        [kind, count, rest @ ..] => (kind, count, rest),
        _ => return Err("ERR wrong number of arguments for 'rlock.setstate' command"),
    };
    let kind = Kind::from_name(kind).ok_or("ERR unknown lock kind in RLOCK.SETSTATE")?;
    let count: usize = num(count)?;
    if rest.len() != count.saturating_mul(5) {
        return Err("ERR wrong number of arguments for 'rlock.setstate' command");
    }
    let holders = rest
        .chunks(5)
        .map(|h| {
            Ok(Holder {
                owner: h[0].into(),
                reads: num(h[1])?,
                writes: num(h[2])?,
                token: num(h[3])?,
                deadline: num(h[4])?,
            })
        })
        .collect::<Result<Vec<_>, &'static str>>()?;
    LockState::from_holders(kind, holders, max_token)
        .map_err(|_| "ERR invalid holder in RLOCK.SETSTATE")
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    let save =
        |bytes: &[u8]| api!(RedisModule_SaveStringBuffer)(rdb, bytes.as_ptr().cast(), bytes.len());
    match Stored::from_raw(value).form() {
        Form::Packed(c) => save((*c).encode().as_slice()),
        Form::Full(v) => {
            let s = &*v;
            save(&encoding::encode(
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
        // One clock read per value: a load reads millions of them.
        let now = now_ms();
        let loaded = match load_value(rdb, encver, crate::token::max_accepted(now)) {
            Ok(loaded) => loaded,
            Err(why) => {
                crate::ffi::log_warning(&format!("rlock: refused a lock value: {why}"));
                return ptr::null_mut();
            }
        };
        match loaded {
            Loaded::Packed(c) => {
                crate::token::observe(c.token());
                crate::lease::loaded(rdb, Some(c.deadline()), false, now);
                Stored::packed(c).raw()
            }
            Loaded::State(state) => {
                state.iter().for_each(|h| crate::token::observe(h.token));
                let (earliest, indexed) = (state.earliest_deadline(), state.is_indexed());
                crate::lease::loaded(rdb, earliest, indexed, now);
                Stored::create(state).raw()
            }
        }
    })
}

/// A loaded value: already packed (the common lock, read straight into its
/// block), or a state.
enum Loaded {
    Packed(Compact),
    State(LockState),
}

unsafe fn load_value(
    rdb: *mut raw::RedisModuleIO,
    encver: c_int,
    max_token: u64,
) -> Result<Loaded, String> {
    let invalid = || err::INVALID_STATE.trim_start_matches("ERR ").to_string();
    let (kind, limit, holders) = match encver {
        ENCODING_VERSION | COMPACT_V2_VERSION => {
            let buf = LoadedBuffer::read(rdb)?;
            let layout = match encver {
                ENCODING_VERSION => Layout::V3,
                _ => Layout::V2,
            };
            let packed = (layout == Layout::V3).then(|| Compact::decode(buf.bytes()));
            if let Some(c) = packed.flatten() {
                return c
                    .is_valid(max_token)
                    .then_some(Loaded::Packed(c))
                    .ok_or_else(invalid);
            }
            encoding::decode(buf.bytes(), layout).ok_or("malformed lock encoding")?
        }
        FIELDS_VERSION => load_fields(rdb)?,
        _ => return Err(format!("unknown encoding version {encver}")),
    };
    LockState::from_parts(kind, limit, holders, max_token)
        .map(Loaded::State)
        .map_err(|_| invalid())
}

/// The string `RedisModule_LoadStringBuffer` read, freed on drop.
struct LoadedBuffer(*mut std::os::raw::c_char, usize);

impl LoadedBuffer {
    unsafe fn read(rdb: *mut raw::RedisModuleIO) -> Result<LoadedBuffer, String> {
        let mut len = 0usize;
        let buf = api!(RedisModule_LoadStringBuffer)(rdb, &mut len);
        if buf.is_null() || api!(RedisModule_IsIOError)(rdb) != 0 {
            return Err("short read".into());
        }
        Ok(LoadedBuffer(buf, len))
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

/// AOF rewrite writes each lock as one `RLOCK.DELTA key <S steps>`: every
/// holder as it stands (after a semaphore's limit), in the compact form
/// replication uses (the rewritten file is loaded into an empty keyspace,
/// where the steps rebuild the lock).
unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    let state = Stored::from_raw(value).state();
    let mut delta = Delta::recording(state.kind());
    if state.kind() == Kind::Semaphore {
        delta.limit(state.limit());
    }
    state.iter().for_each(|h| delta.whole(h));
    let bytes = delta.bytes();
    // The key must go through "s": Redis passes a stack-allocated key object
    // here, which "s" copies and "v" would try to retain (a server panic).
    api!(RedisModule_EmitAOF)(
        aof,
        crate::lock::delta::COMMAND.as_ptr(),
        c"sb".as_ptr(),
        key,
        bytes.as_ptr(),
        bytes.len(),
    );
}

unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
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

/// May run on a background thread (lazy free): touches nothing but the value.
unsafe extern "C" fn free(value: *mut c_void) {
    Stored::from_raw(value).free();
}

/// The token high-water mark travels in the RDB, ahead of the keys.
unsafe extern "C" fn aux_save(rdb: *mut raw::RedisModuleIO, when: c_int) {
    if when == raw::REDISMODULE_AUX_BEFORE_RDB as c_int {
        api!(RedisModule_SaveUnsigned)(rdb, crate::token::last());
    }
}

unsafe extern "C" fn aux_load(rdb: *mut raw::RedisModuleIO, encver: c_int, when: c_int) -> c_int {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_is_packed_only_when_it_fits_and_reads_back_the_same() {
        let one = |owner: &[u8]| {
            let h = Holder {
                owner: Owner::new(owner),
                reads: 0,
                writes: 1,
                token: 7,
                deadline: 100,
            };
            LockState::from_holders(Kind::Reentrant, [h], 100).unwrap()
        };
        for (state, packed) in [(one(b"short"), true), (one(&[b'o'; 25]), false)] {
            let stored = Stored::create(state.clone());
            assert_eq!(matches!(stored.form(), Form::Packed(_)), packed);
            unsafe {
                assert_eq!(*stored.state(), state);
                assert_eq!(stored.kind(), Kind::Reentrant);
                let outline = stored.outline();
                assert_eq!(outline.holders, 1);
                assert_eq!(outline.latest_deadline, Some(100));
                stored.free();
            }
        }
    }

    #[test]
    fn setstate_parse_rejects_malformed_input() {
        let ok: Vec<&[u8]> = vec![
            b"rwlock", b"2", b"a", b"1", b"0", b"7", b"100", b"b", b"2", b"0", b"8", b"200",
        ];
        let s = parse_setstate(&ok, 100).unwrap();
        assert_eq!(s.holder_count(), 2);
        assert_eq!(s.holder(b"b").unwrap().reads, 2);
        for bad in [
            vec![&b"rlock"[..]],
            vec![&b"nolock"[..], b"0"],
            vec![&b"rlock"[..], b"0"],
            vec![&b"rlock"[..], b"1", b"a", b"0", b"1", b"7"],
            vec![&b"rlock"[..], b"1", b"a", b"0", b"0", b"7", b"100"],
            vec![&b"rlock"[..], b"1", b"", b"0", b"1", b"7", b"100"],
            vec![&b"rlock"[..], b"1", b"a", b"1", b"1", b"7", b"100"],
            vec![&b"rlock"[..], b"1", b"a", b"0", b"1", b"x", b"100"],
            vec![&b"rlock"[..], b"1", b"a", b"0", b"1", b"101", b"100"],
            vec![&b"rlock"[..], b"1", b"a", b"0", b"4294967296", b"7", b"100"],
        ] {
            assert!(parse_setstate(&bad, 100).is_err(), "{bad:?}");
        }
    }
}
