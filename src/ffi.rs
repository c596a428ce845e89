//! Thin, safe-ish wrappers over the raw module API that the rest of the crate
//! shares: strings, keys, context flags, replies, and panic containment.

use std::os::raw::{c_char, c_int};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr;

use redis_module::raw;
pub use redis_module::raw::{RedisModuleCtx as Ctx, RedisModuleString as RStr};

/// Calls a module API function; all of them are filled in before `OnLoad` returns.
macro_rules! api {
    ($name:ident) => {
        redis_module::raw::$name.expect(concat!(stringify!($name), " is not available"))
    };
}
pub(crate) use api;

pub const OK: c_int = raw::REDISMODULE_OK as c_int;
pub const ERR: c_int = raw::REDISMODULE_ERR as c_int;

/// Current unix time in milliseconds, as Redis sees it.
pub fn now_ms() -> i64 {
    unsafe { api!(RedisModule_Milliseconds)() }
}

/// Current unix time in microseconds, on the clock Redis's timers use.
pub fn micros() -> i64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    ts.tv_sec * 1_000_000 + ts.tv_nsec / 1_000
}

/// # Safety
/// `s` must be a live module string; the slice must not outlive it.
#[inline]
pub unsafe fn bytes<'a>(s: *const RStr) -> &'a [u8] {
    let mut len = 0usize;
    let p = api!(RedisModule_StringPtrLen)(s, &mut len);
    if p.is_null() || len == 0 {
        return &[];
    }
    std::slice::from_raw_parts(p.cast::<u8>(), len)
}

/// A module string this crate created and must free. Transparent: a slice of
/// them is an argument vector Redis can read.
#[repr(transparent)]
pub struct OwnedStr(*mut RStr);

impl OwnedStr {
    pub fn new(data: &[u8]) -> Self {
        OwnedStr(unsafe {
            api!(RedisModule_CreateString)(
                ptr::null_mut(),
                data.as_ptr().cast::<c_char>(),
                data.len(),
            )
        })
    }

    /// Keeps a string Redis lent to a callback past the callback: one more
    /// reference to it, or a copy where Redis's is static (on its stack).
    pub fn hold(s: *const RStr) -> Self {
        OwnedStr(unsafe { api!(RedisModule_HoldString)(ptr::null_mut(), s.cast_mut()) })
    }

    pub fn ptr(&self) -> *mut RStr {
        self.0
    }

    /// Keeps the string for the life of the process.
    pub fn leak(self) -> *mut RStr {
        let s = self.0;
        std::mem::forget(self);
        s
    }
}

impl Drop for OwnedStr {
    fn drop(&mut self) {
        unsafe { api!(RedisModule_FreeString)(ptr::null_mut(), self.0) }
    }
}

pub fn ctx_flags(ctx: *mut Ctx) -> u32 {
    unsafe { api!(RedisModule_GetContextFlags)(ctx) as u32 }
}

pub fn selected_db(ctx: *mut Ctx) -> i32 {
    unsafe { api!(RedisModule_GetSelectedDb)(ctx) }
}

pub fn select_db(ctx: *mut Ctx, db: i32) -> bool {
    unsafe { api!(RedisModule_SelectDb)(ctx, db) == OK }
}

/// An open key, closed when dropped.
pub struct Key {
    pub raw: *mut raw::RedisModuleKey,
}

impl Key {
    pub fn open(ctx: *mut Ctx, name: *mut RStr, write: bool) -> Key {
        let mode = raw::REDISMODULE_READ | if write { raw::REDISMODULE_WRITE } else { 0 };
        let raw = unsafe { api!(RedisModule_OpenKey)(ctx, name, mode as c_int) };
        Key { raw: raw.cast() }
    }

    pub fn is_empty(&self) -> bool {
        self.raw.is_null()
            || unsafe { api!(RedisModule_KeyType)(self.raw) }
                == raw::REDISMODULE_KEYTYPE_EMPTY as c_int
    }

    /// The module value if the key holds one of `ty`; `Err(())` if it holds anything else.
    pub fn module_value<T>(&self, ty: *mut raw::RedisModuleType) -> Result<Option<*mut T>, ()> {
        if self.is_empty() {
            return Ok(None);
        }
        unsafe {
            if api!(RedisModule_KeyType)(self.raw) != raw::REDISMODULE_KEYTYPE_MODULE as c_int
                || api!(RedisModule_ModuleTypeGetType)(self.raw) != ty
            {
                return Err(());
            }
            Ok(Some(api!(RedisModule_ModuleTypeGetValue)(self.raw).cast()))
        }
    }
}

impl Drop for Key {
    fn drop(&mut self) {
        if !self.raw.is_null() {
            unsafe { api!(RedisModule_CloseKey)(self.raw) }
        }
    }
}

/// A reply built by pure code and written out in one place.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    Int(i64),
    Null,
    /// The null of a command whose answer is an array (`*-1` to RESP2
    /// clients, as Redis's `BLPOP` times out); RESP3 has one null.
    NullArray,
    Bulk(Vec<u8>),
    Simple(&'static std::ffi::CStr),
    /// Most errors are fixed strings: no allocation for them.
    Error(std::borrow::Cow<'static, str>),
    Array(Vec<Reply>),
    /// A RESP3 map; Redis flattens it to a field-value array for RESP2 clients.
    Map(Vec<(&'static str, Reply)>),
    /// The client was blocked; it is answered later.
    Parked,
}

impl Reply {
    /// Errors are the rare outcome: kept out of line, so that the paths that
    /// succeed stay short in the instruction cache.
    #[cold]
    #[inline(never)]
    pub fn err(msg: impl Into<std::borrow::Cow<'static, str>>) -> Reply {
        Reply::Error(msg.into())
    }
}

/// Writes `reply`, consumed: the common integer (a token, a count) goes out
/// without the general writer and with nothing to drop.
pub fn send_owned(ctx: *mut Ctx, reply: Reply) {
    // An integer owns nothing: not dropping it skips the drop glue's call.
    let reply = std::mem::ManuallyDrop::new(reply);
    if let Reply::Int(v) = *reply {
        unsafe { api!(RedisModule_ReplyWithLongLong)(ctx, v) };
        return;
    }
    send_other(ctx, std::mem::ManuallyDrop::into_inner(reply));
}

#[inline(never)]
fn send_other(ctx: *mut Ctx, reply: Reply) {
    send(ctx, &reply)
}

pub fn send(ctx: *mut Ctx, reply: &Reply) {
    unsafe {
        match reply {
            Reply::Int(v) => {
                api!(RedisModule_ReplyWithLongLong)(ctx, *v);
            }
            Reply::Null => {
                api!(RedisModule_ReplyWithNull)(ctx);
            }
            Reply::NullArray => {
                api!(RedisModule_ReplyWithNullArray)(ctx);
            }
            Reply::Bulk(b) => {
                api!(RedisModule_ReplyWithStringBuffer)(ctx, b.as_ptr().cast(), b.len());
            }
            Reply::Simple(s) => {
                api!(RedisModule_ReplyWithSimpleString)(ctx, s.as_ptr());
            }
            Reply::Error(e) => {
                let c =
                    std::ffi::CString::new(e.replace(['\r', '\n', '\0'], " ")).unwrap_or_default();
                api!(RedisModule_ReplyWithError)(ctx, c.as_ptr());
            }
            Reply::Array(items) => {
                api!(RedisModule_ReplyWithArray)(ctx, items.len() as _);
                items.iter().for_each(|i| send(ctx, i));
            }
            Reply::Map(fields) => {
                api!(RedisModule_ReplyWithMap)(ctx, fields.len() as _);
                for (name, value) in fields {
                    api!(RedisModule_ReplyWithStringBuffer)(ctx, name.as_ptr().cast(), name.len());
                    send(ctx, value);
                }
            }
            Reply::Parked => {}
        }
    }
}

/// A block for `layout` (its alignment at most 16) from Redis's allocator,
/// called directly: it is the module's global allocator, so `Box::from_raw`
/// frees the block, but `Box::new` reaches it through `__rust_alloc`, its
/// shim and the allocator's method, three calls where the first grant of a
/// free key needs one.
pub fn alloc_global(layout: std::alloc::Layout) -> *mut u8 {
    debug_assert!(layout.align() <= 16 && layout.size() > 0);
    #[cfg(not(test))]
    let block = unsafe { api!(RedisModule_Alloc)(layout.size()) }.cast::<u8>();
    #[cfg(test)]
    let block = unsafe { std::alloc::alloc(layout) };
    if block.is_null() {
        std::alloc::handle_alloc_error(layout);
    }
    block
}

/// Runs `f` with panics contained: no unwind may cross into Redis. Inlined:
/// every command runs in it, and catching costs nothing until a panic.
#[inline]
pub fn contained<T>(what: &str, fallback: T, f: impl FnOnce() -> T) -> T {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(_) => {
            abandoned(what);
            fallback
        }
    }
}

#[cold]
#[inline(never)]
fn abandoned(what: &str) {
    log_warning(&format!(
        "rlock: internal error in {what}; the operation was abandoned"
    ));
}

/// A server config's value as `CONFIG GET` gives it (None if unreadable).
pub fn config_value(ctx: *mut Ctx, name: &str) -> Option<String> {
    use redis_module::{Context, RedisValue};
    let reply = Context::new(ctx).call("CONFIG", &["GET", name][..]).ok()?;
    let RedisValue::Array(items) = reply else {
        return None;
    };
    match items.get(1)? {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => Some(s.clone()),
        RedisValue::BulkRedisString(s) => s.try_as_str().ok().map(str::to_owned),
        RedisValue::StringBuffer(b) => std::str::from_utf8(b).ok().map(str::to_owned),
        RedisValue::Integer(i) => Some(i.to_string()),
        _ => None,
    }
}

/// A numeric server config (`maxmemory`, `min-replicas-to-write`, ...).
pub fn config_number(ctx: *mut Ctx, name: &str) -> Option<i64> {
    config_value(ctx, name)?.trim().parse().ok()
}

pub fn log_warning(msg: &str) {
    let c = std::ffi::CString::new(msg.replace('\0', " ")).unwrap_or_default();
    unsafe {
        api!(RedisModule_Log)(
            ptr::null_mut(),
            c"warning".as_ptr(),
            c"%s".as_ptr(),
            c.as_ptr(),
        );
    }
}

/// The argument vector of a command as a slice.
///
/// # Safety
/// `argv` must point to `argc` live module strings.
pub unsafe fn args<'a>(argv: *mut *mut RStr, argc: c_int) -> &'a [*mut RStr] {
    if argv.is_null() || argc <= 0 {
        return &[];
    }
    std::slice::from_raw_parts(argv, argc as usize)
}

/// A context of this module for callbacks that get none (the unlink hook,
/// loading, timers armed from them).
static MODULE_CONTEXT: std::sync::atomic::AtomicPtr<Ctx> =
    std::sync::atomic::AtomicPtr::new(ptr::null_mut());

pub fn init_module_context(ctx: *mut Ctx) {
    let detached = unsafe { api!(RedisModule_GetDetachedThreadSafeContext)(ctx) };
    MODULE_CONTEXT.store(detached, std::sync::atomic::Ordering::Relaxed);
}

pub fn module_context() -> *mut Ctx {
    MODULE_CONTEXT.load(std::sync::atomic::Ordering::Relaxed)
}
