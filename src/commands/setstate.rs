//! The effects a master replicates, accepted only from the master link or
//! while loading the AOF:
//! - `RLOCK.DELTA key delta ["" ...]`: the steps of one change (`lock::delta`),
//!   with the empty strings a master's `effect` may leave after it;
//! - `RLOCK.DELTAS key delta [key delta ...]`: several changes' steps, applied
//!   in turn (a master's KEEPALIVE timer gathers its renewals so, `effect`);
//! - `RLOCK.SETSTATE key kind n [owner reads writes token deadline]...`: a whole
//!   state, as AOF rewrite emits it (and as masters before deltas replicated).

use redis_module::raw;

use crate::engine::{self, Action};
use crate::ffi::{bytes, ctx_flags, log_warning, now_ms, Ctx, Key, RStr, Reply};
use crate::lock::delta::{self, Op};
use crate::lock::err;
use crate::store::{lock_at, parse_setstate};

fn trusted(ctx: *mut Ctx, name: &str) -> Result<(), Reply> {
    let trusted = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if ctx_flags(ctx) & trusted == 0 {
        return Err(Reply::err(format!(
            "ERR {name} is internal: accepted only from a master or the AOF"
        )));
    }
    Ok(())
}

pub fn setstate(ctx: *mut Ctx, argv: &[*mut RStr]) -> Reply {
    if let Err(e) = trusted(ctx, "RLOCK.SETSTATE") {
        return e;
    }
    if argv.len() < 4 {
        return Reply::err("ERR wrong number of arguments for 'rlock.setstate' command");
    }
    let rest: Vec<&[u8]> = argv[2..].iter().map(|a| unsafe { bytes(*a) }).collect();
    let reply = match parse_setstate(&rest, crate::token::max_accepted(now_ms())) {
        Ok(state) => engine::execute(ctx, argv[1], None, Action::SetState(state)),
        Err(e) => Reply::err(e),
    };
    logged(argv[1], reply, String::new)
}

pub fn delta(ctx: *mut Ctx, argv: &[*mut RStr]) -> Reply {
    if let Err(e) = trusted(ctx, "RLOCK.DELTA") {
        return e;
    }
    if argv.len() < 3 {
        return Reply::err("ERR wrong number of arguments for 'rlock.delta' command");
    }
    // A master propagates a delta in the slots of the command that made it,
    // the ones left over empty (`effect`).
    let filled = argv[3..].iter().all(|a| unsafe { bytes(*a) }.is_empty());
    let Some((kind, ops)) = delta::decode(unsafe { bytes(argv[2]) }).filter(|_| filled) else {
        return logged(argv[1], Reply::err(err::INVALID_DELTA), String::new);
    };
    let reply = engine::execute(ctx, argv[1], None, Action::Replay(kind, ops));
    logged(argv[1], reply, || {
        // Read again (the engine took them): only a refusal pays for this.
        let steps: Vec<String> = delta::decode(unsafe { bytes(argv[2]) })
            .map(|(_, ops)| ops.iter().take(MAX_LISTED).map(step_text).collect())
            .unwrap_or_default();
        format!(
            "; {kind:?} steps [{}]; here: {}",
            steps.join(", "),
            held_here(ctx, argv[1])
        )
    })
}

/// `RLOCK.DELTAS`: each change all or nothing, as `RLOCK.DELTA` applies it.
pub fn deltas(ctx: *mut Ctx, argv: &[*mut RStr]) -> Reply {
    if let Err(e) = trusted(ctx, "RLOCK.DELTAS") {
        return e;
    }
    if argv.len() < 3 || argv.len().is_multiple_of(2) {
        return Reply::err("ERR wrong number of arguments for 'rlock.deltas' command");
    }
    // Every delta is read before any is applied: a malformed one changes nothing.
    let mut changes = Vec::with_capacity(argv.len() / 2);
    for pair in argv[1..].chunks_exact(2) {
        match delta::decode(unsafe { bytes(pair[1]) }) {
            Some((kind, ops)) => changes.push((pair[0], kind, ops)),
            None => return logged(pair[0], Reply::err(err::INVALID_DELTA), String::new),
        }
    }
    let applied = changes.len() as i64;
    // The changes are one command to this server's AOF and replicas too.
    crate::effect::passed_on_once(ctx, || {
        let mut refused = None;
        for (key, kind, ops) in changes {
            let reply = engine::execute(ctx, key, None, Action::Replay(kind, ops));
            if let Reply::Error(_) = &reply {
                // Refused, this one stays as it was; the others are applied.
                let reply = logged(key, reply, || format!("; here: {}", held_here(ctx, key)));
                refused.get_or_insert(reply);
            }
        }
        refused.unwrap_or(Reply::Int(applied))
    })
}

/// A replicated change that cannot be applied leaves the key as it was; the
/// log says so (with `detail()` after the error), since nobody reads the reply.
fn logged(key: *mut RStr, reply: Reply, detail: impl FnOnce() -> String) -> Reply {
    if let Reply::Error(e) = &reply {
        log_warning(&format!(
            "rlock: refused a replicated change to key '{}': {e}{}",
            String::from_utf8_lossy(unsafe { bytes(key) }),
            detail()
        ));
    }
    reply
}

/// Steps and holders a refusal's log line lists at most.
const MAX_LISTED: usize = 8;

fn step_text(op: &Op) -> String {
    let lossy = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    match *op {
        Op::New {
            mode,
            token,
            deadline,
            owner,
        } => format!(
            "New {{ owner: {:?}, mode: {mode:?}, token: {token}, deadline: {deadline} }}",
            lossy(owner)
        ),
        Op::Whole { token, owner, .. } => {
            format!("Whole {{ owner: {:?}, token: {token} }}", lossy(owner))
        }
        Op::Lock { encoded } => format!("Lock {{ {} bytes }}", encoded.len()),
        other => format!("{other:?}"),
    }
}

/// The lock this server has at `key` (what a refused change met), its
/// holders as `owner/token/reads/writes/deadline`.
fn held_here(ctx: *mut Ctx, key: *mut RStr) -> String {
    let k = Key::open(ctx, key, false);
    let Ok(found) = lock_at(&k) else {
        return "a key of another type".into();
    };
    let Some(lock) = found else {
        return "no key".into();
    };
    let state = unsafe { lock.state() };
    let holders: Vec<String> = state
        .iter()
        .take(MAX_LISTED)
        .map(|h| {
            let owner = String::from_utf8_lossy(&h.owner);
            format!(
                "{owner}/{}/{}/{}/{}",
                h.token, h.reads, h.writes, h.deadline
            )
        })
        .collect();
    format!(
        "{:?} with {} holder(s) [{}]",
        state.kind(),
        state.iter().count(),
        holders.join(", ")
    )
}
