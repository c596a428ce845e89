//! The effects a master replicates, accepted only from the master link or
//! while loading the AOF:
//! - `RLOCK.DELTA key delta ["" ...]`: the steps of one change (`lock::delta`),
//!   with the empty strings a master's `effect` may leave after it;
//! - `RLOCK.SETSTATE key kind n [owner reads writes token deadline]...`: a whole
//!   state, as AOF rewrite emits it (and as masters before deltas replicated).

use redis_module::raw;

use crate::engine::{self, Action};
use crate::ffi::{bytes, ctx_flags, log_warning, now_ms, Ctx, RStr, Reply};
use crate::lock::{delta, err};
use crate::store::parse_setstate;

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
    logged(argv[1], reply)
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
    let reply = match delta::decode(unsafe { bytes(argv[2]) }) {
        Some((kind, ops)) if filled => {
            engine::execute(ctx, argv[1], None, Action::Replay(kind, ops))
        }
        _ => Reply::err(err::INVALID_DELTA),
    };
    logged(argv[1], reply)
}

/// A replicated change that cannot be applied leaves the key as it was; the
/// log says so, since nobody reads the reply.
fn logged(key: *mut RStr, reply: Reply) -> Reply {
    if let Reply::Error(e) = &reply {
        log_warning(&format!(
            "rlock: refused a replicated change to key '{}': {e}",
            String::from_utf8_lossy(unsafe { bytes(key) })
        ));
    }
    reply
}
