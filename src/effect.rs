//! How a change reaches replicas and the AOF: `RLOCK.DELTA key <delta>`.
//!
//! `RedisModule_Replicate` looks its command up by name and builds a fresh
//! argument vector on every call: a third of what an acquire costs once a
//! replica is attached (bench/findings.md, replica-acquire-vs-set). Redis's
//! own commands rewrite their arguments in place and let the call be
//! propagated (how `SET .. EX` goes out as `SET .. PXAT`); a module has
//! `RedisModule_ReplicateVerbatim` for the propagation, which copies the
//! command's argument vector as it stands. So while a command runs, its
//! effects take the vector's slots in turn (name, key, delta, empty strings
//! in the slots left over), each is propagated verbatim, and the command's
//! own arguments go back at once: slowlog, MONITOR and the client see the
//! command as it was sent.
//!
//! That needs three slots; the changes a timer makes, and those of
//! `FORCERELEASE key`, go through `RedisModule_Replicate`. `RLOCK.DELTA`
//! accepts the empty trailing slots.
//!
//! The KEEPALIVE timer renews up to a thousand holdings a tick, one effect
//! each: it gathers them (`gathered`) into one `RLOCK.DELTAS key delta
//! [key delta ...]` per database, so the lookup and the vector are paid once
//! a tick, not once a renewal (a fifth of a renewal's cost otherwise).

use std::cell::RefCell;
use std::mem::MaybeUninit;
use std::os::raw::c_int;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU8, AtomicUsize, Ordering};

use crate::ffi::{api, Ctx, OwnedStr, RStr};
use crate::lock::delta;

/// Slots a command may have for its effect to take them; longer commands
/// (none of the lock commands in practice) use `RedisModule_Replicate`.
const MAX_SLOTS: usize = 16;

/// The command running now: its context and arguments, or nulls. Commands
/// run on the main thread only; the atomics are for `static`, not for
/// concurrency.
static CTX: AtomicPtr<Ctx> = AtomicPtr::new(ptr::null_mut());
static ARGV: AtomicPtr<*mut RStr> = AtomicPtr::new(ptr::null_mut());
static ARGC: AtomicUsize = AtomicUsize::new(0);

/// `RLOCK.DELTA` and the empty filler, made once and never freed: the
/// propagated vectors only add references to them.
static NAME: AtomicPtr<RStr> = AtomicPtr::new(ptr::null_mut());
static EMPTY: AtomicPtr<RStr> = AtomicPtr::new(ptr::null_mut());

/// The command that ran before, put back however `within` ends (a script
/// may call a lock command from inside another).
struct Outer(*mut Ctx, *mut *mut RStr, usize);

impl Drop for Outer {
    fn drop(&mut self) {
        CTX.store(self.0, Ordering::Relaxed);
        ARGV.store(self.1, Ordering::Relaxed);
        ARGC.store(self.2, Ordering::Relaxed);
    }
}

/// Runs `f` on the arguments of the command `ctx` runs, `argv[..argc]`, so
/// that its effects may take their slots. `f` reads a copy: the slots change
/// under it while an effect is propagated.
pub fn within<T>(
    ctx: *mut Ctx,
    argv: *mut *mut RStr,
    argc: c_int,
    f: impl FnOnce(&[*mut RStr]) -> T,
) -> T {
    let args = unsafe { crate::ffi::args(argv, argc) };
    // A longer command keeps its slots (and its copy would not fit).
    let (argv, argc) = if args.len() <= MAX_SLOTS {
        (argv, args.len())
    } else {
        (ptr::null_mut(), 0)
    };
    // Loads and stores, not swaps: a swap is a locked instruction, ~20
    // cycles each on every command, for a main-thread-only value.
    let _outer = Outer(
        CTX.load(Ordering::Relaxed),
        ARGV.load(Ordering::Relaxed),
        ARGC.load(Ordering::Relaxed),
    );
    CTX.store(ctx, Ordering::Relaxed);
    ARGV.store(argv, Ordering::Relaxed);
    ARGC.store(argc, Ordering::Relaxed);
    if argv.is_null() {
        return f(args);
    }
    // Only the slots the command has are written (no zeroing of the rest).
    let mut copy = [MaybeUninit::<*mut RStr>::uninit(); MAX_SLOTS];
    // SAFETY: `argc <= MAX_SLOTS` slots copied from `args`, then read.
    unsafe {
        let copy = copy.as_mut_ptr().cast::<*mut RStr>();
        ptr::copy_nonoverlapping(args.as_ptr(), copy, argc);
        f(std::slice::from_raw_parts(copy, argc))
    }
}

/// Propagates `delta`, the change just made to `keyname`.
pub fn replicate(ctx: *mut Ctx, keyname: *mut RStr, delta: &[u8]) {
    let argv = ARGV.load(Ordering::Relaxed);
    let argc = ARGC.load(Ordering::Relaxed);
    if ctx != CTX.load(Ordering::Relaxed) || argc < 3 || argv.is_null() {
        replicate_apart(ctx, keyname, delta);
        return;
    }
    // The slots as the client sent them, to be put back (`within` keeps
    // `argc <= MAX_SLOTS`).
    let mut sent = [MaybeUninit::<*mut RStr>::uninit(); MAX_SLOTS];
    let sent = sent.as_mut_ptr().cast::<*mut RStr>();
    // SAFETY: `argv` holds `argc` slots of the running command; nothing else
    // reads them until they are put back below.
    let slots = unsafe {
        ptr::copy_nonoverlapping(argv, sent, argc);
        std::slice::from_raw_parts_mut(argv, argc)
    };
    // The propagated copy holds its own reference to the delta's string.
    let blob = OwnedStr::new(delta);
    slots[0] = shared(&NAME, delta::COMMAND.to_bytes());
    slots[1] = keyname;
    slots[2] = blob.ptr();
    slots[3..].fill(shared(&EMPTY, b""));
    unsafe {
        api!(RedisModule_ReplicateVerbatim)(ctx);
        ptr::copy_nonoverlapping(sent, argv, argc);
    }
}

/// `replicate` outside a command's slots: gathered for a timer's batch, or
/// through `RedisModule_Replicate`.
#[inline(never)]
fn replicate_apart(ctx: *mut Ctx, keyname: *mut RStr, delta: &[u8]) {
    if ctx == GATHERING.load(Ordering::Relaxed) {
        gather(ctx, keyname, delta);
        return;
    }
    unsafe {
        api!(RedisModule_Replicate)(
            ctx,
            delta::COMMAND.as_ptr(),
            c"sb".as_ptr(),
            keyname,
            delta.as_ptr(),
            delta.len(),
        )
    };
}

fn shared(cell: &AtomicPtr<RStr>, data: &[u8]) -> *mut RStr {
    let s = cell.load(Ordering::Relaxed);
    if !s.is_null() {
        return s;
    }
    make_shared(cell, data)
}

#[cold]
#[inline(never)]
fn make_shared(cell: &AtomicPtr<RStr>, data: &[u8]) -> *mut RStr {
    let s = OwnedStr::new(data).leak();
    cell.store(s, Ordering::Relaxed);
    s
}

/// Propagates `PEXPIREAT keyname at`: a key's TTL put back outside any delta
/// (after `RESTORE`, or by the lease timer after a TTL was changed by hand),
/// so replicas and the AOF keep the master's.
pub fn replicate_ttl(ctx: *mut Ctx, keyname: *mut RStr, at: i64) {
    // After the effects gathered before it, as they were made.
    if ctx == GATHERING.load(Ordering::Relaxed) {
        flush(ctx);
    }
    unsafe {
        api!(RedisModule_Replicate)(
            ctx,
            c"PEXPIREAT".as_ptr(),
            c"sl".as_ptr(),
            keyname,
            at as std::os::raw::c_longlong,
        )
    };
}

/// The context whose effects are being gathered, or null.
static GATHERING: AtomicPtr<Ctx> = AtomicPtr::new(ptr::null_mut());

/// Pairs gathered for one `RLOCK.DELTAS` at most (the timer renews up to a
/// thousand holdings a tick, so a tick sends one or two).
const MAX_GATHERED: usize = 1024;

/// Effects gathered, not yet propagated: `key delta` pairs of one database.
#[derive(Default)]
struct Gathered {
    db: i32,
    args: Vec<OwnedStr>,
}

thread_local! {
    static PENDING: RefCell<Gathered> = RefCell::new(Gathered::default());
}

/// Runs `f`, the changes a timer makes in `ctx`, with their effects gathered
/// into `RLOCK.DELTAS` commands propagated in the order the changes were
/// made: one per run of changes in one database, the last before this
/// returns (within the timer's callback, as the changes). What Redis
/// propagates itself meanwhile (a key `f` finds expired goes out as `DEL` at
/// once) overtakes the gathered effects, so only changes that commute with
/// it may be gathered: a renewed key cannot expire later in the same tick.
pub fn gathered<T>(ctx: *mut Ctx, f: impl FnOnce() -> T) -> T {
    struct Flush(*mut Ctx, *mut Ctx);
    impl Drop for Flush {
        fn drop(&mut self) {
            flush(self.0);
            GATHERING.store(self.1, Ordering::Relaxed);
        }
    }
    let _flush = Flush(ctx, GATHERING.swap(ctx, Ordering::Relaxed));
    f()
}

fn gather(ctx: *mut Ctx, keyname: *mut RStr, delta: &[u8]) {
    let db = unsafe { api!(RedisModule_GetSelectedDb)(ctx) };
    let full = PENDING.with(|p| {
        let p = p.borrow();
        !p.args.is_empty() && (p.db != db || p.args.len() >= 2 * MAX_GATHERED)
    });
    if full {
        flush(ctx);
    }
    PENDING.with(|p| {
        let mut p = p.borrow_mut();
        p.db = db;
        p.args.push(OwnedStr::hold(keyname));
        p.args.push(OwnedStr::new(delta));
    });
}

/// Propagates what was gathered as one `RLOCK.DELTAS` in its database.
fn flush(ctx: *mut Ctx) {
    let Gathered { db, args } = PENDING.with(|p| std::mem::take(&mut *p.borrow_mut()));
    if args.is_empty() {
        return;
    }
    unsafe {
        let current = api!(RedisModule_GetSelectedDb)(ctx);
        if current != db {
            api!(RedisModule_SelectDb)(ctx, db);
        }
        // `OwnedStr` is transparent: the slice is the argument vector.
        api!(RedisModule_Replicate)(
            ctx,
            delta::BATCH_COMMAND.as_ptr(),
            c"v".as_ptr(),
            args.as_ptr().cast::<*mut RStr>(),
            args.len(),
        );
        if current != db {
            api!(RedisModule_SelectDb)(ctx, current);
        }
    }
}

/// Whether a replicated command's effect is passed on now (`NOW`), or once
/// its changes are all applied (`DEFERRED`; `WANTED` once one asked).
static PASS_ON: AtomicU8 = AtomicU8::new(NOW);
const NOW: u8 = 0;
const DEFERRED: u8 = 1;
const WANTED: u8 = 2;

/// A replicated effect applied here goes on to this server's AOF and
/// replicas exactly as it came.
pub fn pass_on(ctx: *mut Ctx) {
    if PASS_ON.load(Ordering::Relaxed) == NOW {
        unsafe { api!(RedisModule_ReplicateVerbatim)(ctx) };
    } else {
        PASS_ON.store(WANTED, Ordering::Relaxed);
    }
}

/// Runs `f`, a replicated command that makes several changes, so that the
/// command is passed on once if any change asked for it (not once a change).
pub fn passed_on_once<T>(ctx: *mut Ctx, f: impl FnOnce() -> T) -> T {
    struct Once(*mut Ctx, u8);
    impl Drop for Once {
        fn drop(&mut self) {
            if PASS_ON.swap(self.1, Ordering::Relaxed) == WANTED {
                pass_on(self.0);
            }
        }
    }
    let _once = Once(ctx, PASS_ON.swap(DEFERRED, Ordering::Relaxed));
    f()
}
