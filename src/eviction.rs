//! Says in the server log when Redis may evict lock keys.
//!
//! Under `maxmemory`, every policy but `noeviction` lets Redis evict a lock key
//! like any other key, and an evicted lock is released under its holder, who
//! is not told (the unlock channel says `forced`, parked waiters get
//! TRYAGAIN). Every lock carries its lease as a TTL, so the `volatile-*`
//! policies choose among locks first and `volatile-ttl` takes the shortest
//! leases. No module API exempts a key from
//! eviction, so the module warns: when it loads, and when `CONFIG SET` turns
//! eviction on (once per turn, not on every config change while it stays on).

use std::sync::atomic::{AtomicBool, Ordering};

use crate::ffi::{config_number, config_value, log_warning, Ctx};

/// Whether the warning for the current settings was logged already.
static WARNED: AtomicBool = AtomicBool::new(false);

/// Reads `maxmemory` and `maxmemory-policy` and warns if they now allow
/// eviction and did not before.
pub fn check(ctx: *mut Ctx) {
    let maxmemory = config_number(ctx, "maxmemory");
    let policy = config_value(ctx, "maxmemory-policy");
    match warning(maxmemory, policy.as_deref()) {
        Some(text) if !WARNED.swap(true, Ordering::Relaxed) => log_warning(&text),
        Some(_) => {}
        None => WARNED.store(false, Ordering::Relaxed),
    }
}

/// The warning these settings deserve, if any. Unreadable settings get none.
fn warning(maxmemory: Option<i64>, policy: Option<&str>) -> Option<String> {
    let (maxmemory, policy) = (maxmemory?, policy?);
    if maxmemory <= 0 || policy == "noeviction" {
        return None;
    }
    let first = if policy.starts_with("volatile-") {
        " (every lock has its lease as a TTL, so this policy evicts locks first)"
    } else {
        ""
    };
    Some(format!(
        "rlock: maxmemory {maxmemory} with maxmemory-policy {policy}: Redis may evict lock keys \
         to free memory{first}, which releases a lock under its holder without telling it. \
         A server that holds locks should run with maxmemory-policy noeviction: at the limit an \
         ACQUIRE is then refused with OOM while RELEASE, RENEW and hand-overs go on."
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_limit_with_an_evicting_policy_is_warned_about() {
        assert!(warning(Some(0), Some("allkeys-lru")).is_none());
        assert!(warning(Some(1 << 20), Some("noeviction")).is_none());
        assert!(warning(None, Some("allkeys-lru")).is_none());
        assert!(warning(Some(1 << 20), None).is_none());
        let all = warning(Some(1 << 20), Some("allkeys-random")).unwrap();
        assert!(all.contains("maxmemory-policy allkeys-random"), "{all}");
        assert!(!all.contains("evicts locks first"), "{all}");
        let volatile = warning(Some(1 << 20), Some("volatile-ttl")).unwrap();
        assert!(volatile.contains("evicts locks first"), "{volatile}");
    }
}
