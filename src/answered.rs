//! Waiters the module has answered that Redis has not unblocked yet, and the
//! command filter that keeps `CLIENT UNBLOCK` off them.
//!
//! `RM_UnblockClient` answers a key-blocked client, but Redis unblocks it
//! only when it next handles module-unblocked clients (before the event
//! loop sleeps). Until then a `CLIENT UNBLOCK` of that client, sent by
//! another client in the same turn, finds it still blocked and answers it
//! again: Redis 7.0 writes `-UNBLOCKED` after the token (so every later
//! reply on that connection answers the command before it), Redis 8.2 and
//! Valkey 8.1 drop the token and write `-UNBLOCKED` alone while the lock is
//! held in the waiter's name. Redis's own blocking commands have no such
//! moment (a served `BLPOP` is unblocked at once). So while any answered
//! waiter is still blocked, a command filter makes `CLIENT UNBLOCK` of one
//! of them name client 0, which no client has: Redis answers 0, as for a
//! client that does not wait, and the waiter keeps its answer.
//!
//! The filter is registered only while such a waiter exists (from the
//! answer to Redis's unblocking, which frees the waiter's private data), so
//! no other command pays for it. Inside MULTI Redis filters a command when
//! it is queued: an UNBLOCK queued before a grant made in the same turn of
//! the event loop as its EXEC (by the EXEC, or by another client's command
//! just before it) is not caught; with ERROR Redis then writes `-UNBLOCKED`
//! to the waiter itself (README, "Waiting").

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use redis_module::raw::{RedisModuleCommandFilter, RedisModuleCommandFilterCtx};

use crate::ffi::{api, bytes, OwnedStr};

/// Usually empty; one release that admits 10,000 readers answers 10,000 at
/// once, hence maps (a client waits once at a time: one entry per client).
struct Answered {
    /// waiter id -> its client's id
    waiters: HashMap<u64, u64>,
    clients: HashSet<u64>,
    filter: *mut RedisModuleCommandFilter,
}

thread_local! {
    static ANSWERED: RefCell<Option<Answered>> = const { RefCell::new(None) };
}

/// Waiter `waiter` of client `client` is about to be answered.
pub fn mark(waiter: u64, client: u64) {
    ANSWERED.with_borrow_mut(|a| {
        let a = a.get_or_insert_with(|| Answered {
            waiters: HashMap::new(),
            clients: HashSet::new(),
            filter: std::ptr::null_mut(),
        });
        a.waiters.insert(waiter, client);
        a.clients.insert(client);
        if a.filter.is_null() {
            a.filter = unsafe {
                api!(RedisModule_RegisterCommandFilter)(
                    crate::ffi::module_context(),
                    Some(keep_unblock_off_answered),
                    redis_module::raw::REDISMODULE_CMDFILTER_NOSELF as i32,
                )
            };
        }
    })
}

/// Redis has finished with waiter `waiter` (answered or not).
pub fn unblocked(waiter: u64) {
    ANSWERED.with_borrow_mut(|slot| {
        let Some(a) = slot else {
            return;
        };
        if let Some(client) = a.waiters.remove(&waiter) {
            a.clients.remove(&client);
        }
        if a.waiters.is_empty() {
            if !a.filter.is_null() {
                let ctx = crate::ffi::module_context();
                unsafe { api!(RedisModule_UnregisterCommandFilter)(ctx, a.filter) };
            }
            // Nothing kept: a burst of answers must not pin its peak size.
            *slot = None;
        }
    })
}

fn is_answered(client: u64) -> bool {
    ANSWERED.with_borrow(|a| a.as_ref().is_some_and(|a| a.clients.contains(&client)))
}

unsafe extern "C" fn keep_unblock_off_answered(fctx: *mut RedisModuleCommandFilterCtx) {
    crate::ffi::contained("command filter", (), || {
        if api!(RedisModule_CommandFilterArgsCount)(fctx) < 3 {
            return;
        }
        let arg = |i| bytes(api!(RedisModule_CommandFilterArgGet)(fctx, i));
        if !arg(0).eq_ignore_ascii_case(b"client") || !arg(1).eq_ignore_ascii_case(b"unblock") {
            return;
        }
        if client_id(arg(2)).is_some_and(is_answered) {
            let none = OwnedStr::new(b"0").leak();
            api!(RedisModule_CommandFilterArgReplace)(fctx, 2, none);
        }
    })
}

/// A client id as Redis reads it (digits, no sign, no leading zero).
fn client_id(arg: &[u8]) -> Option<u64> {
    let canonical = matches!(arg, [b'1'..=b'9', ..]) && arg.iter().all(u8::is_ascii_digit);
    canonical.then(|| std::str::from_utf8(arg).ok()?.parse().ok())?
}

#[cfg(test)]
mod tests {
    use super::client_id;

    #[test]
    fn client_ids_are_read_as_redis_reads_them() {
        assert_eq!(client_id(b"7"), Some(7));
        assert_eq!(client_id(b"18446744073709551615"), Some(u64::MAX));
        for bad in [
            &b""[..],
            b"0",
            b"07",
            b"+7",
            b"-7",
            b"7 ",
            b"x",
            b"18446744073709551616",
        ] {
            assert_eq!(client_id(bad), None, "{bad:?}");
        }
    }
}
