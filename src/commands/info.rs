//! `*.INFO key [COUNT n]`: a map describing the lock (RESP2 clients get a flat
//! array). Read-only: holds past their deadline are shown as gone, not removed.
//! `COUNT` caps the readers, holders or queued owners listed; counts stay exact.

use crate::blocking;
use crate::ffi::{bytes, now_ms, selected_db, Ctx, Key, RStr, Reply};
use crate::lock::{err, Holder, Kind, LockState};
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
    let (db, name) = (selected_db(ctx), unsafe { bytes(keyname) });
    let view = View {
        state: &state,
        now: now_ms(),
        db,
        name,
        count,
        waiters: blocking::queue_len(db, name) as i64,
    };
    let Some(first) = view.live().next() else {
        return Reply::Null;
    };
    match kind {
        Kind::Reentrant | Kind::Fair => view.exclusive(kind, first),
        Kind::Semaphore => view.semaphore(),
        Kind::ReadWrite => view.read_write(),
    }
}

/// One lock as `describe` reads it, at one moment.
struct View<'a> {
    state: &'a LockState,
    now: i64,
    db: i32,
    name: &'a [u8],
    /// How many readers, holders or queued owners to list.
    count: usize,
    waiters: i64,
}

impl<'a> View<'a> {
    /// The holders whose lease is not over (the rest are shown as gone).
    fn live(&self) -> impl Iterator<Item = &'a Holder> + 'a {
        let now = self.now;
        self.state.iter().filter(move |h| h.deadline >= now)
    }

    fn ttl(&self, h: &Holder) -> Reply {
        Reply::Int(h.deadline - self.now)
    }

    fn keepalive(&self, h: &Holder) -> Reply {
        crate::keepalive::bound_client(self.db, self.name, h.token)
            .map_or(Reply::Null, |c| Reply::Int(c as i64))
    }

    /// One listed holder: its count of READ holds or permits under `count_name`.
    fn entry(&self, h: &Holder, count_name: &'static str) -> Reply {
        Reply::Map(vec![
            ("owner", Reply::Bulk(h.owner.to_vec())),
            (count_name, Reply::Int(h.reads as i64)),
            ("token", Reply::Int(h.token as i64)),
            ("ttl", self.ttl(h)),
            ("keepalive", self.keepalive(h)),
        ])
    }

    /// RLOCK and FAIRLOCK: the one holder, and FAIRLOCK's queue.
    fn exclusive(&self, kind: Kind, h: &Holder) -> Reply {
        let mut fields = vec![
            ("kind", Reply::Bulk(kind.name().into())),
            ("owner", Reply::Bulk(h.owner.to_vec())),
            ("holds", Reply::Int(h.writes as i64)),
            ("token", Reply::Int(h.token as i64)),
            ("ttl", self.ttl(h)),
            ("keepalive", self.keepalive(h)),
            ("waiters", Reply::Int(self.waiters)),
        ];
        if kind == Kind::Fair {
            let queue = blocking::with_queue(self.db, self.name, |q| {
                q.waiters()
                    .take(self.count)
                    .map(|w| Reply::Bulk(w.owner.to_vec()))
                    .collect()
            });
            fields.push(("queue", Reply::Array(queue.unwrap_or_default())));
        }
        Reply::Map(fields)
    }

    fn semaphore(&self) -> Reply {
        let limit = self.state.limit() as i64;
        let used: i64 = self.live().map(|h| h.reads as i64).sum();
        let holders = self
            .live()
            .take(self.count)
            .map(|h| self.entry(h, "permits"))
            .collect();
        let latest = self.state.latest_deadline().unwrap_or(self.now);
        Reply::Map(vec![
            ("kind", Reply::Bulk(Kind::Semaphore.name().into())),
            ("limit", Reply::Int(limit)),
            ("used", Reply::Int(used)),
            ("available", Reply::Int((limit - used).max(0))),
            ("holders", Reply::Array(holders)),
            ("holder_count", Reply::Int(self.live().count() as i64)),
            ("ttl", Reply::Int(latest - self.now)),
            ("waiters", Reply::Int(self.waiters)),
        ])
    }

    fn read_write(&self) -> Reply {
        let writer = state_writer(self.live());
        let readers = || self.live().filter(|h| h.reads > 0);
        let reader_count = readers().count() as i64;
        let listed = readers()
            .take(self.count)
            .map(|h| self.entry(h, "holds"))
            .collect();
        let latest = self.state.latest_deadline().unwrap_or(self.now);
        Reply::Map(vec![
            ("kind", Reply::Bulk(Kind::ReadWrite.name().into())),
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
            (
                "writer_keepalive",
                writer.map_or(Reply::Null, |w| self.keepalive(w)),
            ),
            ("readers", Reply::Array(listed)),
            ("reader_count", Reply::Int(reader_count)),
            ("ttl", Reply::Int(latest - self.now)),
            ("waiters", Reply::Int(self.waiters)),
        ])
    }
}

/// A writer is always the only holder, so the first live holder tells.
fn state_writer<'a>(mut live: impl Iterator<Item = &'a Holder>) -> Option<&'a Holder> {
    live.next().filter(|h| h.writes > 0)
}
