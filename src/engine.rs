//! The one path every lock state change takes, whatever started it (a command,
//! the lease timer, a departed waiter):
//!
//! open key -> expire overdue holds -> apply the action -> serve the queue ->
//! write back (value, TTL = latest deadline) -> replicate the resulting state ->
//! notify -> watch the next deadline -> wake the served waiters.
//!
//! Replication sends effects, never the command: `RLOCK.SETSTATE` with absolute
//! deadlines and explicit tokens, or `DEL` when the last hold ended. Replicas and
//! AOF replay therefore reproduce the master's state exactly and decide nothing.

use crate::blocking;
use crate::commands::{NOTOWNER_ERR, UPGRADE_ERR, WRONGTYPE_ERR};
use crate::ffi::{api, bytes, now_ms, select_db, selected_db, Ctx, Key, OwnedStr, RStr, Reply};
use crate::lease::IfAbsent;
use crate::lock::{Admission, EndReason, Kind, LockState, Mode, Served};
use crate::notify;
use crate::stats;
use crate::store::{lock_type, setstate_args, LockValue, SETSTATE};
use crate::token;

pub enum Action<'a> {
    Acquire {
        owner: &'a [u8],
        mode: Mode,
        lease_ms: i64,
        /// `Some(ms)` parks the client when busy (0: no timeout).
        block: Option<i64>,
    },
    Release {
        owner: &'a [u8],
        mode: Mode,
    },
    Renew {
        owner: &'a [u8],
        lease_ms: i64,
    },
    ForceRelease,
    /// Replace the held state (replication and AOF replay).
    SetState(LockState),
    /// Lease timer: the schedule entry due at `due` fired.
    Expire {
        due: i64,
    },
    /// Serve the queue (a waiter left its head, or the key vanished under it).
    Serve,
}

#[derive(Default)]
struct Change {
    dirty: bool,
    acquired: bool,
    ended: Vec<EndReason>,
    served: Vec<Served>,
    park: Option<(u64, i64)>,
}

impl Change {
    fn end(&mut self, reason: EndReason) {
        self.dirty = true;
        if !self.ended.contains(&reason) {
            self.ended.push(reason);
        }
    }
}

enum Slot {
    Existing(*mut LockValue),
    Fresh(LockState),
}

impl Slot {
    fn state(&mut self) -> &mut LockState {
        match self {
            Slot::Existing(p) => unsafe { &mut (**p).state },
            Slot::Fresh(s) => s,
        }
    }
}

/// Runs `action` on the lock at `keyname`. `kind: None` accepts any lock family
/// (internal callers); a command passes its own family and gets WRONGTYPE otherwise.
pub fn execute(ctx: *mut Ctx, keyname: *mut RStr, kind: Option<Kind>, action: Action) -> Reply {
    let now = now_ms();
    let (db, name) = (selected_db(ctx), unsafe { bytes(keyname) });
    // Opening may make Redis expire the key (its TTL is the latest deadline);
    // the type's unlink hook (notify::on_unlink) then records that expiry.
    let key = Key::open(ctx, keyname, true);
    let existing = match key.module_value::<LockValue>(lock_type()) {
        Err(()) => return Reply::err(WRONGTYPE_ERR),
        Ok(v) => v,
    };
    let kind = match (existing, kind) {
        (Some(v), Some(k)) if unsafe { (*v).state.kind } != k => return Reply::err(WRONGTYPE_ERR),
        (Some(v), _) => unsafe { (*v).state.kind },
        (None, Some(k)) => k,
        (None, None) => match &action {
            Action::SetState(s) => s.kind,
            // Serving, or the lease timer found that Redis had just expired the
            // key itself (its TTL is the latest deadline): hand it to the first
            // waiter now rather than on the next turn of the event loop.
            Action::Serve | Action::Expire { .. } => {
                match blocking::with_queue(db, name, |q| q.kind()) {
                    Some(k) => k,
                    None => return Reply::Null,
                }
            }
            _ => return Reply::Null,
        },
    };
    let mut slot = match existing {
        Some(p) => Slot::Existing(p),
        None => Slot::Fresh(LockState::new(kind)),
    };
    let mut change = Change::default();
    if let (Action::Expire { due }, Some(p)) = (&action, existing) {
        // The schedule entry that fired was this key's live one: forget it so
        // the next deadline gets a new entry.
        unsafe {
            if (*p).armed == *due {
                (*p).armed = 0;
            }
        }
    }
    let replicated = matches!(action, Action::SetState(_));
    if !replicated && crate::role::is_master() {
        let expired = slot.state().expire(now);
        if expired > 0 {
            stats::bump(&stats::LEASE_EXPIRATIONS, expired as u64);
            change.end(EndReason::Expired);
        }
    }
    let serve_first = matches!(action, Action::Serve) || slot.state().is_free();
    if serve_first && blocking::any_queued() {
        serve(db, name, slot.state(), now, &mut change);
    }
    let reply = apply(ctx, db, name, kind, slot.state(), action, now, &mut change);
    // Any change can make room (a hold ended, WRITE released under READ):
    // serving costs one admission check when the head still has to wait.
    if change.dirty && blocking::any_queued() {
        serve(db, name, slot.state(), now, &mut change);
    }
    commit(ctx, &key, keyname, db, name, kind, slot, &change);
    drop(key);
    if let Some((id, timeout)) = change.park {
        blocking::park(ctx, keyname, db, id, timeout);
    }
    blocking::deliver(change.served);
    reply
}

fn serve(db: i32, name: &[u8], state: &mut LockState, now: i64, change: &mut Change) {
    let served = blocking::serve(db, name, state, now, &mut || token::issue(now));
    for s in &served {
        if let Served::Granted { .. } = s {
            stats::bump(&stats::GRANTS, 1);
            change.dirty = true;
            change.acquired = true;
        }
    }
    change.served.extend(served);
}

#[allow(clippy::too_many_arguments)]
fn apply(
    ctx: *mut Ctx,
    db: i32,
    name: &[u8],
    kind: Kind,
    state: &mut LockState,
    action: Action,
    now: i64,
    change: &mut Change,
) -> Reply {
    match action {
        Action::Acquire {
            owner,
            mode,
            lease_ms,
            block,
        } => {
            let admission = state.admit(owner, mode);
            let granted = match admission {
                Admission::Upgrade => return Reply::err(UPGRADE_ERR),
                Admission::Reentrant => true,
                // A newcomer never overtakes a queued waiter.
                Admission::Fresh => !blocking::any_queued() || blocking::queue_len(db, name) == 0,
                Admission::Busy => false,
            };
            if granted {
                let deadline = now.saturating_add(lease_ms);
                let token = state.grant(owner, mode, deadline, &mut || token::issue(now));
                stats::bump(&stats::GRANTS, 1);
                change.dirty = true;
                change.acquired = true;
                return Reply::Int(token as i64);
            }
            match block {
                Some(timeout) if blocking::may_block(ctx) => {
                    let id = blocking::enqueue(db, name, kind, owner, mode, lease_ms);
                    change.park = Some((id, timeout));
                    Reply::Parked
                }
                _ => Reply::Null,
            }
        }
        Action::Release { owner, mode } => match state.release(owner, mode) {
            Ok((remaining, ended)) => {
                change.dirty = true;
                if ended {
                    change.end(EndReason::Released);
                }
                Reply::Int(remaining as i64)
            }
            Err(_) => Reply::err(NOTOWNER_ERR),
        },
        Action::Renew { owner, lease_ms } => match state.renew(owner, now.saturating_add(lease_ms))
        {
            Ok(()) => {
                change.dirty = true;
                Reply::Int(1)
            }
            Err(_) => Reply::err(NOTOWNER_ERR),
        },
        Action::ForceRelease => {
            let ended = state.force();
            if ended > 0 {
                stats::bump(&stats::FORCED_RELEASES, ended as u64);
                change.end(EndReason::Forced);
            }
            Reply::Int((ended > 0) as i64)
        }
        Action::SetState(new_state) => {
            new_state
                .holders
                .iter()
                .for_each(|h| token::observe(h.token));
            *state = new_state;
            change.dirty = true;
            Reply::Simple("OK")
        }
        Action::Expire { .. } | Action::Serve => Reply::Null,
    }
}

#[allow(clippy::too_many_arguments)]
fn commit(
    ctx: *mut Ctx,
    key: &Key,
    keyname: *mut RStr,
    db: i32,
    name: &[u8],
    kind: Kind,
    slot: Slot,
    change: &Change,
) {
    let value: Option<*mut LockValue> = if !change.dirty {
        match slot {
            Slot::Existing(p) => Some(p),
            Slot::Fresh(_) => None,
        }
    } else {
        let value = match slot {
            Slot::Existing(p) if unsafe { (*p).state.is_free() } => {
                crate::lease::unwatch(db, name, unsafe { &mut *p });
                unsafe { api!(RedisModule_DeleteKey)(key.raw) };
                replicate_del(ctx, keyname);
                None
            }
            Slot::Fresh(state) if state.is_free() => None,
            Slot::Existing(p) => Some(p),
            Slot::Fresh(state) => {
                let p = Box::into_raw(Box::new(LockValue::new(state)));
                unsafe { api!(RedisModule_ModuleTypeSetValue)(key.raw, lock_type(), p.cast()) };
                Some(p)
            }
        };
        if let Some(p) = value {
            let state = unsafe { &(*p).state };
            if let Some(latest) = state.latest_deadline() {
                unsafe { api!(RedisModule_SetAbsExpire)(key.raw, latest) };
            }
            replicate_state(ctx, keyname, state);
        }
        for reason in &change.ended {
            notify::publish(ctx, db, name, *reason);
            notify::keyspace(ctx, kind, notify::Event::End(*reason), keyname);
        }
        if change.acquired {
            notify::keyspace(ctx, kind, notify::Event::Acquire, keyname);
        }
        value
    };
    if let Some(p) = value {
        crate::lease::watch(ctx, db, name, unsafe { &mut *p });
    }
}

fn replicate_state(ctx: *mut Ctx, keyname: *mut RStr, state: &LockState) {
    if !crate::role::propagates() {
        return;
    }
    if let [h] = state.holders.as_slice() {
        // The common case (every reentrant and fair lock) without building strings.
        unsafe {
            api!(RedisModule_Replicate)(
                ctx,
                SETSTATE.as_ptr(),
                c"sccbllll".as_ptr(),
                keyname,
                state.kind.c_name().as_ptr(),
                c"1".as_ptr(),
                h.owner.as_ptr(),
                h.owner.len(),
                h.reads as i64,
                h.writes as i64,
                h.token as i64,
                h.deadline,
            )
        };
        return;
    }
    let args = setstate_args(state);
    let mut argv: Vec<*mut RStr> = args.iter().map(|s| s.ptr()).collect();
    unsafe {
        api!(RedisModule_Replicate)(
            ctx,
            SETSTATE.as_ptr(),
            c"sv".as_ptr(),
            keyname,
            argv.as_mut_ptr(),
            argv.len(),
        )
    };
}

fn replicate_del(ctx: *mut Ctx, keyname: *mut RStr) {
    if !crate::role::propagates() {
        return;
    }
    unsafe { api!(RedisModule_Replicate)(ctx, c"DEL".as_ptr(), c"s".as_ptr(), keyname) };
}

/// Lease timer entry for (db, key) fired.
pub fn expire_due(ctx: *mut Ctx, db: i32, key: &[u8], due: i64) {
    if select_db(ctx, db) {
        let keyname = OwnedStr::new(key);
        execute(ctx, keyname.ptr(), None, Action::Expire { due });
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
    if if_absent == IfAbsent::Retry && Key::open(ctx, keyname.ptr(), false).is_empty() {
        blocking::fail_all(db, key, notify::KEY_GONE_ERR);
        return;
    }
    if let Reply::Error(e) = execute(ctx, keyname.ptr(), Some(kind), Action::Serve) {
        blocking::fail_all(db, key, &e);
    }
}
