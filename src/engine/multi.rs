//! Changes to several RLOCK keys in one step (`RLOCK.ACQUIREALL`,
//! `RELEASEALL`, `RENEWALL`, and the grant of a parked multi-key waiter).
//!
//! Each key takes the one path (`open` .. `finish`); what is added here is the
//! all-or-nothing decision between the halves: every key is opened and its
//! overdue holds ended, the request is checked against all of them, and only
//! then is any key changed. Every key's delta is replicated from the same
//! command (or timer callback), which Redis wraps in one MULTI/EXEC, so
//! replicas and the AOF see the whole change at once.
//!
//! A parked multi-key waiter is queued on each of its keys and holds none.
//! First in a key's queue, it reserves that key: the queue serves nobody
//! behind it, and newcomers find the key busy. Whenever one of its keys is
//! served while it is first there, the queue reports it (`take_multi_ready`)
//! and `serve_multi` grants it every key if it is first everywhere and every
//! key admits it. Queues are in arrival order on every key, so of two
//! multi-key waiters sharing keys the older is ahead on all of them: waiting
//! for several keys never deadlocks.

use std::cell::Cell;

use super::{finish, open, refuse_on_replica, Opened, Origin};
use crate::blocking;
use crate::ffi::{now_ms, select_db, Ctx, Key, OwnedStr, RStr, Reply};
use crate::lock::{err, Admission, Kind, Mode};
use crate::stats;
use crate::token;

/// Opens every key as an RLOCK (WRONGTYPE on the first other type, before
/// anything changed) and ends overdue holds. Only a master changes locks.
fn open_all<'a>(ctx: *mut Ctx, keynames: &[*mut RStr], now: i64) -> Result<Vec<Opened<'a>>, Reply> {
    refuse_on_replica()?;
    let record = crate::role::propagates();
    let mut opened = Vec::with_capacity(keynames.len());
    for &keyname in keynames {
        match open(
            ctx,
            Key::open(ctx, keyname, true),
            keyname,
            Some(Kind::Reentrant),
            record,
        ) {
            Ok(o) => opened.push(o),
            Err(reply) => return Err(reply),
        }
    }
    if crate::role::is_master() {
        opened.iter_mut().for_each(|o| o.expire_overdue(now));
    }
    Ok(opened)
}

fn finish_all(ctx: *mut Ctx, opened: Vec<Opened>, now: i64) {
    for o in opened {
        finish(ctx, o, now, Origin::Local);
    }
}

/// Grants `owner` one hold on every opened key; on a refusal (hold count or
/// tokens exhausted) the holds already given are taken back.
fn grant_every(
    opened: &mut [Opened],
    owner: &[u8],
    lease_ms: i64,
    now: i64,
) -> Result<Vec<u64>, &'static str> {
    let deadline = now.saturating_add(lease_ms);
    let mut tokens = Vec::with_capacity(opened.len());
    for i in 0..opened.len() {
        let o = &mut opened[i];
        let granted = o.slot.state().grant(
            owner,
            Mode::Write,
            deadline,
            &mut || token::issue(now),
            &mut o.change.delta,
        );
        match granted {
            Ok(token) => {
                o.change.dirty = true;
                tokens.push(token);
            }
            Err(refused) => {
                for o in &mut opened[..i] {
                    let _ = o
                        .slot
                        .state()
                        .release(owner, Mode::Write, &mut o.change.delta);
                }
                return Err(refused.0);
            }
        }
    }
    for o in opened.iter_mut() {
        o.change.acquired = true;
    }
    stats::bump(&stats::GRANTS, opened.len() as u64);
    Ok(tokens)
}

fn holds_every(opened: &mut [Opened], owner: &[u8]) -> bool {
    opened
        .iter_mut()
        .all(|o| o.state().admit(owner, Mode::Write) == Admission::Reentrant)
}

/// `RLOCK.ACQUIREALL`: a hold on every key for `owner`, or none; with
/// `block`, waits holding nothing.
pub fn acquire_all(
    ctx: *mut Ctx,
    keynames: &[*mut RStr],
    owner: &[u8],
    lease_ms: i64,
    block: Option<i64>,
    keepalive: bool,
    now: i64,
) -> Reply {
    let mut opened = match open_all(ctx, keynames, now) {
        Ok(v) => v,
        Err(reply) => return reply,
    };
    let queued = blocking::any_queued();
    let grantable = opened
        .iter_mut()
        .all(|o| match o.admit(owner, Mode::Write, now) {
            Admission::Reentrant => true,
            // A newcomer never overtakes a queued waiter (a reservation included).
            Admission::Fresh => !queued || blocking::queue_len(o.db, o.name) == 0,
            Admission::Busy | Admission::Upgrade => false,
        });
    let mut reply = Reply::NullArray;
    if grantable {
        reply = match grant_every(&mut opened, owner, lease_ms, now) {
            Ok(tokens) => {
                let client = keepalive.then(|| super::client_id(ctx));
                for (o, token) in opened.iter().zip(&tokens) {
                    match client {
                        Some(c) => crate::keepalive::bind(o.db, o.name, *token, c, lease_ms),
                        None => crate::keepalive::lease_changed(o.db, o.name, *token, lease_ms),
                    }
                }
                blocking::tokens_reply(&tokens)
            }
            Err(e) => Reply::err(e),
        };
    }
    let parked = match block {
        Some(timeout) if !grantable && blocking::may_block(ctx) => {
            let db = opened[0].db;
            let names: Vec<&[u8]> = opened.iter().map(|o| o.name).collect();
            // Queued before the keys are written back, so the lease timer
            // watches them for this waiter.
            Some((
                blocking::enqueue_all(db, &names, owner, lease_ms),
                db,
                timeout,
            ))
        }
        _ => None,
    };
    finish_all(ctx, opened, now);
    if let Some((id, db, timeout)) = parked {
        blocking::park(
            ctx,
            keynames,
            db,
            id,
            timeout,
            keepalive.then_some(lease_ms),
        );
        reply = Reply::Parked;
    }
    serve_multi_ready(ctx);
    reply
}

/// `RLOCK.RELEASEALL`: one release on every key, or NOTOWNER and no change.
pub fn release_all(ctx: *mut Ctx, keynames: &[*mut RStr], owner: &[u8]) -> Reply {
    let now = now_ms();
    let mut opened = match open_all(ctx, keynames, now) {
        Ok(v) => v,
        Err(reply) => return reply,
    };
    let reply = if holds_every(&mut opened, owner) {
        let remaining = opened
            .iter_mut()
            .map(|o| {
                let (left, ended) = o
                    .slot
                    .state()
                    .release(owner, Mode::Write, &mut o.change.delta)
                    .unwrap_or((0, false));
                o.change.release(Kind::Reentrant, Mode::Write, left, ended);
                Reply::Int(left as i64)
            })
            .collect();
        Reply::Array(remaining)
    } else {
        Reply::err(err::NOTOWNER)
    };
    finish_all(ctx, opened, now);
    serve_multi_ready(ctx);
    reply
}

/// `RLOCK.RENEWALL`: every key's lease renewed, or NOTOWNER and no change.
pub fn renew_all(
    ctx: *mut Ctx,
    keynames: &[*mut RStr],
    owner: &[u8],
    lease_ms: i64,
    now: i64,
) -> Reply {
    let mut opened = match open_all(ctx, keynames, now) {
        Ok(v) => v,
        Err(reply) => return reply,
    };
    let reply = if holds_every(&mut opened, owner) {
        let deadline = now.saturating_add(lease_ms);
        for o in opened.iter_mut() {
            let _ = o.slot.state().renew(owner, deadline, &mut o.change.delta);
            o.change.dirty = true;
            super::renewed(o.db, o.name, o.slot.state(), owner, lease_ms);
        }
        Reply::Int(1)
    } else {
        Reply::err(err::NOTOWNER)
    };
    finish_all(ctx, opened, now);
    serve_multi_ready(ctx);
    reply
}

thread_local! {
    static SERVING: Cell<bool> = const { Cell::new(false) };
}

/// Tries the multi-key waiters that queues found ready. Runs at the end of
/// every change; changes made while it runs only add to its list.
#[inline]
pub fn serve_multi_ready(ctx: *mut Ctx) {
    // Only a queue reports a ready waiter, and it stays queued until served:
    // with no queue anywhere there is nothing to try (the common case, checked
    // without touching the thread-locals, and inline at the caller).
    if blocking::any_queued() {
        serve_ready(ctx);
    }
}

#[inline(never)]
fn serve_ready(ctx: *mut Ctx) {
    if SERVING.with(|s| s.replace(true)) {
        return;
    }
    while let Some(id) = blocking::take_multi_ready() {
        serve_multi(ctx, id);
    }
    SERVING.with(|s| s.set(false));
}

/// Grants a parked multi-key waiter every key if every key admits it and it
/// is first in the queue of each key its owner does not hold already;
/// otherwise leaves it waiting.
fn serve_multi(ctx: *mut Ctx, id: u64) {
    let Some(w) = blocking::multi_waiter(id) else {
        return;
    };
    let now = now_ms();
    // Past its BLOCK time: the blocking timer answers it (never granted).
    if (w.deadline != 0 && w.deadline < now) || !select_db(ctx, w.db) {
        return;
    }
    let names: Vec<OwnedStr> = w.keys.iter().map(|k| OwnedStr::new(k)).collect();
    let ptrs: Vec<*mut RStr> = names.iter().map(OwnedStr::ptr).collect();
    let mut opened = match open_all(ctx, &ptrs, now) {
        Ok(v) => v,
        Err(Reply::Error(e)) => return blocking::fail(id, &e),
        Err(_) => return,
    };
    let mut ready = opened
        .iter_mut()
        .all(|o| match o.admit(&w.owner, Mode::Write, now) {
            // A key its owner holds is granted at once, as `ACQUIRE` grants
            // it: nobody queued there can have it before the owner lets go.
            Admission::Reentrant => true,
            Admission::Fresh => blocking::is_head(o.db, o.name, id),
            Admission::Busy | Admission::Upgrade => false,
        });
    if ready && crate::min_replicas::refuses_writes() {
        w.keys.iter().for_each(|k| blocking::withhold(w.db, k));
        ready = false;
    }
    let outcome = ready.then(|| grant_every(&mut opened, &w.owner, w.lease_ms, now));
    if let Some(Ok(_)) = outcome {
        blocking::dequeue_all(w.db, &w.keys, id);
    }
    finish_all(ctx, opened, now);
    match outcome {
        Some(Ok(tokens)) => blocking::deliver_all(id, tokens, w.lease_ms),
        Some(Err(e)) => blocking::fail(id, e),
        None => {}
    }
}
