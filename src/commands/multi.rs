//! `RLOCK.ACQUIREALL | RELEASEALL | RENEWALL numkeys key [key ...] owner ...`:
//! Redisson's MultiLock as one atomic step over several RLOCK keys.

use crate::ffi::{Ctx, RStr, Reply};

pub fn acquire_all(_ctx: *mut Ctx, _argv: &[*mut RStr]) -> Reply {
    Reply::err("ERR not implemented yet")
}

pub fn release_all(_ctx: *mut Ctx, _argv: &[*mut RStr]) -> Reply {
    Reply::err("ERR not implemented yet")
}

pub fn renew_all(_ctx: *mut Ctx, _argv: &[*mut RStr]) -> Reply {
    Reply::err("ERR not implemented yet")
}
