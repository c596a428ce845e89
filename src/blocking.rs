//! Parking and waking clients.
//!
//! A waiter is parked with `BlockClientOnKeys` on a name in its lock key's slot
//! (`parking_name`), so Redis keeps track of its `CLIENT UNBLOCK`,
//! disconnection and cluster redirects. The lock is never handed over by
//! signalling a key (that would run every waiter's callback on every
//! release). Instead the state machine picks the waiter, the grant is made
//! and replicated inside the command that freed the lock, and `deliver`
//! unblocks exactly that client: `RM_UnblockClient` on a key-blocked client
//! runs its timeout callback at once, which writes the token. So a release
//! costs one wake-up, however long the queue.
//!
//! Redis is never asked to time a waiter out (it is parked with no Redis
//! timeout): its BLOCK deadline is kept here, in the queued `Waiter` and in a
//! deadline set behind one module timer, and the timeout is delivered through
//! `RM_UnblockClient` like a grant. Two reasons, both about a server that was
//! frozen (SIGSTOP, a long command) and catches up:
//! - a waiter past its deadline is never granted: serving skips it, and it is
//!   answered null as a timeout (`Served::TimedOut`);
//! - every unblock goes through Redis's module-unblock path, which sets the
//!   client's replication offset after the grant's effects were propagated, so
//!   `WAIT` on the granted connection waits for the grant. When Redis times a
//!   key-blocked client out itself in the same event-loop turn as a grant, that
//!   path is skipped and `WAIT` would return at once.
//!
//! While the master refuses writes (min-replicas-to-write), a hand-over from
//! the lease timer is withheld: the waiters keep waiting, and the key is
//! served again once the master accepts writes (checked every `RETRY_MS`).
//!
//! The queues live here, not in the key's value: they are made of connections,
//! are neither persisted nor replicated, and must outlive the value when Redis
//! expires the key under them (the first waiter then starts a fresh value) or
//! removes it (the waiters are then told to retry).

use std::cell::RefCell;
use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap, HashSet};
use std::os::raw::{c_int, c_void};
use std::sync::atomic::{AtomicUsize, Ordering};

use redis_module::raw::{self, RedisModuleBlockedClient};

use crate::ffi::{api, bytes, now_ms, send, Ctx, OwnedStr, RStr, Reply, OK};
use crate::lock::{Ahead, Delta, Kind, LockState, Mode, Owner, Served, WaitQueue, Waiter};
use crate::stats;
use crate::timer::{self, Armed};

enum Status {
    Waiting,
    Granted(u64),
    /// A multi-key waiter got every key: the tokens in key order.
    GrantedAll(Vec<u64>),
    Failed(String),
    /// Its BLOCK time ran out: answered null.
    TimedOut,
}

struct Record {
    bc: *mut RedisModuleBlockedClient,
    db: i32,
    /// The keys it is queued on: one, or the keys of an `ACQUIREALL` in order.
    keys: Vec<Vec<u8>>,
    status: Status,
    /// BLOCK deadline (unix ms), 0 for none.
    deadline: i64,
    /// Its connection's client id.
    client: u64,
    /// KEEPALIVE: the lease to bind what it is granted to its connection with.
    keepalive: Option<i64>,
    /// When it was parked (unix ms), for deadlock detection.
    parked_at: i64,
    /// Its owner, to find it in `by_owner` when it leaves.
    owner: Owner,
    /// An `ACQUIREALL`'s waiter: answered an array, or the null array.
    multi: bool,
}

/// The parked waiters of one owner (`Registry::by_owner`): nearly always
/// one, kept in the map's own slot, so that reading a long queue's owners
/// for deadlock detection costs one lookup each, not two.
enum OwnerParked {
    /// One waiter, and whether it waits for a single key.
    One {
        id: u64,
        single_key: bool,
    },
    Many(Vec<u64>),
}

impl OwnerParked {
    fn add(&mut self, id: u64) {
        match self {
            OwnerParked::One { id: first, .. } => *self = OwnerParked::Many(vec![*first, id]),
            OwnerParked::Many(ids) => ids.push(id),
        }
    }

    /// Takes `id` out: whether none is left.
    fn remove(&mut self, id: u64) -> bool {
        match self {
            OwnerParked::One { id: only, .. } => *only == id,
            OwnerParked::Many(ids) => {
                ids.retain(|w| *w != id);
                ids.is_empty()
            }
        }
    }

    fn ids(&self) -> &[u64] {
        match self {
            OwnerParked::One { id, .. } => std::slice::from_ref(id),
            OwnerParked::Many(ids) => ids,
        }
    }
}

/// How often withheld hand-overs re-check whether the master accepts writes.
const RETRY_MS: i64 = 50;

#[derive(Default)]
struct Registry {
    next_id: u64,
    records: HashMap<u64, Record>,
    queues: HashMap<i32, HashMap<Vec<u8>, WaitQueue>>,
    /// (BLOCK deadline, waiter id) of every parked waiter with a timeout.
    deadlines: BTreeSet<(i64, u64)>,
    /// (parked at, waiter id) of the waiters deadlock detection has not checked.
    unchecked: BTreeSet<Unchecked>,
    /// owner -> its parked waiters: deadlock detection follows an owner's
    /// waits from the owners waiting for it. Usually one id; an owner with
    /// none left has no entry.
    by_owner: HashMap<Owner, OwnerParked>,
    /// Keys whose hand-over waits for the master to accept writes again.
    withheld: HashSet<(i32, Vec<u8>)>,
    /// Multi-key waiters first in the queue of a key that could be theirs:
    /// the engine tries to grant them all their keys (`take_multi_ready`).
    multi_ready: Vec<u64>,
    /// The armed timer (a long BLOCK re-arms every `timer::MAX_DELAY_MS`).
    timer: Option<Armed>,
}

impl Registry {
    /// Removes a waiter's record and its entries in the deadline sets.
    fn forget(&mut self, id: u64) -> Option<Record> {
        let rec = self.records.remove(&id)?;
        self.deadlines.remove(&(rec.deadline, id));
        self.unchecked.remove(&(rec.parked_at, id));
        if let Some(parked) = self.by_owner.get_mut(&rec.owner) {
            if parked.remove(id) {
                self.by_owner.remove(&rec.owner);
            }
        }
        Some(rec)
    }

    /// A burst of waiters must not pin its peak size once everyone has left.
    fn release_spare_capacity(&mut self) {
        if self.records.is_empty() && self.records.capacity() > 64 {
            self.records.shrink_to_fit();
        }
        if self.by_owner.is_empty() && self.by_owner.capacity() > 64 {
            self.by_owner = HashMap::new();
        }
        if !any_queued() && self.queues.values().all(|q| q.is_empty()) && self.queues.capacity() > 8
        {
            self.queues = HashMap::new();
        }
    }
}

thread_local! {
    static REGISTRY: RefCell<Registry> = RefCell::new(Registry::default());
}

/// Queue entries on every key (a multi-key waiter counts once per key). Kept
/// outside the registry because every lock command asks whether it is zero:
/// a plain global load, where the registry is a thread-local (a call into the
/// dynamic linker from a loaded module). Only the main thread writes it.
static QUEUED: AtomicUsize = AtomicUsize::new(0);

fn add_queued(added: usize, removed: usize) {
    QUEUED.store(
        QUEUED.load(Ordering::Relaxed) + added - removed,
        Ordering::Relaxed,
    );
}

fn with<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    REGISTRY.with(|r| f(&mut r.borrow_mut()))
}

/// Clients parked right now.
pub fn parked() -> usize {
    REGISTRY.with(|r| r.try_borrow().map(|r| r.records.len()).unwrap_or(0))
}

/// Whether any queue exists at all: the fast path of every lock command.
pub fn any_queued() -> bool {
    QUEUED.load(Ordering::Relaxed) > 0
}

/// Runs `f` on the queue of a key, if it has one. Removes the queue once empty.
pub fn with_queue<R>(db: i32, key: &[u8], f: impl FnOnce(&mut WaitQueue) -> R) -> Option<R> {
    with(|r| {
        let queues = r.queues.get_mut(&db)?;
        let q = queues.get_mut(key)?;
        let before = q.len();
        let out = f(q);
        let after = q.len();
        if q.is_empty() {
            queues.remove(key);
        }
        add_queued(after, before);
        Some(out)
    })
}

pub fn queue_len(db: i32, key: &[u8]) -> usize {
    with_queue(db, key, |q| q.len()).unwrap_or(0)
}

/// A semaphore's limit in force, kept with its waiters while its key is gone
/// (nothing to keep without waiters: the next grant's own limit starts it).
pub fn keep_limit(db: i32, key: &[u8], limit: u32) {
    if any_queued() {
        with_queue(db, key, |q| q.keep_limit(limit));
    }
}

/// Keys (db, name) that have a queue, for re-serving after a flush.
pub fn queued_keys(db: Option<i32>) -> Vec<(i32, Vec<u8>)> {
    with(|r| {
        r.queues
            .iter()
            .filter(|(d, _)| db.is_none_or(|x| x == **d))
            .flat_map(|(d, qs)| qs.keys().map(move |k| (*d, k.clone())))
            .collect()
    })
}

/// Queues a new waiter behind everyone else and returns its id.
pub fn enqueue(db: i32, key: &[u8], kind: Kind, owner: &[u8], mode: Mode, lease_ms: i64) -> u64 {
    enqueue_on(db, &[key], kind, owner, mode, lease_ms, false)
}

/// Queues a multi-key waiter (`ACQUIREALL ... BLOCK`) behind everyone else on
/// each of its keys, under one id.
pub fn enqueue_all(db: i32, keys: &[&[u8]], owner: &[u8], lease_ms: i64) -> u64 {
    enqueue_on(
        db,
        keys,
        Kind::Reentrant,
        owner,
        Mode::Write,
        lease_ms,
        true,
    )
}

fn enqueue_on(
    db: i32,
    keys: &[&[u8]],
    kind: Kind,
    owner: &[u8],
    mode: Mode,
    lease_ms: i64,
    multi: bool,
) -> u64 {
    // A queue's waiters are of one family. Waiters of another family still
    // queued on one of these keys wait for a value that is gone: the caller
    // found the key holding its own family (or absent, with no such queue),
    // and their serve pass, due on the next tick, would tell them WRONGTYPE.
    // They are told now, so this waiter never joins a queue of another
    // family (which its family's next hand-over would refuse, or a lock of
    // the other family made for its head would be granted to it).
    for key in keys {
        if with_queue(db, key, |q| q.kind() != kind) == Some(true) {
            fail_all(db, key, crate::lock::err::WRONGTYPE);
        }
    }
    with(|r| {
        r.next_id += 1;
        let id = r.next_id;
        let queues = r.queues.entry(db).or_default();
        for key in keys {
            let q = queues
                .entry(key.to_vec())
                .or_insert_with(|| WaitQueue::new(kind));
            q.push(Waiter {
                id,
                owner: Owner::new(owner),
                mode,
                lease_ms,
                deadline: 0,
                multi,
            });
        }
        add_queued(keys.len(), 0);
        id
    })
}

/// What a waiter is parked on in Redis: not its lock key but a name beside it
/// that nothing creates, in the key's cluster slot (Redis redirects parked
/// clients by slot when it migrates). Redis offers a key to every client
/// parked on it whenever the key is added (a lock made again after its lease
/// ran out under waiters, `RESTORE`, `SWAPDB`); grants never travel that way,
/// so every waiter declined, and Redis 7.0 then leaves its current client
/// pointing at the last one that declined (`serveClientsBlockedOnKeyByModule`
/// skips restoring it). When that waiter was freed inside another client's
/// command (`CLIENT KILL`), the dangling pointer was read later and the
/// server crashed.
fn parking_name(key: &[u8], cluster: bool) -> Vec<u8> {
    if !cluster {
        return [key, PARKED].concat();
    }
    let hashed = slot_hashed_part(key);
    if hashed.is_empty() || hashed.contains(&b'}') {
        // No tag of ours can hold this (a key hashed whole with a `}` in it,
        // or the empty key): two bytes after the mark put the name in the slot.
        return name_in_slot(crc16(hashed) & SLOT_MASK);
    }
    [b"{", hashed, b"}", PARKED].concat()
}

const PARKED: &[u8] = b"\0rlock:parked";
const SLOT_MASK: u16 = 16383;

/// `PARKED` and two bytes, hashed whole (no `{` in it), in cluster slot
/// `slot`. Of the 65,536 suffixes four land in each slot (the CRC of a fixed
/// prefix and two free bytes takes every 16-bit value once); the search takes
/// 17 µs on average here, paid only by waiters of such keys.
fn name_in_slot(slot: u16) -> Vec<u8> {
    let prefix = crc16(PARKED);
    let suffix = (0..=u16::MAX)
        .map(u16::to_be_bytes)
        .filter(|b| !b.contains(&b'{'))
        .find(|b| crc16_from(prefix, b) & SLOT_MASK == slot)
        .expect("every slot is reached by two bytes without a brace");
    [PARKED, &suffix].concat()
}

/// Redis Cluster's hash: CRC-16/XMODEM.
fn crc16(bytes: &[u8]) -> u16 {
    crc16_from(0, bytes)
}

fn crc16_from(mut crc: u16, bytes: &[u8]) -> u16 {
    for &b in bytes {
        crc = (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)];
    }
    crc
}

const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut i = 0;
    while i < 256 {
        let mut crc = (i as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[i] = crc;
        i += 1;
    }
    table
};

/// The part of a key Redis Cluster hashes for its slot: the hash tag (the
/// text between the first `{` and the next `}`) when non-empty, else the key.
fn slot_hashed_part(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{') {
        let rest = &key[open + 1..];
        if let Some(len) = rest.iter().position(|&b| b == b'}') {
            if len > 0 {
                return &rest[..len];
            }
        }
    }
    key
}

/// Blocks the calling client as waiter `id` (already queued) on `keynames`,
/// for `timeout_ms` (0: forever). Redis gets no timeout: see the module doc.
pub fn park(
    ctx: *mut Ctx,
    keynames: &[*mut RStr],
    db: i32,
    id: u64,
    timeout_ms: i64,
    keepalive_lease: Option<i64>,
) {
    let client = crate::engine::client_id(ctx);
    let bc = block_on_parking_names(ctx, keynames, id);
    let keys: Vec<Vec<u8>> = keynames
        .iter()
        .map(|k| unsafe { bytes(*k) }.to_vec())
        .collect();
    let deadline = if timeout_ms > 0 {
        now_ms().saturating_add(timeout_ms)
    } else {
        0
    };
    if deadline != 0 {
        for key in &keys {
            with_queue(db, key, |q| q.set_deadline(id, deadline));
        }
    }
    // Queued on each of its keys just before it parks, under its owner.
    let (owner, multi) = keys
        .first()
        .and_then(|key| with_queue(db, key, |q| q.get(id).map(|w| (w.owner.clone(), w.multi))))
        .flatten()
        .unwrap_or_else(|| (Owner::new(b""), keys.len() > 1));
    register(
        id,
        Record {
            bc,
            db,
            keys,
            status: Status::Waiting,
            deadline,
            client,
            keepalive: keepalive_lease,
            parked_at: now_ms(),
            owner,
            multi,
        },
    );
    if deadline != 0 {
        arm(ctx);
    }
}

/// Blocks the calling client on the parking names beside its keys
/// (`parking_name`), with no timeout of Redis's, and hears its disconnect.
fn block_on_parking_names(
    ctx: *mut Ctx,
    keynames: &[*mut RStr],
    id: u64,
) -> *mut RedisModuleBlockedClient {
    let cluster = crate::ffi::ctx_flags(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER != 0;
    let parking: Vec<OwnedStr> = keynames
        .iter()
        .map(|k| OwnedStr::new(&parking_name(unsafe { bytes(*k) }, cluster)))
        .collect();
    let mut names: Vec<*mut RStr> = parking.iter().map(OwnedStr::ptr).collect();
    let bc = unsafe {
        api!(RedisModule_BlockClientOnKeys)(
            ctx,
            Some(on_key_ready),
            Some(on_timeout),
            Some(on_unblocked),
            0,
            names.as_mut_ptr(),
            names.len() as c_int,
            id_as_privdata(id),
        )
    };
    unsafe { api!(RedisModule_SetDisconnectCallback)(bc, Some(on_disconnect)) };
    bc
}

/// A parked waiter's record, indexed by its BLOCK deadline (timeouts), by
/// when it parked (deadlock detection) and by its owner.
fn register(id: u64, record: Record) {
    with(|r| {
        if record.deadline != 0 {
            r.deadlines.insert((record.deadline, id));
        }
        r.unchecked.insert((record.parked_at, id));
        let single_key = record.keys.len() == 1;
        match r.by_owner.entry(record.owner.clone()) {
            Entry::Occupied(mut e) => e.get_mut().add(id),
            Entry::Vacant(e) => {
                e.insert(OwnerParked::One { id, single_key });
            }
        }
        r.records.insert(id, record);
    });
}

/// Serves the queue of a key for the engine: waiters past their BLOCK time
/// are dropped, then the head is granted if it fits, unless this master
/// refuses writes (min-replicas-to-write): the hand-over then waits.
pub fn serve(
    db: i32,
    key: &[u8],
    lock: &mut LockState,
    now: i64,
    issue: &mut dyn FnMut() -> Option<u64>,
    delta: &mut Delta,
) -> Vec<Served> {
    let (served, withheld, multi) = with_queue(db, key, |q| {
        let mut served = q.drop_timed_out(now);
        if q.head_admissible(lock) && crate::min_replicas::refuses_writes() {
            return (served, true, None);
        }
        served.extend(q.serve(lock, now, issue, delta));
        (served, false, q.multi_head_ready(lock, now))
    })
    .unwrap_or_default();
    if withheld {
        withhold(db, key);
    }
    if let Some(id) = multi {
        with(|r| r.multi_ready.push(id));
    }
    served
}

/// The hand-over on `key` waits until the master accepts writes again.
pub fn withhold(db: i32, key: &[u8]) {
    let first = with(|r| {
        r.withheld.insert((db, key.to_vec()));
        r.withheld.len() == 1
    });
    if first {
        arm(crate::ffi::module_context());
    }
}

/// A waiter deadlock detection has not checked yet: (parked at, id).
pub type Unchecked = (i64, u64);

/// The waiter parked last of those parked at or before `parked_before` that
/// deadlock detection has not checked. The newest first: its waits reach
/// the most of a long queue, whose older waiters are then checked for free.
pub fn newest_unchecked(parked_before: i64) -> Option<Unchecked> {
    with(|r| {
        r.unchecked
            .range(..=(parked_before, u64::MAX))
            .next_back()
            .copied()
    })
}

/// Takes the waiter `newest_unchecked` would give: deadlock detection
/// checks it now, and it counts as checked from now on.
pub fn take_newest_unchecked(parked_before: i64) -> Option<Unchecked> {
    with(|r| {
        let newest = *r
            .unchecked
            .range(..=(parked_before, u64::MAX))
            .next_back()?;
        r.unchecked.remove(&newest);
        Some(newest)
    })
}

/// Its check was put off: checked again later, if it is still parked.
pub fn put_back_unchecked(waiter: Unchecked) {
    with(|r| {
        if r.records.contains_key(&waiter.1) {
            r.unchecked.insert(waiter);
        }
    });
}

/// The waiters queued on a key are checked by deadlock detection again: the
/// key's value was replaced under them (`SWAPDB`, another lock renamed or
/// restored over the key) and they wait for its holders now, which can close
/// a cycle that no new wait closes.
pub fn recheck_queue(db: i32, key: &[u8]) {
    with(|r| {
        let Registry {
            queues,
            records,
            unchecked,
            ..
        } = r;
        let Some(q) = queues.get(&db).and_then(|qs| qs.get(key)) else {
            return;
        };
        for w in q.waiters() {
            if let Some(rec) = records.get(&w.id) {
                unchecked.insert((rec.parked_at, w.id));
            }
        }
    })
}

/// The owner of a parked waiter.
pub fn owner_of(id: u64) -> Option<Owner> {
    with(|r| r.records.get(&id).map(|rec| rec.owner.clone()))
}

/// The owner's only parked waiter, if it has one and it waits for a single
/// key.
pub fn sole_wait(owner: &[u8]) -> Option<u64> {
    with(|r| match r.by_owner.get(owner) {
        Some(&OwnerParked::One {
            id,
            single_key: true,
        }) => Some(id),
        _ => None,
    })
}

/// A key a parked waiter is queued on, as deadlock detection sees it.
pub struct QueuedOn {
    pub key: Vec<u8>,
    /// The waiters ahead of it, nearest first, as far as their owners wait
    /// nowhere else: a long queue is read in one go, not one owner at a
    /// time. Empty: it is first.
    pub ahead: Vec<Ahead>,
}

/// One parked wait of an owner and the lock queues it is in.
pub struct ParkedWait {
    pub id: u64,
    pub db: i32,
    pub on: Vec<QueuedOn>,
}

/// The parked waits of an owner. Semaphores' queues are left out: a
/// semaphore's waiter needs only some holders to return permits, so no
/// wait-for edge says it waits for one of them.
pub fn parked_waits(owner: &[u8]) -> Vec<ParkedWait> {
    with(|r| {
        let Some(parked) = r.by_owner.get(owner) else {
            return Vec::new();
        };
        parked
            .ids()
            .iter()
            .filter_map(|&id| {
                let rec = r.records.get(&id)?;
                let queues = r.queues.get(&rec.db)?;
                let on = rec.keys.iter().filter_map(|key| {
                    let q = queues.get(key)?;
                    (q.kind() != Kind::Semaphore && q.get(id).is_some()).then(|| QueuedOn {
                        key: key.clone(),
                        ahead: r.ahead_run(q, id),
                    })
                });
                Some(ParkedWait {
                    id,
                    db: rec.db,
                    on: on.collect(),
                })
            })
            .collect()
    })
}

/// The waiters ahead of waiter `id` in the queue of a key, read as
/// `QueuedOn::ahead` is: deadlock detection reads on past a waiter whose
/// owner holds the key (it has no wait there, see `lock::direct_waits`).
pub fn waiters_ahead(db: i32, key: &[u8], id: u64) -> Vec<Ahead> {
    with(|r| match r.queues.get(&db).and_then(|qs| qs.get(key)) {
        Some(q) => r.ahead_run(q, id),
        None => Vec::new(),
    })
}

impl Registry {
    /// The waiters ahead of `id` in `q`, nearest first, up to the first
    /// whose owner also waits elsewhere (see `QueuedOn::ahead`).
    fn ahead_run(&self, q: &WaitQueue, id: u64) -> Vec<Ahead> {
        let mut run = Vec::new();
        for w in q.waiters_ahead_of(id) {
            let sole = matches!(
                self.by_owner.get(&w.owner),
                Some(&OwnerParked::One { id, single_key: true }) if id == w.id
            );
            run.push(Ahead {
                id: w.id,
                owner: w.owner.clone(),
                sole,
            });
            if !sole {
                break;
            }
        }
        run
    }
}

/// A multi-key waiter that a key's queue found ready for it, if any.
pub fn take_multi_ready() -> Option<u64> {
    with(|r| r.multi_ready.pop())
}

/// A parked multi-key waiter, as the engine needs it to try a grant.
pub struct MultiWaiter {
    pub db: i32,
    pub keys: Vec<Vec<u8>>,
    pub owner: Vec<u8>,
    pub lease_ms: i64,
    pub deadline: i64,
}

pub fn multi_waiter(id: u64) -> Option<MultiWaiter> {
    let (db, keys, deadline) = with(|r| {
        let rec = r.records.get(&id)?;
        matches!(rec.status, Status::Waiting).then(|| (rec.db, rec.keys.clone(), rec.deadline))
    })?;
    let (owner, lease_ms) = with_queue(db, &keys[0], |q| {
        q.get(id).map(|w| (w.owner.to_vec(), w.lease_ms))
    })??;
    Some(MultiWaiter {
        db,
        keys,
        owner,
        lease_ms,
        deadline,
    })
}

/// Whether waiter `id` is first in the queue of `key`.
pub fn is_head(db: i32, key: &[u8], id: u64) -> bool {
    with_queue(db, key, |q| q.head_id() == Some(id)).unwrap_or(false)
}

/// Takes a multi-key waiter out of every queue it is in (it was granted).
pub fn dequeue_all(db: i32, keys: &[Vec<u8>], id: u64) {
    for key in keys {
        with_queue(db, key, |q| q.remove(id));
    }
}

/// Answers a multi-key waiter with its tokens (already dequeued).
pub fn deliver_all(id: u64, tokens: Vec<u64>, lease_ms: i64) {
    stats::bump(&stats::CONTENDED_GRANTS, 1);
    bind_granted(id, &tokens, lease_ms);
    unblock(id, Status::GrantedAll(tokens));
}

fn next_due(r: &Registry) -> Option<i64> {
    let deadline = r.deadlines.first().map(|(d, _)| d.saturating_add(1));
    let retry = (!r.withheld.is_empty()).then(|| now_ms().saturating_add(RETRY_MS));
    match (deadline, retry) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// (Re)arms the timer for the earliest BLOCK deadline or withheld retry.
fn arm(ctx: *mut Ctx) {
    let stale = with(|r| {
        let due = next_due(r)?;
        timer::take_for(&mut r.timer, due).map(|old| (old, due))
    });
    let Some((old, due)) = stale else { return };
    let armed = timer::arm(ctx, old, due, on_timer);
    with(|r| r.timer = Some(armed));
}

/// Ends the waits whose BLOCK time ran out, and retries withheld hand-overs
/// once the master accepts writes again.
unsafe extern "C" fn on_timer(ctx: *mut Ctx, _data: *mut c_void) {
    crate::ffi::contained("blocking timer", (), || {
        let now = now_ms();
        let due: Vec<u64> = with(|r| {
            r.timer = None;
            let mut due = Vec::new();
            while let Some(&(deadline, id)) = r.deadlines.first() {
                if deadline >= now {
                    break;
                }
                r.deadlines.pop_first();
                due.push(id);
            }
            due
        });
        for id in due {
            let waiting = with(|r| {
                r.records
                    .get(&id)
                    .is_some_and(|rec| matches!(rec.status, Status::Waiting))
            });
            if waiting {
                unblock(id, Status::TimedOut);
            }
        }
        let retry = with(|r| !r.withheld.is_empty())
            && !crate::min_replicas::refuses_writes()
            && !crate::role::writes_paused();
        if retry {
            let keys: Vec<(i32, Vec<u8>)> = with(|r| r.withheld.drain().collect());
            for (db, key) in keys {
                crate::engine::serve_queue(ctx, db, &key, crate::lease::IfAbsent::Grant);
            }
        }
        arm(ctx);
    })
}

/// Answers the waiters the state machine served (already dequeued).
/// Call with no registry borrow held: unblocking re-enters `on_timeout`.
#[inline]
pub fn deliver(served: Vec<Served>) {
    if !served.is_empty() {
        answer(served);
    }
}

#[inline(never)]
fn answer(served: Vec<Served>) {
    for s in served {
        let (id, status) = match s {
            Served::Granted {
                id,
                token,
                lease_ms,
            } => {
                stats::bump(&stats::CONTENDED_GRANTS, 1);
                bind_granted(id, &[token], lease_ms);
                (id, Status::Granted(token))
            }
            Served::Refused { id, error } => (id, Status::Failed(error.to_string())),
            Served::TimedOut { id } => (id, Status::TimedOut),
        };
        unblock(id, status);
    }
}

/// A waiter was granted `tokens` (one per key) with `lease_ms`: a KEEPALIVE
/// waiter's holdings are bound to its connection; another's, where a holding
/// it already had is bound, keep the binding in step with the new lease.
fn bind_granted(id: u64, tokens: &[u64], lease_ms: i64) {
    let any_bound = crate::keepalive::any_bound();
    let granted = with(|r| {
        let rec = r.records.get(&id)?;
        let keepalive = rec.keepalive.map(|lease| (rec.client, lease));
        (keepalive.is_some() || any_bound).then(|| (rec.db, rec.keys.clone(), keepalive))
    });
    let Some((db, keys, keepalive)) = granted else {
        return;
    };
    for (key, token) in keys.iter().zip(tokens) {
        match keepalive {
            Some((client, lease)) => crate::keepalive::bind(db, key, *token, client, lease),
            None => crate::keepalive::lease_changed(db, key, *token, lease_ms),
        }
    }
}

/// Ends the wait of one waiter with an error; it leaves every queue it is in
/// as it is answered (`depart`).
pub fn fail(id: u64, error: &str) {
    unblock(id, Status::Failed(error.to_string()));
}

/// Ends the wait of every client queued on a key with an error.
pub fn fail_all(db: i32, key: &[u8], error: &str) {
    let ids: Vec<u64> = with_queue(db, key, |q| {
        let ids: Vec<u64> = q.waiters().map(|w| w.id).collect();
        ids.iter().for_each(|id| {
            q.remove(*id);
        });
        ids
    })
    .unwrap_or_default();
    for id in ids {
        unblock(id, Status::Failed(error.to_string()));
    }
}

fn unblock(id: u64, status: Status) {
    let waiter = with(|r| {
        r.records.get_mut(&id).map(|rec| {
            rec.status = status;
            (rec.bc, rec.client)
        })
    });
    if let Some((bc, client)) = waiter {
        crate::answered::mark(id, client);
        // Runs on_timeout at once for key-blocked clients (Redis 7.0+); Redis
        // unblocks the client later, which `answered` covers.
        unsafe { api!(RedisModule_UnblockClient)(bc, std::ptr::null_mut()) };
    }
}

// A waiter's id is its blocked client's private data, carried in the pointer
// itself: nothing to allocate when it parks, and nothing (cold by the time
// its turn comes) to read or free when it is answered. Ids start at 1, so
// the pointer is never null, and they are 64 bits, as pointers are here.
const _: () = assert!(usize::BITS == u64::BITS);

fn id_as_privdata(id: u64) -> *mut c_void {
    std::ptr::without_provenance_mut(id as usize)
}

unsafe fn waiter_id(ctx: *mut Ctx) -> Option<u64> {
    let p = api!(RedisModule_GetBlockedClientPrivateData)(ctx);
    (!p.is_null()).then(|| p.addr() as u64)
}

/// A waiter's wait ended, however (granted, refused, timed out, unblocked,
/// disconnected): forget it and take it out of every queue it is still in.
/// An answer does not dequeue by itself: a deadlock victim, or a multi-key
/// waiter refused on one of its keys, would otherwise stay queued on the
/// others, to be granted later or to reserve a free key for nobody. Where it
/// was first, the lock serves whoever is first now.
fn depart(ctx: *mut Ctx, id: u64) -> Option<(Status, bool)> {
    let rec = with(|r| r.forget(id))?;
    for key in &rec.keys {
        let reserve = with_queue(rec.db, key, |q| {
            let was_head = q.head_id() == Some(id);
            q.remove(id).is_some() && was_head && !q.is_empty()
        })
        .unwrap_or(false);
        if reserve {
            crate::lease::schedule_serve(ctx, rec.db, key, crate::lease::IfAbsent::Grant);
        }
    }
    with(|r| r.release_spare_capacity());
    Some((rec.status, rec.multi))
}

/// The answer of a waiter that left, but of one still waiting (`None`),
/// which each callback answers its own way.
fn reply_for(status: Status, multi: bool) -> Option<Reply> {
    Some(match status {
        Status::Granted(token) => Reply::Int(token as i64),
        Status::GrantedAll(tokens) => tokens_reply(&tokens),
        Status::Failed(e) => Reply::err(e),
        Status::TimedOut => timed_out(multi),
        Status::Waiting => return None,
    })
}

/// A waiter that got nothing is answered its command's null: the null array
/// for an `ACQUIREALL`, whose grant is an array (`*-1` to a RESP2 client, as
/// Redis's `BLPOP` times out).
fn timed_out(multi: bool) -> Reply {
    stats::bump(&stats::WAIT_TIMEOUTS, 1);
    if multi {
        Reply::NullArray
    } else {
        Reply::Null
    }
}

unsafe extern "C" fn on_timeout(ctx: *mut Ctx, _argv: *mut *mut RStr, _argc: c_int) -> c_int {
    crate::ffi::contained("blocked-client timeout", OK, || {
        let Some(id) = waiter_id(ctx) else {
            send(ctx, &Reply::Null);
            return OK;
        };
        let reply = match depart(ctx, id) {
            Some((status, multi)) => reply_for(status, multi).unwrap_or_else(|| timed_out(multi)),
            None => timed_out(false),
        };
        send(ctx, &reply);
        OK
    })
}

/// Redis calls this when somebody adds a key by the waiter's parking name.
/// Nothing of the module's does, but a client can (a lock key named like
/// another key's parking name, `k\0rlock:parked`). The waiter is answered
/// then, never left parked: a waiter that declines leaves Redis 7.0 pointing
/// at it as its current client (`parking_name` has the crash that followed
/// once it was killed). One still waiting is told to retry, and its queue
/// moves on without it.
unsafe extern "C" fn on_key_ready(ctx: *mut Ctx, _argv: *mut *mut RStr, _argc: c_int) -> c_int {
    crate::ffi::contained("blocked-client wake", OK, || {
        let Some(id) = waiter_id(ctx) else {
            send(ctx, &Reply::err(PARKING_NAME_TAKEN_ERR));
            return OK;
        };
        let reply = depart(ctx, id)
            .and_then(|(status, multi)| reply_for(status, multi))
            .unwrap_or_else(|| {
                // Redis unblocks it before the event loop sleeps: until then
                // a `CLIENT UNBLOCK` must not answer it again, as after a grant.
                crate::answered::mark(id, crate::engine::client_id(ctx));
                Reply::err(PARKING_NAME_TAKEN_ERR)
            });
        send(ctx, &reply);
        OK
    })
}

/// Answer to a waiter whose parking name a client created (`on_key_ready`).
pub const PARKING_NAME_TAKEN_ERR: &str =
    "TRYAGAIN a key was created by the internal name this wait was parked on; retry";

pub fn tokens_reply(tokens: &[u64]) -> Reply {
    Reply::Array(tokens.iter().map(|t| Reply::Int(*t as i64)).collect())
}

/// Redis has unblocked the waiter (however its wait ended) and frees its
/// private data: its id, nothing to free.
unsafe extern "C" fn on_unblocked(_ctx: *mut Ctx, privdata: *mut c_void) {
    crate::ffi::contained("blocked-client unblocked", (), || {
        crate::answered::unblocked(privdata.addr() as u64)
    })
}

unsafe extern "C" fn on_disconnect(ctx: *mut Ctx, _bc: *mut RedisModuleBlockedClient) {
    crate::ffi::contained("blocked-client disconnect", (), || {
        if let Some(id) = waiter_id(ctx) {
            depart(ctx, id);
        }
    })
}

/// Whether the current call may park the client (not in MULTI, Lua, a
/// replicated stream or AOF loading: there BLOCK is a single immediate try).
pub fn may_block(ctx: *mut Ctx) -> bool {
    let deny = raw::REDISMODULE_CTX_FLAGS_MULTI
        | raw::REDISMODULE_CTX_FLAGS_LUA
        | raw::REDISMODULE_CTX_FLAGS_DENY_BLOCKING
        | raw::REDISMODULE_CTX_FLAGS_REPLICATED
        | raw::REDISMODULE_CTX_FLAGS_LOADING;
    crate::ffi::ctx_flags(ctx) & deny == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Redis Cluster's key slot (CRC16/XMODEM of the hashed part, mod 16384),
    /// written here bit by bit from its definition to check the names and the
    /// table-driven `crc16` against.
    fn slot(key: &[u8]) -> u16 {
        let mut crc: u16 = 0;
        for &b in slot_hashed_part(key) {
            crc ^= (b as u16) << 8;
            for _ in 0..8 {
                crc = if crc & 0x8000 != 0 {
                    (crc << 1) ^ 0x1021
                } else {
                    crc << 1
                };
            }
        }
        crc & 16383
    }

    #[test]
    fn the_slot_function_matches_redis() {
        // What `CLUSTER KEYSLOT` answered on Redis 7.0.15.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"lock"), 8718);
        assert_eq!(slot(b"{lock}x"), 8718);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"a}b"), 7866);
        assert_eq!(slot(b""), 0);
        for key in [&b"foo"[..], b"123456789", b"a}b", b"", b"\xff\x00"] {
            assert_eq!(crc16(key) & SLOT_MASK, slot(key), "{key:?}");
        }
    }

    #[test]
    fn a_parking_name_differs_from_its_key_and_keeps_its_slot() {
        for key in [
            &b"lock"[..],
            b"{tag}lock",
            b"a{b}c",
            b"x{",
            b"{a{b}c",
            b"\xff\x00binary",
            b"{user1000}.following",
            // No tag of ours can hold these: two bytes put the name in the slot.
            b"a}b",
            b"}{",
            b"{}x",
            b"}",
            b"",
        ] {
            let name = parking_name(key, true);
            assert_ne!(name, key);
            assert_eq!(slot(&name), slot(key), "{key:?}");
            let plain = parking_name(key, false);
            assert_ne!(plain, key);
        }
    }

    #[test]
    fn every_slot_has_a_name_hashed_whole() {
        // Two bytes after the mark, neither a `{`, reach every slot...
        let mut reached = vec![false; usize::from(SLOT_MASK) + 1];
        for suffix in (0..=u16::MAX).map(u16::to_be_bytes) {
            if !suffix.contains(&b'{') {
                reached[usize::from(slot(&[PARKED, &suffix].concat()))] = true;
            }
        }
        assert!(reached.iter().all(|&r| r));
        // ...and `name_in_slot` finds one.
        for wanted in (0..=SLOT_MASK).step_by(97).chain([SLOT_MASK]) {
            let name = name_in_slot(wanted);
            assert!(name.starts_with(PARKED) && name.len() == PARKED.len() + 2);
            assert!(!name.contains(&b'{'), "{name:?} has a hash tag");
            assert_eq!(slot(&name), wanted);
        }
    }
}
