//! Command handlers. Each family (RLOCK, FAIRLOCK, RWLOCK, SEMAPHORE) has the
//! same five commands; they differ only in the lock kind, for RWLOCK a
//! READ|WRITE word, and for SEMAPHORE the LIMIT and PERMITS options (which make
//! the request's `Mode`). Handlers parse, then hand a typed `Action` to the engine.

pub mod args;
mod info;
mod multi;
mod setstate;

use std::os::raw::c_int;

use crate::config;
use crate::engine::{self, Action, Request};
use crate::ffi::{self, bytes, now_ms, Ctx, RStr, Reply};
use crate::lock::{Kind, Mode};

pub use multi::{acquire_all, release_all, renew_all, report_key_positions};
pub use setstate::{delta, deltas, setstate};

fn arity_error(argv: &[*mut RStr]) -> Reply {
    let name = argv
        .first()
        .map(|a| String::from_utf8_lossy(unsafe { bytes(*a) }).to_lowercase())
        .unwrap_or_default();
    Reply::err(format!(
        "ERR wrong number of arguments for '{name}' command"
    ))
}

fn arg<'a>(argv: &[*mut RStr], i: usize) -> &'a [u8] {
    arg_of(argv[i])
}

fn arg_of<'a>(a: *mut RStr) -> &'a [u8] {
    unsafe { bytes(a) }
}

/// Arguments that come before the options: (mode, owner, index of first option).
fn mode_and_owner<'a>(
    argv: &[*mut RStr],
    kind: Kind,
    with_mode: bool,
) -> Result<(Mode, &'a [u8], usize), Reply> {
    let rw = with_mode && kind == Kind::ReadWrite;
    let first_opt = if rw { 4 } else { 3 };
    if argv.len() < first_opt {
        return Err(arity_error(argv));
    }
    let mode = if rw {
        args::mode(arg(argv, 2)).map_err(Reply::err)?
    } else {
        Mode::Write
    };
    let owner = args::owner(arg(argv, first_opt - 1)).map_err(Reply::err)?;
    Ok((mode, owner, first_opt))
}

/// The option words and values from position `from` on.
fn rest(argv: &[*mut RStr], from: usize) -> impl Iterator<Item = &[u8]> {
    argv[from..].iter().map(|a| unsafe { bytes(*a) })
}

/// A semaphore's request: `PERMITS k` (default 1) of `LIMIT n` (required on
/// ACQUIRE), `k <= n`.
fn permits(opts: &args::Options, acquire: bool) -> Result<Mode, &'static str> {
    let count = opts.permits.unwrap_or(1);
    let limit = match opts.limit {
        Some(n) if count > n => return Err(args::PERMITS_OVER_LIMIT_ERR),
        Some(n) => n,
        None if acquire => return Err(args::NO_LIMIT_ERR),
        None => 0,
    };
    Ok(Mode::Permits { count, limit })
}

/// Inlined into each family's command with its `kind`: the usual request's
/// reading (`usual_request`) folds to that family's own few lines.
#[inline(always)]
pub fn acquire(ctx: *mut Ctx, argv: &[*mut RStr], kind: Kind) -> Reply {
    let now = now_ms();
    let Some((mode, owner, lease_ms)) = usual_request(argv, kind, now) else {
        return acquire_with_options(ctx, argv, kind, now);
    };
    let request = Request {
        owner,
        mode,
        lease_ms,
        block: None,
        keepalive: false,
    };
    submit(ctx, argv, kind, request, now)
}

/// The request, read, goes to the engine.
#[inline(always)]
fn submit(ctx: *mut Ctx, argv: &[*mut RStr], kind: Kind, request: Request, now: i64) -> Reply {
    // Redis admitted this write, but its count of good replicas can be a
    // second stale after the server was frozen: no new holder then.
    if crate::min_replicas::refuses_writes() {
        return Reply::err(crate::min_replicas::NOREPLICAS_ERR);
    }
    engine::acquire(ctx, argv[1], kind, request, now)
}

/// The request of most acquisitions, read without the general parser:
/// `key owner PX ms` (RWLOCK: `key READ|WRITE owner PX ms`; SEMAPHORE:
/// `key owner LIMIT n PX ms`) with an owner that is not empty, as (mode,
/// owner, lease). `None` for anything else, which `acquire_options` reads
/// (and refuses, when it is wrong): the usual acquire's code stays short.
#[inline(always)]
fn usual_request<'a>(argv: &[*mut RStr], kind: Kind, now: i64) -> Option<(Mode, &'a [u8], i64)> {
    let (mode, owner, lease_ms) = match (kind, argv) {
        (Kind::Semaphore, &[_, _, owner, name, limit, px, ms]) => {
            let words = [arg_of(name), arg_of(limit), arg_of(px), arg_of(ms)];
            let (limit, lease_ms) = args::limit_and_lease(words, now)?;
            (Mode::Permits { count: 1, limit }, owner, lease_ms)
        }
        (Kind::ReadWrite, &[_, _, mode, owner, px, ms]) => {
            let mode = args::mode(arg_of(mode)).ok()?;
            (mode, owner, args::lease_alone(arg_of(px), arg_of(ms), now)?)
        }
        (Kind::Reentrant | Kind::Fair, &[_, _, owner, px, ms]) => (
            Mode::Write,
            owner,
            args::lease_alone(arg_of(px), arg_of(ms), now)?,
        ),
        _ => return None,
    };
    Some((mode, args::owner(arg_of(owner)).ok()?, lease_ms))
}

/// An acquire other than the usual one (`usual_request`): read by the
/// general parser, then submitted, all of it after the usual acquire's line
/// of code (cold: placed apart from it).
#[cold]
#[inline(never)]
fn acquire_with_options(ctx: *mut Ctx, argv: &[*mut RStr], kind: Kind, now: i64) -> Reply {
    match acquire_options(ctx, argv, kind, now) {
        Ok(request) => submit(ctx, argv, kind, request, now),
        Err(reply) => reply,
    }
}

/// The general parser's reading of an acquire.
fn acquire_options<'a>(
    ctx: *mut Ctx,
    argv: &[*mut RStr],
    kind: Kind,
    now: i64,
) -> Result<Request<'a>, Reply> {
    let (mut mode, owner, first_opt) = mode_and_owner(argv, kind, true)?;
    let grammar = match kind {
        Kind::Semaphore => args::Grammar::SEMAPHORE_ACQUIRE,
        _ => args::Grammar::ACQUIRE,
    };
    let opts = args::options(rest(argv, first_opt), grammar, now).map_err(Reply::err)?;
    if kind == Kind::Semaphore {
        mode = permits(&opts, true).map_err(Reply::err)?;
    }
    if opts.keepalive && !keepalive_allowed(ctx) {
        return Err(Reply::err(KEEPALIVE_SCRIPT_ERR));
    }
    Ok(Request {
        owner,
        mode,
        lease_ms: opts.lease_ms.unwrap_or_else(config::default_lease_ms),
        block: opts.block_ms,
        keepalive: opts.keepalive,
    })
}

pub fn release(ctx: *mut Ctx, argv: &[*mut RStr], kind: Kind) -> Reply {
    let (mut mode, owner, first_opt) = match mode_and_owner(argv, kind, true) {
        Ok(v) => v,
        Err(e) => return e,
    };
    if kind == Kind::Semaphore {
        let parsed = args::options(rest(argv, first_opt), args::Grammar::SEMAPHORE_RELEASE, 0);
        mode = match parsed.and_then(|o| permits(&o, false)) {
            Ok(m) => m,
            Err(e) => return Reply::err(e),
        };
    } else if argv.len() != first_opt {
        return arity_error(argv);
    }
    engine::execute(ctx, argv[1], Some(kind), Action::Release { owner, mode })
}

pub fn renew(ctx: *mut Ctx, argv: &[*mut RStr], kind: Kind) -> Reply {
    let (_, owner, first_opt) = match mode_and_owner(argv, kind, false) {
        Ok(v) => v,
        Err(e) => return e,
    };
    let now = now_ms();
    let opts = match args::options(rest(argv, first_opt), args::Grammar::RENEW, now) {
        Ok(o) => o,
        Err(e) => return Reply::err(e),
    };
    let lease_ms = opts.lease_ms.unwrap_or_else(config::default_lease_ms);
    // As for ACQUIRE: a deposed master waking up must not extend a lease.
    if crate::min_replicas::refuses_writes() {
        return Reply::err(crate::min_replicas::NOREPLICAS_ERR);
    }
    let action = Action::Renew { owner, lease_ms };
    engine::execute_at(ctx, argv[1], Some(kind), action, now)
}

pub fn force_release(ctx: *mut Ctx, argv: &[*mut RStr], kind: Kind) -> Reply {
    if argv.len() != 2 {
        return arity_error(argv);
    }
    engine::execute(ctx, argv[1], Some(kind), Action::ForceRelease)
}

pub fn info(ctx: *mut Ctx, argv: &[*mut RStr], kind: Kind) -> Reply {
    let count = match argv.len() {
        2 => usize::MAX,
        4 => match args::count(arg(argv, 2), arg(argv, 3)) {
            Ok(n) => n,
            Err(e) => return Reply::err(e),
        },
        3 => return Reply::err(args::SYNTAX_ERR),
        _ => return arity_error(argv),
    };
    info::describe(ctx, argv[1], kind, count)
}

pub const KEEPALIVE_SCRIPT_ERR: &str =
    "ERR KEEPALIVE binds a holding to a client connection: not available in scripts and functions";

/// A script's connection is not the client's: nothing would ever end a
/// holding bound to it.
pub fn keepalive_allowed(ctx: *mut Ctx) -> bool {
    ffi::ctx_flags(ctx) & redis_module::raw::REDISMODULE_CTX_FLAGS_LUA == 0
}

fn internal_error() -> Reply {
    Reply::err("ERR internal error")
}

/// Runs a handler with its panics contained and writes its reply. Inlined
/// into each command's entry point with its handler: a call through a
/// pointer and two frames fewer on every command.
#[inline(always)]
pub fn run(
    ctx: *mut Ctx,
    argv: *mut *mut RStr,
    argc: c_int,
    handler: impl FnOnce(*mut Ctx, &[*mut RStr]) -> Reply,
) -> c_int {
    // Replied from inside: a reply handed out of the closure is moved twice
    // more on every command.
    let replied = ffi::contained("command", false, || {
        let reply = crate::effect::within(ctx, argv, argc, |args| handler(ctx, args));
        ffi::send_owned(ctx, reply);
        true
    });
    if !replied {
        ffi::send_owned(ctx, internal_error());
    }
    ffi::OK
}
