//! `RLOCK.ACQUIREALL | RELEASEALL | RENEWALL numkeys key [key ...] owner ...`:
//! Redisson's MultiLock as one atomic step over several RLOCK keys.

use std::collections::HashSet;

use super::{args, arity_error};
use crate::config;
use crate::engine;
use std::os::raw::c_int;

use crate::ffi::{self, api, bytes, now_ms, Ctx, RStr, Reply};
use crate::min_replicas;

pub const NUMKEYS_ERR: &str = "ERR numkeys must be a positive integer";
pub const TOO_FEW_KEYS_ERR: &str = "ERR numkeys is greater than the number of keys given";
pub const DUPLICATE_KEY_ERR: &str = "ERR a key is listed more than once";

/// A parsed `numkeys key [key ...] owner` and the arguments after it.
struct Call<'a> {
    keys: &'a [*mut RStr],
    owner: &'a [u8],
    rest: &'a [*mut RStr],
}

fn keys_and_owner(argv: &[*mut RStr]) -> Result<Call<'_>, Reply> {
    if argv.len() < 4 {
        return Err(arity_error(argv));
    }
    let numkeys = args::numkeys(unsafe { bytes(argv[1]) }).ok_or(Reply::err(NUMKEYS_ERR))?;
    // The owner follows the keys.
    if numkeys > argv.len() - 3 {
        return Err(Reply::err(TOO_FEW_KEYS_ERR));
    }
    let keys = &argv[2..2 + numkeys];
    let mut seen = HashSet::with_capacity(numkeys);
    if !keys.iter().all(|k| seen.insert(unsafe { bytes(*k) })) {
        return Err(Reply::err(DUPLICATE_KEY_ERR));
    }
    let owner = args::owner(unsafe { bytes(argv[2 + numkeys]) }).map_err(Reply::err)?;
    Ok(Call {
        keys,
        owner,
        rest: &argv[3 + numkeys..],
    })
}

/// `getkeys-api`: tells Redis where the keys of a multi-key call are (cluster
/// routing and CROSSSLOT). A malformed call reports none and fails when run.
pub fn report_key_positions(ctx: *mut Ctx, argv: *mut *mut RStr, argc: c_int) -> c_int {
    ffi::contained("key positions", ffi::OK, || {
        let argv = unsafe { ffi::args(argv, argc) };
        if let Ok(call) = keys_and_owner(argv) {
            for i in 0..call.keys.len() {
                unsafe { api!(RedisModule_KeyAtPos)(ctx, (i + 2) as c_int) };
            }
        }
        ffi::OK
    })
}

fn words(argv: &[*mut RStr]) -> impl Iterator<Item = &[u8]> {
    argv.iter().map(|a| unsafe { bytes(*a) })
}

pub fn acquire_all(ctx: *mut Ctx, argv: &[*mut RStr]) -> Reply {
    let Call { keys, owner, rest } = match keys_and_owner(argv) {
        Ok(v) => v,
        Err(e) => return e,
    };
    let now = now_ms();
    let opts = match args::options(words(rest), args::Grammar::ACQUIRE, now) {
        Ok(o) => o,
        Err(e) => return Reply::err(e),
    };
    if opts.keepalive && !super::keepalive_allowed(ctx) {
        return Reply::err(super::KEEPALIVE_SCRIPT_ERR);
    }
    // As for ACQUIRE: Redis's count of good replicas can be stale.
    if min_replicas::refuses_writes() {
        return Reply::err(min_replicas::NOREPLICAS_ERR);
    }
    let lease_ms = opts.lease_ms.unwrap_or_else(config::default_lease_ms);
    let (block, keepalive) = (opts.block_ms, opts.keepalive);
    engine::acquire_all(ctx, keys, owner, lease_ms, block, keepalive, now)
}

pub fn release_all(ctx: *mut Ctx, argv: &[*mut RStr]) -> Reply {
    let Call { keys, owner, rest } = match keys_and_owner(argv) {
        Ok(v) => v,
        Err(e) => return e,
    };
    if !rest.is_empty() {
        return Reply::err(args::SYNTAX_ERR);
    }
    engine::release_all(ctx, keys, owner)
}

pub fn renew_all(ctx: *mut Ctx, argv: &[*mut RStr]) -> Reply {
    let Call { keys, owner, rest } = match keys_and_owner(argv) {
        Ok(v) => v,
        Err(e) => return e,
    };
    let now = now_ms();
    let opts = match args::options(words(rest), args::Grammar::RENEW, now) {
        Ok(o) => o,
        Err(e) => return Reply::err(e),
    };
    if min_replicas::refuses_writes() {
        return Reply::err(min_replicas::NOREPLICAS_ERR);
    }
    let lease_ms = opts.lease_ms.unwrap_or_else(config::default_lease_ms);
    engine::renew_all(ctx, keys, owner, lease_ms, now)
}
