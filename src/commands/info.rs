//! `*.INFO key [COUNT n]`: a map describing the lock (RESP2 clients get a flat
//! array). Read-only: holds past their deadline are shown as gone, not removed.
//! `COUNT` caps the readers, holders or queued owners listed; counts stay exact.

use crate::blocking;
use crate::ffi::{bytes, now_ms, selected_db, Ctx, Key, RStr, Reply};
use crate::lock::{err, Holder, Kind};
use crate::store::lock_at;

pub fn describe(ctx: *mut Ctx, keyname: *mut RStr, kind: Kind, count: usize) -> Reply {
    let key = Key::open(ctx, keyname, false);
    let state = match lock_at(&key) {
        Err(()) => return Reply::err(err::WRONGTYPE),
        Ok(None) => return Reply::Null,
        Ok(Some(v)) => unsafe { v.state() },
    };
    if state.kind() != kind {
        return Reply::err(err::WRONGTYPE);
    }
    let now = now_ms();
    let live = || state.iter().filter(|h| h.deadline >= now);
    let Some(first) = live().next() else {
        return Reply::Null;
    };
    let (db, name) = (selected_db(ctx), unsafe { bytes(keyname) });
    let waiters = blocking::queue_len(db, name) as i64;
    let ttl = |h: &Holder| Reply::Int(h.deadline - now);
    let keepalive = |h: &Holder| {
        crate::keepalive::bound_client(db, name, h.token)
            .map_or(Reply::Null, |c| Reply::Int(c as i64))
    };
    // One listed holder: its count of READ holds or permits under `count_name`.
    let entry = |h: &Holder, count_name: &'static str| {
        Reply::Map(vec![
            ("owner", Reply::Bulk(h.owner.to_vec())),
            (count_name, Reply::Int(h.reads as i64)),
            ("token", Reply::Int(h.token as i64)),
            ("ttl", ttl(h)),
            ("keepalive", keepalive(h)),
        ])
    };
    match kind {
        Kind::Reentrant | Kind::Fair => {
            let h = first;
            let mut fields = vec![
                ("kind", Reply::Bulk(kind.name().into())),
                ("owner", Reply::Bulk(h.owner.to_vec())),
                ("holds", Reply::Int(h.writes as i64)),
                ("token", Reply::Int(h.token as i64)),
                ("ttl", ttl(h)),
                ("keepalive", keepalive(h)),
                ("waiters", Reply::Int(waiters)),
            ];
            if kind == Kind::Fair {
                let queue = blocking::with_queue(db, name, |q| {
                    q.waiters()
                        .take(count)
                        .map(|w| Reply::Bulk(w.owner.to_vec()))
                        .collect()
                });
                fields.push(("queue", Reply::Array(queue.unwrap_or_default())));
            }
            Reply::Map(fields)
        }
        Kind::Semaphore => {
            let limit = state.limit() as i64;
            let used: i64 = live().map(|h| h.reads as i64).sum();
            let holders = live().take(count).map(|h| entry(h, "permits")).collect();
            let latest = state.latest_deadline().unwrap_or(now);
            Reply::Map(vec![
                ("kind", Reply::Bulk(kind.name().into())),
                ("limit", Reply::Int(limit)),
                ("used", Reply::Int(used)),
                ("available", Reply::Int((limit - used).max(0))),
                ("holders", Reply::Array(holders)),
                ("holder_count", Reply::Int(live().count() as i64)),
                ("ttl", Reply::Int(latest - now)),
                ("waiters", Reply::Int(waiters)),
            ])
        }
        Kind::ReadWrite => {
            let writer = state_writer(live());
            let readers = || live().filter(|h| h.reads > 0);
            let reader_count = readers().count() as i64;
            let listed = readers().take(count).map(|h| entry(h, "holds")).collect();
            let latest = state.latest_deadline().unwrap_or(now);
            Reply::Map(vec![
                ("kind", Reply::Bulk(kind.name().into())),
                (
                    "mode",
                    Reply::Bulk(if writer.is_some() { "write" } else { "read" }.into()),
                ),
                (
                    "writer",
                    writer.map_or(Reply::Null, |w| Reply::Bulk(w.owner.to_vec())),
                ),
                (
                    "writer_holds",
                    Reply::Int(writer.map_or(0, |w| w.writes as i64)),
                ),
                (
                    "writer_token",
                    writer.map_or(Reply::Null, |w| Reply::Int(w.token as i64)),
                ),
                ("writer_keepalive", writer.map_or(Reply::Null, keepalive)),
                ("readers", Reply::Array(listed)),
                ("reader_count", Reply::Int(reader_count)),
                ("ttl", Reply::Int(latest - now)),
                ("waiters", Reply::Int(waiters)),
            ])
        }
    }
}

/// A writer is always the only holder, so the first live holder tells.
fn state_writer<'a>(mut live: impl Iterator<Item = &'a Holder>) -> Option<&'a Holder> {
    live.next().filter(|h| h.writes > 0)
}
