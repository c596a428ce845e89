//! KEEPALIVE holdings: the server is the watchdog.
//!
//! An owner's holding acquired with `KEEPALIVE` is bound to the connection
//! that was granted it (the parked connection, for a waiter). While that
//! connection is open, a module timer renews the lease (to now + lease, every
//! third of the lease) through the engine, so the renewal is replicated like a
//! RENEW (a tick's renewals as one `RLOCK.DELTAS` per database); when the
//! connection closes, the engine ends every holding bound to it as a release.
//! A binding names the holding by its token: it belongs to the tenure,
//! survives further acquisitions, RELEASE and RENEW by the owner from any
//! connection, follows its value through `SWAPDB`, and is dropped once the
//! tenure is gone (found at its next renewal). Bindings are connections: never
//! persisted or replicated, and dropped when this server stops being a master.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::os::raw::c_void;
use std::rc::Rc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::ffi::{now_ms, Ctx, OwnedStr};
use crate::timer::{self, Armed};

/// (db, key, token): one owner's tenure on one key.
type Holding = (i32, Vec<u8>, u64);

struct Binding {
    holding: Holding,
    /// The key as a module string, made once at binding: every renewal hands
    /// it to the engine as it is.
    keyname: Rc<OwnedStr>,
    client: u64,
    lease_ms: i64,
    /// When the timer renews it next (unix ms).
    next: i64,
}

/// Bindings by a number of their own, so that a renewal finds its binding
/// and keeps the schedule in order without hashing or comparing keys.
#[derive(Default)]
struct Registry {
    last_id: u64,
    bindings: HashMap<u64, Binding>,
    ids: HashMap<Holding, u64>,
    by_client: HashMap<u64, HashSet<u64>>,
    /// (next renewal, binding id)
    due: BTreeSet<(i64, u64)>,
    /// Holdings whose connection closed, to end on the next tick (after a
    /// pause of writes, once it is over).
    closed: Vec<Binding>,
    timer: Option<Armed>,
}

impl Registry {
    /// Thousands of bindings must not pin their peak size once all are gone.
    fn release_spare_capacity(&mut self) {
        if self.bindings.is_empty() && self.bindings.capacity() > 64 {
            self.bindings = HashMap::new();
            self.ids = HashMap::new();
            self.by_client = HashMap::new();
        }
        if self.closed.is_empty() && self.closed.capacity() > 64 {
            self.closed = Vec::new();
        }
    }

    fn remove(&mut self, id: u64) -> Option<Binding> {
        let b = self.bindings.remove(&id)?;
        self.ids.remove(&b.holding);
        self.due.remove(&(b.next, id));
        if let Some(set) = self.by_client.get_mut(&b.client) {
            set.remove(&id);
            if set.is_empty() {
                self.by_client.remove(&b.client);
            }
        }
        Some(b)
    }
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
}

/// Bindings right now, kept outside the registry: every reentrant grant and
/// RENEW asks whether its holding is bound, and with none bound (the usual
/// case) that is a plain global load, not a thread-local access.
static BOUND: AtomicUsize = AtomicUsize::new(0);

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    REGISTRY.with(|r| {
        let mut r = r.borrow_mut();
        let out = f(&mut r);
        r.release_spare_capacity();
        BOUND.store(r.bindings.len(), Ordering::Relaxed);
        out
    })
}

/// Whether any holding is bound.
pub fn any_bound() -> bool {
    BOUND.load(Ordering::Relaxed) > 0
}

/// The owner renewed or acquired again a holding, from any connection, with
/// a lease of its own: if the holding is bound, the binding takes that lease
/// (the latest wins, renewing every third of it) and renews no later than a
/// third of it from now. Otherwise a shorter lease set meanwhile would run
/// out before the renewal the old lease scheduled, the connection still open.
#[inline]
pub fn lease_changed(db: i32, key: &[u8], token: u64, lease_ms: i64) {
    if any_bound() {
        follow_lease(db, key, token, lease_ms);
    }
}

#[inline(never)]
fn follow_lease(db: i32, key: &[u8], token: u64, lease_ms: i64) {
    let sooner = with(|r| {
        let id = *r.ids.get(&(db, key.to_vec(), token))?;
        let b = r.bindings.get_mut(&id)?;
        b.lease_ms = lease_ms;
        let next = now_ms().saturating_add(renew_every(lease_ms));
        (next < b.next).then(|| {
            r.due.remove(&(b.next, id));
            b.next = next;
            r.due.insert((next, id));
        })
    });
    if sooner.is_some() {
        arm(crate::ffi::module_context());
    }
}

/// Renewals of one tick at most (the rest follow on the next turn).
const MAX_PER_TICK: usize = 1000;

fn renew_every(lease_ms: i64) -> i64 {
    (lease_ms / 3).max(1)
}

/// How early a tick may renew a holding due soon: an eighth of its interval.
/// Holdings bound a few milliseconds apart are then renewed in one tick, and
/// stay together (each renewal schedules the next from the same tick), so
/// their effects share one `RLOCK.DELTAS` and the timer fires once for them.
fn renew_early(lease_ms: i64) -> i64 {
    renew_every(lease_ms) / 8
}

/// Binds a holding to `client` (again, if it was bound: the latest wins).
pub fn bind(db: i32, key: &[u8], token: u64, client: u64, lease_ms: i64) {
    let holding = (db, key.to_vec(), token);
    let next = now_ms().saturating_add(renew_every(lease_ms));
    let keyname = Rc::new(OwnedStr::new(key));
    with(|r| {
        if let Some(old) = r.ids.get(&holding).copied() {
            r.remove(old);
        }
        r.last_id += 1;
        let id = r.last_id;
        r.by_client.entry(client).or_default().insert(id);
        r.due.insert((next, id));
        r.ids.insert(holding.clone(), id);
        r.bindings.insert(
            id,
            Binding {
                holding,
                keyname,
                client,
                lease_ms,
                next,
            },
        );
    });
    arm(crate::ffi::module_context());
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
        let id = r.ids.get(&(db, key.to_vec(), token))?;
        r.bindings.get(id).map(|b| b.client)
    })
}

/// A connection closed: every holding bound to it ends as a release, on the
/// timer's next tick (at once, or after a pause of writes). Not here: this
/// event's context is the closing client's own, and selecting the holding's
/// database in it would move that client to another database while Redis
/// frees it (a parked client is then unblocked from the wrong database's
/// keys: a server assertion).
pub fn client_gone(ctx: *mut Ctx, client: u64) {
    let ended = with(|r| {
        let ids = r.by_client.remove(&client).unwrap_or_default();
        let ended: Vec<Binding> = ids.into_iter().filter_map(|id| r.remove(id)).collect();
        r.closed.extend(ended);
        !r.closed.is_empty()
    });
    if ended {
        arm(ctx);
    }
}

fn end_all(ctx: *mut Ctx, ended: Vec<Binding>) {
    for b in ended {
        let (db, _, token) = b.holding;
        crate::engine::end_holding(ctx, db, b.keyname.ptr(), token);
    }
}

/// `SWAPDB a b`: a binding names its holding by database, and the holding's
/// value now lives under the other number.
pub fn swap_dbs(a: i32, b: i32) {
    with(|r| {
        if r.bindings.is_empty() && r.closed.is_empty() {
            return;
        }
        for binding in r.bindings.values_mut().chain(r.closed.iter_mut()) {
            binding.holding.0 = crate::lease::across_swap(binding.holding.0, (a, b));
        }
        r.ids = r
            .bindings
            .iter()
            .map(|(id, binding)| (binding.holding.clone(), *id))
            .collect();
    });
}

/// Drops every binding (this server is no longer a master, or reloads its
/// dataset: a holding then runs out its last lease).
pub fn clear() {
    with(|r| {
        r.bindings.clear();
        r.ids.clear();
        r.by_client.clear();
        r.due.clear();
        r.closed.clear();
    });
}

fn arm(ctx: *mut Ctx) {
    arm_not_before(ctx, i64::MIN);
}

/// Arms the timer for the next renewal (or closed holding to end), not
/// before the millisecond `floor`.
fn arm_not_before(ctx: *mut Ctx, floor: i64) {
    let stale = with(|r| {
        let closed = (!r.closed.is_empty()).then(now_ms);
        let renewal = r.due.first().map(|d| d.0);
        let due = closed.into_iter().chain(renewal).min()?.max(floor);
        timer::take_for(&mut r.timer, due).map(|old| (old, due))
    });
    let Some((old, due)) = stale else { return };
    let armed = timer::arm(ctx, old, due, on_timer);
    with(|r| r.timer = Some(armed));
}

/// One renewal the timer makes, taken out of the registry: the engine may
/// bind or unbind holdings while it runs.
struct Renewal {
    id: u64,
    db: i32,
    keyname: Rc<OwnedStr>,
    token: u64,
    lease_ms: i64,
}

impl Registry {
    /// Up to a tick's worth of the bindings due by `now` (or within an eighth
    /// of their interval), taken off the schedule; each goes back on it once
    /// renewed, at its `next`.
    fn take_due(&mut self, now: i64) -> Vec<Renewal> {
        let mut due = Vec::new();
        while due.len() < MAX_PER_TICK {
            let Some(&(at, id)) = self.due.first() else {
                break;
            };
            let early = self
                .bindings
                .get(&id)
                .map_or(0, |b| renew_early(b.lease_ms));
            if at > now.saturating_add(early) {
                break;
            }
            self.due.pop_first();
            if let Some(b) = self.bindings.get_mut(&id) {
                b.next = now.saturating_add(renew_every(b.lease_ms));
                due.push(Renewal {
                    id,
                    db: b.holding.0,
                    keyname: Rc::clone(&b.keyname),
                    token: b.holding.2,
                    lease_ms: b.lease_ms,
                });
            }
        }
        due
    }
}

/// Renews the holdings that are due; a holding whose tenure is gone is unbound.
unsafe extern "C" fn on_timer(ctx: *mut Ctx, _data: *mut c_void) {
    crate::ffi::contained("keepalive timer", (), || {
        let now = now_ms();
        with(|r| r.timer = None);
        if crate::role::writes_paused() {
            arm_not_before(ctx, now + crate::role::PAUSE_RETRY_MS);
            return;
        }
        // Each end is a whole change (replicated, published): a connection
        // with 50,000 holdings must not take one tick; the rest follow on
        // the next turns of the event loop.
        let closed = with(|r| r.closed.drain(..r.closed.len().min(MAX_PER_TICK)).collect());
        end_all(ctx, closed);
        let due = with(|r| r.take_due(now));
        // A master refusing writes renews nothing (as it refuses RENEW).
        let renew = crate::role::is_master() && !crate::min_replicas::refuses_writes();
        // One `RLOCK.DELTAS` per database for the tick's renewals.
        crate::effect::gathered(ctx, || {
            for d in due {
                let keyname = d.keyname.ptr();
                let alive =
                    !renew || crate::engine::keep_alive(ctx, d.db, keyname, d.token, d.lease_ms);
                with(|r| {
                    if !alive {
                        r.remove(d.id);
                    } else if let Some(next) = r.bindings.get(&d.id).map(|b| b.next) {
                        r.due.insert((next, d.id));
                    }
                });
            }
        });
        arm(ctx);
    })
}
