//! The one path every lock state change takes, whatever started it (a command,
//! the lease timer, a departed waiter, a replicated effect):
//!
//! open key -> expire overdue holds -> apply the action -> serve the queue ->
//! write back (value, TTL = latest deadline) -> replicate the delta ->
//! notify -> watch the next deadline -> wake the served waiters.
//!
//! An acquire of a free key (`first_grant`) takes the same path with the
//! steps that have nothing to do left out, its packed block built directly:
//! an uncontended acquire's time is the code it runs through
//! (bench/findings.md acquire-vs-set).
//!
//! Replication sends effects, never the command: `RLOCK.DELTA key <steps>`, the
//! steps the state machine made to single holders, with absolute deadlines and
//! explicit tokens (`lock::delta`). Replicas and AOF replay therefore reproduce
//! the master's state exactly and decide nothing; an effect costs bytes in
//! proportion to the change, not to the number of holders. `effect` sends it,
//! in the running command's own argument slots where they fit.

mod multi;

use multi::serve_multi_ready;
pub use multi::{acquire_all, release_all, renew_all};

use crate::blocking;
use crate::ffi::{api, bytes, now_ms, select_db, selected_db, Ctx, Key, OwnedStr, RStr, Reply, OK};
use crate::lease::IfAbsent;
use crate::lock::encoding::{self, Layout, Whole};
use crate::lock::{
    delta, err, Admission, Compact, Delta, EndReason, Kind, LockState, Mode, Op, Served,
};
use crate::notify;
use crate::stats;
use crate::store::{self, Form, Stored};
use crate::token;

pub enum Action<'a> {
    Acquire(Request<'a>),
    Release {
        owner: &'a [u8],
        mode: Mode,
    },
    Renew {
        owner: &'a [u8],
        lease_ms: i64,
    },
    ForceRelease,
    /// Replace the held state (AOF rewrite output, and effects of older versions).
    SetState(LockState),
    /// Apply a replicated delta (replication and AOF replay).
    Replay(Kind, delta::Steps<'a>),
    /// Lease timer: the key's watched deadline came.
    Expire,
    /// Serve the queue (a waiter left its head, or the key vanished under it).
    Serve,
    /// The keepalive timer renews a bound tenure.
    KeepAlive {
        token: u64,
        lease_ms: i64,
    },
    /// The connection a tenure was bound to closed: it ends as a release.
    EndTenure {
        token: u64,
    },
}

/// What a client's acquire asks for.
#[derive(Clone, Copy)]
pub struct Request<'a> {
    pub owner: &'a [u8],
    pub mode: Mode,
    pub lease_ms: i64,
    /// `Some(ms)` parks the client when busy (0: no timeout).
    pub block: Option<i64>,
    /// Bind the holding to the calling connection (`keepalive`).
    pub keepalive: bool,
}

impl Action<'_> {
    /// Effects from a master or the AOF: applied as they are, never decided here.
    fn replicated(&self) -> bool {
        matches!(self, Action::SetState(_) | Action::Replay(..))
    }

    /// A client's request (the rest are effects and the module's own timers).
    fn requested(&self) -> bool {
        matches!(
            self,
            Action::Acquire(_)
                | Action::Release { .. }
                | Action::Renew { .. }
                | Action::ForceRelease
        )
    }
}

/// A replica holds exactly its master's locks, also with `replica-read-only
/// no`: a change made there would diverge from the master's state, and a grant
/// there would issue a token the master issues too.
fn refuse_on_replica() -> Result<(), Reply> {
    if crate::role::is_master() {
        Ok(())
    } else {
        Err(Reply::err(err::READONLY))
    }
}

/// The caller waits: its queue id, BLOCK time, and the lease of a KEEPALIVE
/// holding to bind to its connection once granted.
struct Park {
    id: u64,
    timeout: i64,
    keepalive: Option<i64>,
}

struct Change {
    dirty: bool,
    acquired: bool,
    /// A hold was released that made no room for anyone (a reentrant count
    /// went down): a keyspace event, no message on the unlock channel.
    released: bool,
    ended: Ended,
    served: Vec<Served>,
    park: Option<Park>,
    delta: Delta,
}

impl Change {
    fn new(kind: Kind, record: bool) -> Change {
        Change {
            dirty: false,
            acquired: false,
            released: false,
            ended: Ended::default(),
            served: Vec::new(),
            park: None,
            delta: if record {
                Delta::recording(kind)
            } else {
                Delta::off()
            },
        }
    }

    fn end(&mut self, reason: EndReason) {
        self.dirty = true;
        self.ended.insert(reason);
    }

    /// A release by a holder. Room for others (the unlock channel's message):
    /// its tenure ended, permits came back (the holding may go on), or a WRITE
    /// went while READ stays (a downgrade lets readers in).
    fn release(&mut self, kind: Kind, mode: Mode, remaining: u32, ended: bool) {
        self.dirty = true;
        let downgrade = kind == Kind::ReadWrite && mode == Mode::Write && remaining == 0;
        if ended || kind == Kind::Semaphore || downgrade {
            self.end(EndReason::Released);
        } else {
            self.released = true;
        }
    }
}

/// Why holds ended in one change, each reason once, in the order they first
/// did; inline (a release must not allocate to say that it released).
#[derive(Default)]
struct Ended([Option<EndReason>; 3]);

impl Ended {
    fn insert(&mut self, reason: EndReason) {
        for slot in &mut self.0 {
            match slot {
                Some(r) if *r == reason => return,
                Some(_) => {}
                None => {
                    *slot = Some(reason);
                    return;
                }
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = EndReason> + '_ {
        self.0.iter().map_while(|r| *r)
    }
}

enum Slot {
    Existing(*mut LockState),
    /// A packed lock, unpacked for the change and packed back in `commit`.
    Unpacked(*mut Compact, LockState),
    Fresh(LockState),
    /// A whole lock for an empty key that arrived packed (AOF rewrite's), put
    /// in the keyspace as it is unless something reads it as a state first.
    Packed(Compact),
}

impl Slot {
    #[inline]
    fn state(&mut self) -> &mut LockState {
        if let Slot::Packed(c) = self {
            *self = Slot::Fresh(c.unpack());
        }
        match self {
            Slot::Existing(p) => unsafe { &mut **p },
            Slot::Unpacked(_, s) | Slot::Fresh(s) => s,
            Slot::Packed(_) => unreachable!("unpacked above"),
        }
    }
}

/// One lock key opened for a change: the first half of the path, up to the
/// action. `finish` is the second half.
struct Opened<'a> {
    key: Key,
    keyname: *mut RStr,
    db: i32,
    name: &'a [u8],
    kind: Kind,
    slot: Slot,
    change: Change,
}

impl Opened<'_> {
    fn state(&mut self) -> &mut LockState {
        self.slot.state()
    }

    /// How the lock admits `owner` now. An absent key whose last lease still
    /// runs (Redis removed it in its deadline millisecond) admits nobody.
    fn admit(&mut self, owner: &[u8], mode: Mode, now: i64) -> Admission {
        let closed = self.closed(now);
        match self.slot.state().admit(owner, mode) {
            Admission::Fresh if closed => Admission::Busy,
            admission => admission,
        }
    }

    fn closed(&self, now: i64) -> bool {
        matches!(self.slot, Slot::Fresh(_)) && crate::lease::closed(self.db, self.name, now)
    }

    /// Ends the holds whose lease is over (a master decides; replicas follow).
    fn expire_overdue(&mut self, now: i64) {
        let expired = self.slot.state().expire(now, &mut self.change.delta);
        if expired > 0 {
            stats::bump(&stats::LEASE_EXPIRATIONS, expired as u64);
            self.change.end(EndReason::Expired);
        }
    }

    /// Puts a semaphore ACQUIRE's limit in force (the latest is); whether it
    /// was raised, which may let waiters in ahead of the caller. A semaphore
    /// with no limit yet (a new one) takes it with its first grant.
    fn put_limit(&mut self, limit: u32) -> bool {
        let state = self.slot.state();
        let old = state.limit();
        if old == 0 {
            // The key is gone: its waiters, if any, keep the limit in force.
            blocking::keep_limit(self.db, self.name, limit);
            return false;
        }
        if limit == old {
            return false;
        }
        state.set_limit(limit, &mut self.change.delta);
        self.change.dirty = true;
        limit > old
    }

    /// Hands the lock to the waiters it can go to now.
    fn serve(&mut self, now: i64) {
        if self.closed(now) {
            return;
        }
        let served = blocking::serve(
            self.db,
            self.name,
            self.slot.state(),
            now,
            &mut || token::issue(now),
            &mut self.change.delta,
        );
        for s in &served {
            if let Served::Granted { .. } = s {
                stats::bump(&stats::GRANTS, 1);
                self.change.dirty = true;
                self.change.acquired = true;
            }
        }
        self.change.served.extend(served);
    }
}

/// Opens the lock at `keyname` for a change. `wanted: None` accepts any lock
/// family (internal callers); otherwise another family is WRONGTYPE.
/// `key` is `keyname` opened for writing: opening may make Redis expire the
/// key (its TTL is the latest deadline), and the type's unlink hook
/// (notify::on_unlink) then records that expiry.
fn open<'a>(
    ctx: *mut Ctx,
    key: Key,
    keyname: *mut RStr,
    wanted: Option<Kind>,
    record: bool,
) -> Result<Opened<'a>, Reply> {
    let (db, name) = (selected_db(ctx), unsafe { bytes(keyname) });
    let existing = match store::lock_at(&key) {
        Err(()) => return Err(Reply::err(err::WRONGTYPE)),
        Ok(v) => v,
    };
    let kind = match (existing, wanted) {
        (Some(v), Some(k)) if unsafe { v.kind() } != k => return Err(Reply::err(err::WRONGTYPE)),
        (Some(v), _) => unsafe { v.kind() },
        (None, Some(k)) => {
            claim_absent(db, name, k)?;
            k
        }
        // Serving, or the lease timer found that Redis had just expired the
        // key itself (its TTL is the latest deadline): hand it to the first
        // waiter now rather than on the next turn of the event loop.
        (None, None) => match blocking::with_queue(db, name, |q| q.kind()) {
            Some(k) => k,
            None => return Err(Reply::Null),
        },
    };
    let slot = match existing.map(Stored::form) {
        Some(Form::Full(p)) => Slot::Existing(p),
        Some(Form::Packed(c)) => Slot::Unpacked(c, unsafe { (*c).unpack() }),
        None => Slot::Fresh(LockState::new(kind)),
    };
    Ok(Opened {
        key,
        keyname,
        db,
        name,
        kind,
        slot,
        change: Change::new(kind, record),
    })
}

/// A queue outlives its key's value (a multi-key waiter's reservation of a
/// free key; a key deleted or expired under its waiters, until their serve
/// pass), and its waiters are of one family: they may only ever be granted a
/// lock of that family. So while the key is absent its queue's family is the
/// key's, and a request of another is WRONGTYPE, unless the key was removed:
/// its waiters are then told to retry at once, as their pass would, and the
/// key is free for any request (a waiter is never handed a removed key).
fn claim_absent(db: i32, name: &[u8], wanted: Kind) -> Result<(), Reply> {
    if !blocking::any_queued() {
        return Ok(());
    }
    let Some(queued) = blocking::with_queue(db, name, |q| q.kind()) else {
        return Ok(());
    };
    if crate::lease::removal_pending(db, name) {
        blocking::fail_all(db, name, notify::KEY_GONE_ERR);
        return Ok(());
    }
    if queued != wanted {
        return Err(Reply::err(err::WRONGTYPE));
    }
    Ok(())
}

/// Runs `action` on the lock at `keyname`. `kind: None` accepts any lock family
/// (internal callers); a command passes its own family and gets WRONGTYPE otherwise.
pub fn execute(ctx: *mut Ctx, keyname: *mut RStr, kind: Option<Kind>, action: Action) -> Reply {
    execute_at(ctx, keyname, kind, action, now_ms())
}

/// `execute` at `now`, the clock its caller already read to check its options
/// (a clock read takes several ns: a measurable share of an uncontended
/// acquire's own work).
pub fn execute_at(
    ctx: *mut Ctx,
    keyname: *mut RStr,
    kind: Option<Kind>,
    action: Action,
    now: i64,
) -> Reply {
    let wanted = match &action {
        Action::Replay(k, _) => Some(*k),
        Action::SetState(s) => Some(s.kind()),
        _ => kind,
    };
    if action.requested() {
        if let Err(reply) = refuse_on_replica() {
            return reply;
        }
    }
    let key = Key::open(ctx, keyname, true);
    execute_opened(ctx, key, keyname, wanted, action, now)
}

/// An acquire by a client: on a free key the first grant, else the general
/// path with the key as opened.
pub fn acquire(ctx: *mut Ctx, keyname: *mut RStr, kind: Kind, request: Request, now: i64) -> Reply {
    if let Err(reply) = refuse_on_replica() {
        return reply;
    }
    let key = Key::open(ctx, keyname, true);
    match first_grant(ctx, key, keyname, kind, &request, now) {
        Ok(reply) => reply,
        Err(key) => acquire_opened(ctx, key, keyname, kind, request, now),
    }
}

/// An acquire the first grant's path left to the general one: out of that
/// path's line of code.
#[inline(never)]
fn acquire_opened(
    ctx: *mut Ctx,
    key: Key,
    keyname: *mut RStr,
    kind: Kind,
    request: Request,
    now: i64,
) -> Reply {
    execute_opened(ctx, key, keyname, Some(kind), Action::Acquire(request), now)
}

/// The rest of `execute_at` once the key is open (`wanted`: as `open` takes it).
fn execute_opened(
    ctx: *mut Ctx,
    key: Key,
    keyname: *mut RStr,
    wanted: Option<Kind>,
    action: Action,
    now: i64,
) -> Reply {
    let replicated = action.replicated();
    let mut o = match open(
        ctx,
        key,
        keyname,
        wanted,
        !replicated && crate::role::propagates(),
    ) {
        Ok(o) => o,
        Err(reply) => return reply,
    };
    if !replicated && crate::role::is_master() {
        o.expire_overdue(now);
    }
    let raised = match action {
        Action::Acquire(Request {
            mode: Mode::Permits { limit, .. },
            ..
        }) => o.put_limit(limit),
        _ => false,
    };
    let serve_first = matches!(action, Action::Serve) || o.state().is_free() || raised;
    if serve_first && blocking::any_queued() {
        o.serve(now);
    }
    let timer = matches!(action, Action::Expire);
    let rewritten = matches!(&action, Action::Replay(_, steps) if steps.is_rewritten_lock());
    let reply = apply(ctx, &mut o, action, now);
    if let Reply::Error(_) = reply {
        if replicated {
            return reply;
        }
    }
    let origin = if rewritten {
        Origin::Rewritten
    } else if replicated {
        Origin::Replicated
    } else if timer {
        Origin::Timer
    } else {
        Origin::Local
    };
    finish(ctx, o, now, origin);
    serve_multi_ready(ctx);
    reply
}

/// The second half of the path: serve what the change made room for, write
/// back, replicate, notify, park the caller if it waits, wake the served.
fn finish(ctx: *mut Ctx, mut o: Opened, now: i64, origin: Origin) {
    // Any change can make room (a hold ended, WRITE released under READ):
    // serving costs one admission check when the head still has to wait.
    if o.change.dirty && blocking::any_queued() {
        o.serve(now);
    }
    commit(ctx, &mut o, origin);
    let Opened {
        key,
        keyname,
        db,
        change,
        ..
    } = o;
    drop(key);
    if let Some(p) = change.park {
        blocking::park(ctx, &[keyname], db, p.id, p.timeout, p.keepalive);
    }
    blocking::deliver(change.served);
}

fn apply(ctx: *mut Ctx, o: &mut Opened, action: Action, now: i64) -> Reply {
    if let Action::Replay(_, steps) = &action {
        if let Some(reply) = replay_packed(o, steps, now) {
            return reply;
        }
    }
    let (db, name, kind) = (o.db, o.name, o.kind);
    let state = o.slot.state();
    let change = &mut o.change;
    match action {
        Action::Acquire(Request {
            owner,
            mode,
            lease_ms,
            block,
            keepalive,
        }) => {
            let granted = match o.admit(owner, mode, now) {
                Admission::Upgrade => return Reply::err(err::UPGRADE),
                Admission::Reentrant => true,
                // A newcomer never overtakes a queued waiter.
                Admission::Fresh => !blocking::any_queued() || blocking::queue_len(db, name) == 0,
                Admission::Busy => false,
            };
            if granted {
                grant(ctx, o, owner, mode, lease_ms, keepalive, now)
            } else {
                park_or_decline(ctx, o, owner, mode, lease_ms, block, keepalive)
            }
        }
        Action::Release { owner, mode } => match state.release(owner, mode, &mut change.delta) {
            Ok((remaining, ended)) => {
                change.release(kind, mode, remaining, ended);
                Reply::Int(remaining as i64)
            }
            Err(refused) => Reply::err(refused.0),
        },
        Action::Renew { owner, lease_ms } => {
            let deadline = now.saturating_add(lease_ms);
            match state.renew(owner, deadline, &mut change.delta) {
                Ok(()) => {
                    change.dirty = true;
                    renewed(db, name, state, owner, lease_ms);
                    Reply::Int(1)
                }
                Err(_) => Reply::err(err::NOTOWNER),
            }
        }
        Action::ForceRelease => {
            let ended = state.force(&mut change.delta);
            if ended > 0 {
                stats::bump(&stats::FORCED_RELEASES, ended as u64);
                change.end(EndReason::Forced);
            }
            Reply::Int((ended > 0) as i64)
        }
        Action::SetState(new_state) => {
            new_state.iter().for_each(|h| token::observe(h.token));
            *state = new_state;
            change.dirty = true;
            Reply::Simple(c"OK")
        }
        Action::Replay(_, ops) => replay(o, &ops, now),
        Action::KeepAlive { token, lease_ms } => {
            let deadline = now.saturating_add(lease_ms);
            match state.renew_tenure(token, deadline, &mut change.delta) {
                Ok(()) => {
                    change.dirty = true;
                    Reply::Int(1)
                }
                Err(_) => Reply::Null,
            }
        }
        Action::EndTenure { token } => match state.end_tenure(token, &mut change.delta) {
            Ok(()) => {
                change.end(EndReason::Released);
                Reply::Int(1)
            }
            Err(_) => Reply::Null,
        },
        Action::Expire | Action::Serve => Reply::Null,
    }
}

/// An admitted acquire: the grant and its token. With KEEPALIVE the holding
/// is bound to this connection; without, a bound holding acquired again
/// gives its binding this lease.
#[inline]
fn grant(
    ctx: *mut Ctx,
    o: &mut Opened,
    owner: &[u8],
    mode: Mode,
    lease_ms: i64,
    keepalive: bool,
    now: i64,
) -> Reply {
    let (db, name, state, change) = (o.db, o.name, o.slot.state(), &mut o.change);
    let deadline = now.saturating_add(lease_ms);
    let issue = &mut || token::issue(now);
    match state.grant(owner, mode, deadline, issue, &mut change.delta) {
        Ok(token) => {
            stats::bump(&stats::GRANTS, 1);
            change.dirty = true;
            change.acquired = true;
            if keepalive {
                crate::keepalive::bind(db, name, token, client_id(ctx), lease_ms);
            } else {
                crate::keepalive::lease_changed(db, name, token, lease_ms);
            }
            Reply::Int(token as i64)
        }
        Err(refused) => Reply::err(refused.0),
    }
}

/// The first grant of a free key (no value, no queue, not closed in its last
/// lease's millisecond), the most common change there is: the engine's path
/// with nothing to expire, serve or unpack, its block built as the state
/// machine's grant would leave it (`Compact::first_grant`), then stored, its
/// TTL set, replicated, announced. `Err(key)` when the key is not free or the
/// lock would not be packed: the general path goes on with the key as opened.
/// Keeping this short is what the uncontended acquire's time is about
/// (bench/findings.md acquire-vs-set).
fn first_grant(
    ctx: *mut Ctx,
    key: Key,
    keyname: *mut RStr,
    kind: Kind,
    request: &Request,
    now: i64,
) -> Result<Reply, Key> {
    let Request {
        owner,
        mode,
        lease_ms,
        keepalive,
        ..
    } = *request;
    if !key.is_empty() {
        return Err(key);
    }
    // The key's name and database only when a queue or a closed key may be
    // about it: two calls into Redis fewer on the usual first grant.
    if (blocking::any_queued() || crate::lease::any_closed()) && waits_or_closed(ctx, keyname, now)
    {
        return Err(key);
    }
    let deadline = now.saturating_add(lease_ms);
    let issue = || token::issue(now);
    let Some(block) = Compact::first_grant(kind, owner, mode, deadline, issue) else {
        return Err(key);
    };
    stats::bump(&stats::GRANTS, 1);
    let token = block.token();
    // SAFETY: the key is open for writing and empty; the stored block lives
    // as long as the key holds it, past this command.
    let stored = unsafe {
        let stored = &*store::put_packed(&key, block);
        api!(RedisModule_SetAbsExpire)(key.raw, deadline);
        api!(RedisModule_SignalModifiedKey)(ctx, keyname);
        stored
    };
    if keepalive {
        bind_first_grant(ctx, keyname, token, lease_ms);
    }
    if crate::role::propagates() {
        replicate_first_grant(ctx, keyname, kind, stored, owner, mode);
    }
    notify::keyspace(ctx, kind, notify::Event::Acquire, keyname);
    Ok(Reply::Int(token as i64))
}

/// The first grant's holding bound to the calling connection (`KEEPALIVE`).
#[inline(never)]
fn bind_first_grant(ctx: *mut Ctx, keyname: *mut RStr, token: u64, lease_ms: i64) {
    let (db, name) = (selected_db(ctx), unsafe { bytes(keyname) });
    crate::keepalive::bind(db, name, token, client_id(ctx), lease_ms);
}

/// The first grant's effect, to replicas and the AOF, its delta in a buffer
/// on the stack. Out of line: without either, the first grant's path goes
/// straight on from here.
#[inline(never)]
fn replicate_first_grant(
    ctx: *mut Ctx,
    keyname: *mut RStr,
    kind: Kind,
    block: &Compact,
    owner: &[u8],
    mode: Mode,
) {
    let grant = (block, owner, mode);
    // A block never holds a longer owner (`MAX_PACKED_OWNER`): checked here,
    // not assumed, since the stack buffer panics past its size.
    if owner.len() > crate::lock::MAX_PACKED_OWNER {
        return replicate_steps(ctx, keyname, grant, Delta::recording(kind));
    }
    let delta = Delta::<delta::Inline<{ crate::lock::FIRST_GRANT_DELTA }>>::inline(kind);
    replicate_steps(ctx, keyname, grant, delta);
}

/// Records a first grant's steps in `delta` and propagates them.
fn replicate_steps(
    ctx: *mut Ctx,
    keyname: *mut RStr,
    (block, owner, mode): (&Compact, &[u8], Mode),
    mut delta: Delta<impl delta::Sink>,
) {
    block.first_grant_steps(owner, mode, &mut delta);
    crate::effect::replicate(ctx, keyname, delta.bytes());
}

/// Whether the absent `keyname` has waiters or is closed in its last lease's
/// final millisecond: its first grant is then the general path's to decide.
#[inline(never)]
fn waits_or_closed(ctx: *mut Ctx, keyname: *mut RStr, now: i64) -> bool {
    let (db, name) = (selected_db(ctx), unsafe { bytes(keyname) });
    (blocking::any_queued() && blocking::with_queue(db, name, |_| ()).is_some())
        || crate::lease::closed(db, name, now)
}

/// An acquire that must wait: the client is queued and parked if it asked to
/// block and may (`blocking::may_block`), else answered null.
fn park_or_decline(
    ctx: *mut Ctx,
    o: &mut Opened,
    owner: &[u8],
    mode: Mode,
    lease_ms: i64,
    block: Option<i64>,
    keepalive: bool,
) -> Reply {
    match block {
        Some(timeout) if blocking::may_block(ctx) => {
            let id = blocking::enqueue(o.db, o.name, o.kind, owner, mode, lease_ms);
            o.change.park = Some(Park {
                id,
                timeout,
                keepalive: keepalive.then_some(lease_ms),
            });
            Reply::Parked
        }
        _ => Reply::Null,
    }
}

/// A replicated delta (a master's effect or the AOF), applied as it came;
/// the tokens it carries raise this server's floor for new ones.
fn replay(o: &mut Opened, ops: &[Op], now: i64) -> Reply {
    let state = o.slot.state();
    match state.replay(ops, token::max_accepted(now)) {
        Ok(()) => {
            for op in ops {
                match op {
                    Op::New { token: t, .. } | Op::Whole { token: t, .. } => token::observe(*t),
                    // Only onto an empty key: its holders are the state's.
                    Op::Lock { .. } => state.iter().for_each(|h| token::observe(h.token)),
                    _ => {}
                }
            }
            o.change.dirty = true;
            // Only a master link or the AOF sends a delta, and neither reads
            // the reply: the steps applied is the cheapest to make (one
            // shared object for the usual 1; `+OK` is three writes).
            Reply::Int(ops.len() as i64)
        }
        Err(e) => Reply::err(e),
    }
}

/// AOF rewrite's whole lock for an empty key, when it is the common one-holder
/// lock: kept in the block it was read into. Anything else (or a lock the
/// rules refuse) goes through `LockState::replay`, which reads it again.
fn replay_packed(o: &mut Opened, steps: &delta::Steps, now: i64) -> Option<Reply> {
    let [Op::Lock { encoded }] = **steps else {
        return None;
    };
    if !matches!(&o.slot, Slot::Fresh(s) if s.is_free()) {
        return None;
    }
    let c = match encoding::read_whole(encoded, Layout::V3, token::max_accepted(now)) {
        Ok(Whole::Packed(c)) if c.kind() == o.kind => c,
        _ => return None,
    };
    token::observe(c.token());
    o.slot = Slot::Packed(c);
    o.change.dirty = true;
    Some(Reply::Int(1))
}

/// `owner` renewed its holding to `lease_ms`: a KEEPALIVE binding of it
/// follows (`keepalive::lease_changed`).
fn renewed(db: i32, name: &[u8], state: &LockState, owner: &[u8], lease_ms: i64) {
    if crate::keepalive::any_bound() {
        if let Some(h) = state.holder(owner) {
            crate::keepalive::lease_changed(db, name, h.token, lease_ms);
        }
    }
}

/// What started a change.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// A client's command.
    Local,
    /// The lease timer (the key's TTL may not be its latest deadline yet, e.g.
    /// after `RESTORE`: it is set even if nothing changed).
    Timer,
    /// A master's effect or the AOF: passed on as it came.
    Replicated,
    /// A lock as AOF rewrite wrote it: Redis writes the key's TTL after it
    /// (its own `PEXPIREAT`), so setting it here too would be done twice.
    Rewritten,
}

/// Writes the outcome back to the keyspace and tells everyone who must know.
fn commit(ctx: *mut Ctx, o: &mut Opened, origin: Origin) {
    let (key, keyname, db, name) = (&o.key, o.keyname, o.db, o.name);
    let change = &o.change;
    let (gone, state) = write_back(key, db, name, &mut o.slot, change.dirty, origin);
    let mut modified = gone || change.dirty;
    if let Some(state) = state {
        if let Some(latest) = state.latest_deadline() {
            let realigned = set_ttl(key, latest, change.dirty, origin);
            if realigned && origin == Origin::Timer && crate::role::propagates() {
                // Nothing changed, so no effect carries the TTL: a TTL the
                // lease timer puts back (after PERSIST or EXPIRE by hand)
                // goes to replicas and the AOF as its own PEXPIREAT, else
                // they keep the one set by hand.
                crate::effect::replicate_ttl(ctx, keyname, latest);
            }
            modified |= realigned;
        }
        let waiting = blocking::any_queued() && blocking::queue_len(db, name) > 0;
        crate::lease::watch(ctx, db, name, state, waiting);
    }
    // The module opts out of Redis's signal on closing a key opened for
    // writing (see `init`): a request that changed nothing leaves `WATCH`
    // and client-side caches alone.
    if modified {
        unsafe { api!(RedisModule_SignalModifiedKey)(ctx, keyname) };
    }
    announce(ctx, keyname, db, name, o.kind, change, origin);
}

/// The state back into the key: deleted once free, packed again when it fits
/// a block, stored when new. Whether the key went, and the state it holds
/// now: none when it went, when a new state stayed free (nothing stored),
/// or when it was stored packed as it arrived.
#[inline]
fn write_back<'s>(
    key: &Key,
    db: i32,
    name: &[u8],
    slot: &'s mut Slot,
    dirty: bool,
    origin: Origin,
) -> (bool, Option<&'s LockState>) {
    let gone = match &*slot {
        Slot::Existing(p) => dirty && unsafe { (**p).is_free() },
        // A packed lock always had a holder.
        Slot::Unpacked(_, state) => state.is_free(),
        Slot::Fresh(_) | Slot::Packed(_) => false,
    };
    if gone {
        // The unlink hook must read the value as free (a release, not a
        // deletion under its holder).
        if let Slot::Unpacked(block, _) = *slot {
            unsafe { (*block).clear() };
        }
        let limit = slot.state().limit();
        if limit > 0 {
            blocking::keep_limit(db, name, limit);
        }
        crate::lease::unwatch(db, name);
        unsafe { api!(RedisModule_DeleteKey)(key.raw) };
    }
    let state: Option<&LockState> = match slot {
        _ if gone => None,
        Slot::Existing(p) => Some(unsafe { &**p }),
        Slot::Unpacked(block, state) => {
            // Every change marks the change dirty: a refused or busy request
            // leaves the block as it is.
            let full = if dirty {
                unsafe { store::repack(key, *block, state) }
            } else {
                None
            };
            match full {
                Some(full) => Some(unsafe { &*full }),
                None => Some(state),
            }
        }
        Slot::Fresh(state) if state.is_free() => None,
        Slot::Fresh(state) => match unsafe { store::put(key, state) } {
            Some(full) => Some(unsafe { &*full }),
            None => Some(state),
        },
        // Still packed, so nothing read it as a state: nobody was served, so
        // nobody waits on the key (which would want the lease watched), and
        // the file sets the key's TTL (`Origin::Rewritten`).
        Slot::Packed(c) => {
            debug_assert!(origin == Origin::Rewritten);
            unsafe { store::put_packed(key, *c) };
            None
        }
    };
    (gone, state)
}

/// The change's effect to replicas and the AOF, then its messages and
/// keyspace events.
#[inline]
fn announce(
    ctx: *mut Ctx,
    keyname: *mut RStr,
    db: i32,
    name: &[u8],
    kind: Kind,
    change: &Change,
    origin: Origin,
) {
    if !change.delta.is_empty() {
        crate::effect::replicate(ctx, keyname, change.delta.bytes());
    } else if matches!(origin, Origin::Replicated | Origin::Rewritten)
        && change.dirty
        && crate::role::propagates()
    {
        // A replicated effect applied here goes on to this server's AOF (and
        // its replicas) exactly as it came.
        crate::effect::pass_on(ctx);
    }
    for reason in change.ended.iter() {
        notify::publish(ctx, db, name, reason);
        notify::keyspace(ctx, kind, notify::Event::End(reason), keyname);
    }
    if change.released {
        notify::keyspace(ctx, kind, notify::Event::End(EndReason::Released), keyname);
    }
    if change.acquired {
        notify::keyspace(ctx, kind, notify::Event::Acquire, keyname);
    }
}

/// Makes the key's TTL the lock's latest deadline; whether that changed the
/// key. A change sets it; the lease timer and a master's effect also set it
/// when nothing changed (after `RESTORE` it may not be the latest deadline
/// yet); a rewritten lock leaves it to the `PEXPIREAT` Redis writes after it.
fn set_ttl(key: &Key, latest: i64, dirty: bool, origin: Origin) -> bool {
    match origin {
        Origin::Rewritten => false,
        _ if dirty => {
            unsafe { api!(RedisModule_SetAbsExpire)(key.raw, latest) };
            false
        }
        Origin::Local => false,
        Origin::Timer | Origin::Replicated => {
            let ttl = unsafe { api!(RedisModule_GetAbsExpire)(key.raw) };
            ttl != latest && unsafe { api!(RedisModule_SetAbsExpire)(key.raw, latest) } == OK
        }
    }
}

pub fn client_id(ctx: *mut Ctx) -> u64 {
    unsafe { api!(RedisModule_GetClientId)(ctx) }
}

/// Keepalive timer: renews the tenure `token` on (db, keyname) to now + lease.
/// False when that tenure is gone.
pub fn keep_alive(ctx: *mut Ctx, db: i32, keyname: *mut RStr, token: u64, lease_ms: i64) -> bool {
    if !select_db(ctx, db) {
        return false;
    }
    let action = Action::KeepAlive { token, lease_ms };
    let renewed = matches!(execute(ctx, keyname, None, action), Reply::Int(1));
    if renewed {
        stats::bump(&stats::KEEPALIVE_RENEWALS, 1);
    }
    renewed
}

/// The connection the tenure `token` on (db, keyname) was bound to closed.
pub fn end_holding(ctx: *mut Ctx, db: i32, keyname: *mut RStr, token: u64) {
    if select_db(ctx, db) {
        execute(ctx, keyname, None, Action::EndTenure { token });
    }
}

/// Lease timer entry for (db, key) fired.
pub fn expire_due(ctx: *mut Ctx, db: i32, key: &[u8], _due: i64) {
    if select_db(ctx, db) {
        let keyname = OwnedStr::new(key);
        execute(ctx, keyname.ptr(), None, Action::Expire);
    }
}

/// Deferred serve pass over a key's queue. Waiters of a key that now holds
/// something else (another lock family, a string...) get WRONGTYPE; waiters of
/// a key that was removed (not expired) are told to retry.
pub fn serve_queue(ctx: *mut Ctx, db: i32, key: &[u8], if_absent: IfAbsent) {
    if !select_db(ctx, db) {
        return;
    }
    let Some(kind) = blocking::with_queue(db, key, |q| q.kind()) else {
        return;
    };
    let keyname = OwnedStr::new(key);
    if if_absent == IfAbsent::Retry {
        if Key::open(ctx, keyname.ptr(), false).is_empty() {
            blocking::fail_all(db, key, notify::KEY_GONE_ERR);
            return;
        }
        // Another value under the waiters: they wait for its holders now.
        blocking::recheck_queue(db, key);
    }
    if let Reply::Error(e) = execute(ctx, keyname.ptr(), Some(kind), Action::Serve) {
        blocking::fail_all(db, key, &e);
    }
}
