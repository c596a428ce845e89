//! `RLOCK.SETSTATE key kind n [owner reads writes token deadline]...`: the effect
//! a master replicates after every lock change, and what AOF rewrite emits. It is
//! accepted only from the master link or while loading the AOF.

use redis_module::raw;

use crate::engine::{self, Action};
use crate::ffi::{bytes, ctx_flags, Ctx, RStr, Reply};
use crate::store::parse_setstate;

pub fn setstate(ctx: *mut Ctx, argv: &[*mut RStr]) -> Reply {
    let trusted = raw::REDISMODULE_CTX_FLAGS_REPLICATED | raw::REDISMODULE_CTX_FLAGS_LOADING;
    if ctx_flags(ctx) & trusted == 0 {
        return Reply::err(
            "ERR RLOCK.SETSTATE is internal: accepted only from a master or the AOF",
        );
    }
    if argv.len() < 4 {
        return Reply::err("ERR wrong number of arguments for 'rlock.setstate' command");
    }
    let rest: Vec<&[u8]> = argv[2..].iter().map(|a| unsafe { bytes(*a) }).collect();
    match parse_setstate(&rest) {
        Ok(state) => engine::execute(ctx, argv[1], None, Action::SetState(state)),
        Err(e) => Reply::err(e),
    }
}
