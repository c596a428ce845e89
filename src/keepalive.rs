//! KEEPALIVE holdings: the server is the watchdog.
//!
//! An owner's holding acquired with `KEEPALIVE` is bound to the connection
//! that was granted it (the parked connection, for a waiter). While that
//! connection is open, a module timer renews the lease (to now + lease, every
//! third of the lease) through the engine, so the renewal is replicated like a
//! RENEW; when the connection closes, the engine ends every holding bound to
//! it as a release. A binding names the holding by its token: it belongs to the
//! tenure, survives further acquisitions, RELEASE and RENEW by the owner from
//! any connection, and is dropped once the tenure is gone (found at its next
//! renewal). Bindings are connections: never persisted or replicated, and
//! dropped when this server stops being a master.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::os::raw::c_void;

use redis_module::raw;

use crate::ffi::{api, now_ms, Ctx};

/// (db, key, token): one owner's tenure on one key.
type Holding = (i32, Vec<u8>, u64);

struct Binding {
    client: u64,
    lease_ms: i64,
    /// When the timer renews it next (unix ms).
    next: i64,
}

#[derive(Default)]
struct Registry {
    bindings: HashMap<Holding, Binding>,
    by_client: HashMap<u64, HashSet<Holding>>,
    due: BTreeSet<(i64, Holding)>,
    timer: Option<(raw::RedisModuleTimerID, i64)>,
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
}

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    REGISTRY.with(|r| f(&mut r.borrow_mut()))
}

/// Renewals of one tick at most (the rest follow on the next turn).
const MAX_PER_TICK: usize = 1000;

fn renew_every(lease_ms: i64) -> i64 {
    (lease_ms / 3).max(1)
}

/// Binds a holding to `client` (again, if it was bound: the latest wins).
pub fn bind(db: i32, key: &[u8], token: u64, client: u64, lease_ms: i64) {
    let holding = (db, key.to_vec(), token);
    let next = now_ms().saturating_add(renew_every(lease_ms));
    with(|r| {
        if let Some(old) = r.bindings.remove(&holding) {
            r.due.remove(&(old.next, holding.clone()));
            forget_client_holding(r, old.client, &holding);
        }
        r.by_client
            .entry(client)
            .or_default()
            .insert(holding.clone());
        r.due.insert((next, holding.clone()));
        r.bindings.insert(
            holding,
            Binding {
                client,
                lease_ms,
                next,
            },
        );
    });
    arm(crate::ffi::module_context());
}

fn forget_client_holding(r: &mut Registry, client: u64, holding: &Holding) {
    if let Some(set) = r.by_client.get_mut(&client) {
        set.remove(holding);
        if set.is_empty() {
            r.by_client.remove(&client);
        }
    }
}

fn unbind(holding: &Holding) {
    with(|r| {
        if let Some(b) = r.bindings.remove(holding) {
            r.due.remove(&(b.next, holding.clone()));
            forget_client_holding(r, b.client, holding);
        }
    });
}

/// Holdings bound right now (`INFO rlock_keepalive_holds`).
pub fn count() -> usize {
    REGISTRY.with(|r| r.try_borrow().map(|r| r.bindings.len()).unwrap_or(0))
}

/// The client a holding is bound to, if any (for `*.INFO`).
pub fn bound_client(db: i32, key: &[u8], token: u64) -> Option<u64> {
    with(|r| {
        if r.bindings.is_empty() {
            return None;
        }
        r.bindings.get(&(db, key.to_vec(), token)).map(|b| b.client)
    })
}

/// A connection closed: every holding bound to it ends as a release.
pub fn client_gone(ctx: *mut Ctx, client: u64) {
    let holdings = with(|r| {
        let holdings = r.by_client.remove(&client)?;
        for h in &holdings {
            if let Some(b) = r.bindings.remove(h) {
                r.due.remove(&(b.next, h.clone()));
            }
        }
        Some(holdings)
    });
    for (db, key, token) in holdings.into_iter().flatten() {
        crate::engine::end_holding(ctx, db, &key, token);
    }
}

/// Drops every binding (this server is no longer a master, or reloads its
/// dataset: a holding then runs out its last lease).
pub fn clear() {
    with(|r| {
        r.bindings.clear();
        r.by_client.clear();
        r.due.clear();
    });
}

fn arm(ctx: *mut Ctx) {
    let stale = with(|r| {
        let due = r.due.first()?.0;
        match r.timer {
            Some((_, at)) if at <= due => None,
            _ => Some((r.timer.take(), due)),
        }
    });
    let Some((old, due)) = stale else { return };
    unsafe {
        if let Some((id, _)) = old {
            api!(RedisModule_StopTimer)(ctx, id, std::ptr::null_mut());
        }
        let delay = due.saturating_sub(now_ms()).max(0);
        let id = api!(RedisModule_CreateTimer)(ctx, delay, Some(on_timer), std::ptr::null_mut());
        with(|r| r.timer = Some((id, due)));
    }
}

/// Renews the holdings that are due; a holding whose tenure is gone is unbound.
unsafe extern "C" fn on_timer(ctx: *mut Ctx, _data: *mut c_void) {
    crate::ffi::contained("keepalive timer", (), || {
        let now = now_ms();
        let due: Vec<(Holding, i64)> = with(|r| {
            r.timer = None;
            let mut due = Vec::new();
            while due.len() < MAX_PER_TICK {
                match r.due.first() {
                    Some((at, _)) if *at <= now => {}
                    _ => break,
                }
                let (_, holding) = r.due.pop_first().expect("checked");
                if let Some(b) = r.bindings.get_mut(&holding) {
                    // Next renewal from now on; the entry goes back below.
                    b.next = now.saturating_add(renew_every(b.lease_ms));
                    due.push((holding, b.lease_ms));
                }
            }
            due
        });
        // A master refusing writes renews nothing (as it refuses RENEW).
        let renew = crate::role::is_master() && !crate::min_replicas::refuses_writes();
        for (holding, lease_ms) in due {
            let (db, key, token) = &holding;
            let alive = !renew || crate::engine::keep_alive(ctx, *db, key, *token, lease_ms);
            if alive {
                with(|r| {
                    if let Some(next) = r.bindings.get(&holding).map(|b| b.next) {
                        r.due.insert((next, holding));
                    }
                });
            } else {
                unbind(&holding);
            }
        }
        arm(ctx);
    })
}
