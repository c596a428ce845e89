//! Who holds a lock, in which mode, until when, and with which fencing token.
//!
//! The holder set has two encodings, as Redis's hashes do (listpack ->
//! hashtable): a lock with one holder keeps it inline; a lock with more holders
//! (read-write locks with several readers) keeps an index by token, by owner and
//! by deadline, so a change to one holder costs O(log n) whatever the count.
//! The index goes back to inline when one holder is left.
//!
//! A semaphore is the same holder set: each holding's permits are its
//! `reads`, the index keeps their sum, and the state keeps the limit in force.
//!
//! Every change is also written to a `Delta` (when it records), the effect a
//! master replicates; `replay` applies a delta on a replica or from the AOF.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::delta::{Delta, Op};
use super::encoding::{read_whole, Layout, Whole};
use super::{err, Kind, Mode, Owner};

/// One owner's tenure on a lock. The token is fixed for the whole tenure; the
/// deadline is per holder, so one reader's lease never moves another's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub owner: Owner,
    pub token: u64,
    /// Last unix millisecond at which the hold is valid (expired once `now > deadline`,
    /// the same rule Redis applies to key TTLs).
    pub deadline: i64,
    pub reads: u32,
    pub writes: u32,
}

impl Holder {
    pub fn holds(&self, mode: Mode) -> u32 {
        match mode {
            Mode::Read | Mode::Permits { .. } => self.reads,
            Mode::Write => self.writes,
        }
    }

    fn holds_mut(&mut self, mode: Mode) -> &mut u32 {
        match mode {
            Mode::Read | Mode::Permits { .. } => &mut self.reads,
            Mode::Write => &mut self.writes,
        }
    }
}

/// What a request would get from the current holders, before queue order is considered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// The owner already holds a compatible mode: granted regardless of the queue.
    Reentrant,
    /// Compatible with every holder: granted unless someone is queued ahead.
    Fresh,
    /// Conflicts with another holder.
    Busy,
    /// READ holder asking for WRITE: refused outright, waiting would deadlock.
    Upgrade,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotOwner;

/// A grant that cannot be made: the reply is this error and nothing changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Refused(pub &'static str);

/// Many holders: each change finds its holder by owner or token and keeps the
/// deadline order, in O(log n).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Index {
    by_token: BTreeMap<u64, Holder>,
    by_owner: HashMap<Owner, u64>,
    by_deadline: BTreeSet<(i64, u64)>,
    /// The holders' `reads` summed: a semaphore's permits in use.
    reads: u64,
}

impl Index {
    fn insert(&mut self, h: Holder) {
        self.reads += h.reads as u64;
        self.by_owner.insert(h.owner.clone(), h.token);
        self.by_deadline.insert((h.deadline, h.token));
        self.by_token.insert(h.token, h);
    }

    /// Out of line: the hashing it sets up is not for the one-holder lock.
    #[inline(never)]
    fn holder(&self, owner: &[u8]) -> Option<&Holder> {
        self.by_owner.get(owner).and_then(|t| self.by_token.get(t))
    }

    fn remove(&mut self, token: u64) -> Option<Holder> {
        let h = self.by_token.remove(&token)?;
        self.reads -= h.reads as u64;
        self.by_owner.remove(&h.owner);
        self.by_deadline.remove(&(h.deadline, token));
        Some(h)
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Holders {
    Empty,
    One(Holder),
    Many(Box<Index>),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockState {
    kind: Kind,
    /// A semaphore's limit in force (0 for the lock families).
    limit: u32,
    holders: Holders,
}

impl LockState {
    pub fn new(kind: Kind) -> Self {
        LockState {
            kind,
            limit: 0,
            holders: Holders::Empty,
        }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn limit(&self) -> u32 {
        self.limit
    }

    /// Permits in use (a semaphore); for a read-write lock, READ holds.
    pub fn used(&self) -> u64 {
        match &self.holders {
            Holders::Empty => 0,
            Holders::One(h) => h.reads as u64,
            Holders::Many(ix) => ix.reads,
        }
    }

    /// Puts a semaphore's latest LIMIT in force. A lower limit ends no holding:
    /// new grants wait until the permits in use are below it.
    pub fn set_limit(&mut self, limit: u32, delta: &mut Delta) {
        if self.kind == Kind::Semaphore && limit != self.limit {
            self.limit = limit;
            delta.limit(limit);
        }
    }

    #[inline]
    pub fn is_free(&self) -> bool {
        matches!(self.holders, Holders::Empty)
    }

    pub fn holder_count(&self) -> usize {
        match &self.holders {
            Holders::Empty => 0,
            Holders::One(_) => 1,
            Holders::Many(ix) => ix.by_token.len(),
        }
    }

    /// Whether the holders are kept in the index (more than one holder).
    #[inline]
    pub fn is_indexed(&self) -> bool {
        matches!(self.holders, Holders::Many(_))
    }

    /// Holders in token order (grant order).
    pub fn iter(&self) -> Box<dyn Iterator<Item = &Holder> + '_> {
        match &self.holders {
            Holders::Empty => Box::new(std::iter::empty()),
            Holders::One(h) => Box::new(std::iter::once(h)),
            Holders::Many(ix) => Box::new(ix.by_token.values()),
        }
    }

    /// The holder of a lock with exactly one.
    pub fn only_holder(&self) -> Option<&Holder> {
        match &self.holders {
            Holders::One(h) => Some(h),
            _ => None,
        }
    }

    #[inline]
    pub fn holder(&self, owner: &[u8]) -> Option<&Holder> {
        match &self.holders {
            Holders::One(h) if *h.owner == *owner => Some(h),
            Holders::Many(ix) => ix.holder(owner),
            _ => None,
        }
    }

    pub fn by_token(&self, token: u64) -> Option<&Holder> {
        match &self.holders {
            Holders::One(h) if h.token == token => Some(h),
            Holders::Many(ix) => ix.by_token.get(&token),
            _ => None,
        }
    }

    /// The holder with WRITE holds, if any. A writer is always the only holder.
    pub fn writer(&self) -> Option<&Holder> {
        match &self.holders {
            Holders::One(h) if h.writes > 0 => Some(h),
            _ => None,
        }
    }

    pub fn earliest_deadline(&self) -> Option<i64> {
        match &self.holders {
            Holders::Empty => None,
            Holders::One(h) => Some(h.deadline),
            Holders::Many(ix) => ix.by_deadline.first().map(|(d, _)| *d),
        }
    }

    pub fn latest_deadline(&self) -> Option<i64> {
        match &self.holders {
            Holders::Empty => None,
            Holders::One(h) => Some(h.deadline),
            Holders::Many(ix) => ix.by_deadline.last().map(|(d, _)| *d),
        }
    }

    pub fn admit(&self, owner: &[u8], mode: Mode) -> Admission {
        if let Mode::Permits { count, limit } = mode {
            // An owner's further permits queue like anyone's: a large request
            // at the head is not overtaken by holders topping up.
            // The request's limit only starts a semaphore; one that has a
            // limit keeps it while the last holder leaves and its waiters are
            // served (the latest ACQUIRE's, not each waiter's own).
            let limit = if self.limit == 0 { limit } else { self.limit };
            return if self.used() + count as u64 <= limit as u64 {
                Admission::Fresh
            } else {
                Admission::Busy
            };
        }
        if let Some(h) = self.holder(owner) {
            return match (self.kind, mode) {
                (Kind::ReadWrite, Mode::Write) if h.writes == 0 => Admission::Upgrade,
                _ => Admission::Reentrant,
            };
        }
        let compatible = match mode {
            Mode::Write => self.is_free(),
            Mode::Read | Mode::Permits { .. } => self.writer().is_none(),
        };
        if compatible {
            Admission::Fresh
        } else {
            Admission::Busy
        }
    }

    /// Adds one hold of `mode` (a semaphore: its permits) for `owner` and
    /// resets its lease to `deadline`. A new holder takes a fresh token from
    /// `issue`; an existing one keeps its own. The caller has checked `admit`;
    /// a semaphore created by this grant (no limit yet) takes the request's limit.
    pub fn grant(
        &mut self,
        owner: &[u8],
        mode: Mode,
        deadline: i64,
        issue: &mut dyn FnMut() -> Option<u64>,
        delta: &mut Delta,
    ) -> Result<u64, Refused> {
        if let Some(token) = self.holder(owner).map(|h| h.token) {
            self.add_hold(token, mode, deadline)?;
            delta.hold(token, mode, deadline);
            return Ok(token);
        }
        let token = issue().ok_or(Refused(err::TOKENS_EXHAUSTED))?;
        if let (Mode::Permits { limit, .. }, 0) = (mode, self.limit) {
            self.set_limit(limit, delta);
        }
        let mut holder = Holder {
            owner: owner.into(),
            token,
            deadline,
            reads: 0,
            writes: 0,
        };
        *holder.holds_mut(mode) = mode.amount();
        self.insert(holder);
        delta.new_holder(mode, token, deadline, owner);
        Ok(token)
    }

    /// Drops one hold of `mode` (a semaphore: its permits). Returns the owner's
    /// remaining holds of that mode and whether the owner's tenure ended (no
    /// holds of any mode left).
    pub fn release(
        &mut self,
        owner: &[u8],
        mode: Mode,
        delta: &mut Delta,
    ) -> Result<(u32, bool), Refused> {
        let h = self.holder(owner).ok_or(Refused(err::NOTOWNER))?;
        match h.holds(mode) {
            0 => return Err(Refused(err::NOTOWNER)),
            n if n < mode.amount() => return Err(Refused(err::TOO_FEW_PERMITS)),
            _ => {}
        }
        let token = h.token;
        delta.release(token, mode);
        Ok(self.drop_hold(token, mode))
    }

    pub fn renew(
        &mut self,
        owner: &[u8],
        deadline: i64,
        delta: &mut Delta,
    ) -> Result<(), NotOwner> {
        let token = self.holder(owner).ok_or(NotOwner)?.token;
        self.renew_tenure(token, deadline, delta)
    }

    /// Renews the tenure with this token (a KEEPALIVE renewal: a later tenure
    /// of the same owner is not the bound one).
    pub fn renew_tenure(
        &mut self,
        token: u64,
        deadline: i64,
        delta: &mut Delta,
    ) -> Result<(), NotOwner> {
        self.modify(token, |h| h.deadline = deadline)
            .ok_or(NotOwner)?;
        delta.renew(token, deadline);
        Ok(())
    }

    /// Ends the tenure with this token, every hold of it at once.
    pub fn end_tenure(&mut self, token: u64, delta: &mut Delta) -> Result<(), NotOwner> {
        self.remove(token).ok_or(NotOwner)?;
        delta.end(token);
        Ok(())
    }

    /// Ends every hold; returns how many holders there were.
    pub fn force(&mut self, delta: &mut Delta) -> usize {
        let n = self.holder_count();
        if n > 0 {
            delta.force();
        }
        self.holders = Holders::Empty;
        n
    }

    /// Ends the holds whose lease ran out before `now`, earliest first; returns how many.
    #[inline]
    pub fn expire(&mut self, now: i64, delta: &mut Delta) -> usize {
        if self.is_free() {
            return 0;
        }
        self.expire_holders(now, delta)
    }

    #[inline(never)]
    fn expire_holders(&mut self, now: i64, delta: &mut Delta) -> usize {
        let mut n = 0;
        while let Some(d) = self.earliest_deadline() {
            if d >= now {
                break;
            }
            let token = match &self.holders {
                Holders::One(h) => h.token,
                Holders::Many(ix) => ix.by_deadline.first().expect("non-empty").1,
                Holders::Empty => unreachable!("has a deadline"),
            };
            self.remove(token);
            delta.end(token);
            n += 1;
        }
        n
    }

    /// One more hold (or `k` permits) for an existing holder, lease reset.
    fn add_hold(&mut self, token: u64, mode: Mode, deadline: i64) -> Result<(), Refused> {
        self.modify(token, |h| {
            let n = h
                .holds(mode)
                .checked_add(mode.amount())
                .ok_or(Refused(err::HOLD_OVERFLOW))?;
            *h.holds_mut(mode) = n;
            h.deadline = deadline;
            Ok(())
        })
        .unwrap_or(Err(Refused(err::INVALID_DELTA)))
    }

    fn drop_hold(&mut self, token: u64, mode: Mode) -> (u32, bool) {
        let (remaining, ended) = self
            .modify(token, |h| {
                *h.holds_mut(mode) -= mode.amount();
                (h.holds(mode), h.reads == 0 && h.writes == 0)
            })
            .expect("holder exists");
        if ended {
            self.remove(token);
        }
        (remaining, ended)
    }

    /// Changes one holder in place, keeping the deadline order.
    fn modify<R>(&mut self, token: u64, f: impl FnOnce(&mut Holder) -> R) -> Option<R> {
        match &mut self.holders {
            Holders::One(h) if h.token == token => Some(f(h)),
            Holders::Many(ix) => {
                let h = ix.by_token.get_mut(&token)?;
                let (before, reads) = (h.deadline, h.reads);
                let out = f(h);
                ix.reads = ix.reads - reads as u64 + h.reads as u64;
                if h.deadline != before {
                    let after = h.deadline;
                    ix.by_deadline.remove(&(before, token));
                    ix.by_deadline.insert((after, token));
                }
                Some(out)
            }
            _ => None,
        }
    }

    fn insert(&mut self, h: Holder) {
        // The common first holder: written in place, no move of the old value.
        if let Holders::Empty = self.holders {
            self.holders = Holders::One(h);
            return;
        }
        self.holders = match std::mem::replace(&mut self.holders, Holders::Empty) {
            Holders::Empty => Holders::One(h),
            Holders::One(first) => {
                let mut ix = Box::<Index>::default();
                ix.insert(first);
                ix.insert(h);
                Holders::Many(ix)
            }
            Holders::Many(mut ix) => {
                ix.insert(h);
                Holders::Many(ix)
            }
        };
    }

    fn remove(&mut self, token: u64) -> Option<Holder> {
        match &mut self.holders {
            Holders::One(h) if h.token == token => {
                match std::mem::replace(&mut self.holders, Holders::Empty) {
                    Holders::One(h) => Some(h),
                    _ => unreachable!(),
                }
            }
            Holders::Many(ix) => {
                let removed = ix.remove(token)?;
                if ix.by_token.len() == 1 {
                    let (_, last) = ix.by_token.pop_first().expect("one left");
                    self.holders = Holders::One(last);
                }
                Some(removed)
            }
            _ => None,
        }
    }

    /// A packed lock's state (`Compact`): it was a whole state when packed.
    pub(super) fn with_holder(kind: Kind, limit: u32, holder: Holder) -> LockState {
        LockState {
            kind,
            limit,
            holders: Holders::One(holder),
        }
    }

    /// A whole state from a loader (RDB, RESTORE, RLOCK.SETSTATE): the rules the
    /// commands keep, checked once for every way a state can arrive.
    pub fn from_holders(
        kind: Kind,
        holders: impl IntoIterator<Item = Holder>,
        max_token: u64,
    ) -> Result<LockState, &'static str> {
        Self::from_parts(kind, 0, holders, max_token)
    }

    /// As `from_holders`, with a semaphore's limit (at least 1; 0 for locks).
    pub fn from_parts(
        kind: Kind,
        limit: u32,
        holders: impl IntoIterator<Item = Holder>,
        max_token: u64,
    ) -> Result<LockState, &'static str> {
        if (kind == Kind::Semaphore) != (limit > 0) {
            return Err(err::INVALID_STATE);
        }
        let mut state = LockState::new(kind);
        state.limit = limit;
        for h in holders {
            if !state.fits(&h, max_token) {
                return Err(err::INVALID_STATE);
            }
            state.insert(h);
        }
        if state.is_free() {
            return Err(err::INVALID_STATE);
        }
        Ok(state)
    }

    /// Whether `h` may join the current holders as it is: the rules every
    /// state the commands make keeps (one holder for exclusive families, a
    /// writer alone, distinct owners and tokens, at least one hold, ranges).
    /// A semaphore's holdings are permits only, in any number: a lowered
    /// limit ends no holding, so the holdings may exceed it, also one alone;
    /// but they join only under a limit (a replayed one arrives as an `L`
    /// step first: without it the state would be one no loader accepts).
    fn fits(&self, h: &Holder, max_token: u64) -> bool {
        let joins = match self.kind {
            Kind::Semaphore => self.limit > 0,
            // A writer comes alone; readers join readers.
            Kind::ReadWrite => (self.is_free() || h.writes == 0) && self.writer().is_none(),
            Kind::Reentrant | Kind::Fair => self.is_free(),
        };
        joins
            && !h.owner.is_empty()
            && Self::lone_holds_valid(
                self.kind,
                (h.reads, h.writes),
                h.token,
                h.deadline,
                max_token,
            )
            && self.holder(&h.owner).is_none()
            && self.by_token(h.token).is_none()
    }

    /// The rules on a holder's own numbers, as if it held the lock alone:
    /// what its family allows, at least one hold, a token in range, a
    /// deadline not before 0.
    pub fn lone_holds_valid(
        kind: Kind,
        (reads, writes): (u32, u32),
        token: u64,
        deadline: i64,
        max_token: u64,
    ) -> bool {
        let family_rules = match kind {
            // A lowered limit ends no holding: one holding may exceed it.
            Kind::Semaphore => writes == 0,
            Kind::ReadWrite => true,
            Kind::Reentrant | Kind::Fair => reads == 0,
        };
        family_rules
            && reads as u64 + writes as u64 > 0
            && (1..=max_token).contains(&token)
            && deadline >= 0
    }

    /// Applies a replicated delta. All or nothing: on the first invalid step
    /// everything already applied is undone and the state is as it was.
    pub fn replay(&mut self, ops: &[Op], max_token: u64) -> Result<(), &'static str> {
        // A step that fails changes nothing, so the last step (the only one,
        // for most deltas) needs no undo record.
        let mut undo = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            match self.replay_one(op, max_token) {
                Ok(u) if i + 1 < ops.len() => undo.push(u),
                Ok(_) => {}
                Err(e) => {
                    for u in undo.into_iter().rev() {
                        self.undo(u);
                    }
                    return Err(e);
                }
            }
        }
        Ok(())
    }

    /// Applies one step, or refuses it and changes nothing; returns how to
    /// take it back.
    fn replay_one(&mut self, op: &Op, max_token: u64) -> Result<Undo, &'static str> {
        let bad = err::INVALID_DELTA;
        Ok(match *op {
            Op::New {
                mode,
                token,
                deadline,
                owner,
            } => self.replay_new(owner, mode, token, deadline, max_token)?,
            Op::Hold {
                token,
                mode,
                deadline,
            } => self.replay_hold(token, mode, deadline)?,
            Op::Release { token, mode } => self.replay_release(token, mode)?,
            Op::Renew { token, deadline } => {
                let h = self.by_token(token).ok_or(bad)?;
                if deadline < 0 {
                    return Err(bad);
                }
                let before = Undo::counts(h);
                self.modify(token, |h| h.deadline = deadline);
                before
            }
            Op::End { token } => Undo::Restore(self.remove(token).ok_or(bad)?),
            Op::Whole {
                token,
                deadline,
                reads,
                writes,
                owner,
            } => {
                let holder = Holder {
                    owner: owner.into(),
                    token,
                    deadline,
                    reads,
                    writes,
                };
                self.replay_whole_holder(holder, max_token)?
            }
            Op::Lock { encoded } => self.replay_lock(encoded, max_token)?,
            Op::Force => {
                if self.is_free() {
                    return Err(bad);
                }
                Undo::Holders(std::mem::replace(&mut self.holders, Holders::Empty))
            }
            Op::Limit { limit } => {
                if self.kind != Kind::Semaphore || limit == 0 {
                    return Err(bad);
                }
                let before = Undo::Limit(self.limit);
                self.limit = limit;
                before
            }
        })
    }

    /// One hold (or the whole holding, with its last hold) given back.
    fn replay_release(&mut self, token: u64, mode: Mode) -> Result<Undo, &'static str> {
        let bad = err::INVALID_DELTA;
        let h = self.by_token(token).ok_or(bad)?;
        if !self.mode_allowed(mode) || h.holds(mode) < mode.amount() {
            return Err(bad);
        }
        Ok(if h.reads + h.writes == mode.amount() {
            Undo::Restore(self.remove(token).expect("present"))
        } else {
            let before = Undo::counts(h);
            self.drop_hold(token, mode);
            before
        })
    }

    /// A whole holder (an `S` step: how AOF rewrites wrote each holder before
    /// the `W` step), if it fits beside the others.
    fn replay_whole_holder(
        &mut self,
        holder: Holder,
        max_token: u64,
    ) -> Result<Undo, &'static str> {
        if !self.fits(&holder, max_token) {
            return Err(err::INVALID_DELTA);
        }
        let token = holder.token;
        self.insert(holder);
        Ok(Undo::Remove(token))
    }

    /// A whole lock in its RDB encoding, onto a free one of the same kind.
    fn replay_lock(&mut self, encoded: &[u8], max_token: u64) -> Result<Undo, &'static str> {
        let bad = err::INVALID_DELTA;
        let whole = match read_whole(encoded, Layout::V3, max_token).map_err(|_| bad)? {
            Whole::Packed(c) => c.unpack(),
            Whole::State(s) => s,
        };
        if !self.is_free() || whole.kind != self.kind {
            return Err(bad);
        }
        let before = Undo::Free { limit: self.limit };
        *self = whole;
        Ok(before)
    }

    /// A new holder as the master granted it: admitted here too, or refused.
    fn replay_new(
        &mut self,
        owner: &[u8],
        mode: Mode,
        token: u64,
        deadline: i64,
        max_token: u64,
    ) -> Result<Undo, &'static str> {
        let bad = err::INVALID_DELTA;
        // A replayed request is admitted under the state's limit.
        let mode = match mode {
            Mode::Permits { count, .. } => Mode::Permits {
                count,
                limit: self.limit,
            },
            m => m,
        };
        let fits = self.mode_allowed(mode)
            && !owner.is_empty()
            && (1..=max_token).contains(&token)
            && deadline >= 0
            && self.by_token(token).is_none()
            && self.holder(owner).is_none()
            && self.admit(owner, mode) == Admission::Fresh;
        if !fits {
            return Err(bad);
        }
        let mut off = Delta::off();
        self.grant(owner, mode, deadline, &mut || Some(token), &mut off)
            .map_err(|_| bad)?;
        Ok(Undo::Remove(token))
    }

    /// One more hold (reentry) of a holder, by its token; never an upgrade
    /// nor permits past the limit.
    fn replay_hold(&mut self, token: u64, mode: Mode, deadline: i64) -> Result<Undo, &'static str> {
        let bad = err::INVALID_DELTA;
        let h = self.by_token(token).ok_or(bad)?;
        let upgrade = self.kind == Kind::ReadWrite && mode == Mode::Write && h.writes == 0;
        let over_limit = self.used() + mode.amount() as u64 > self.limit as u64;
        let permits_over = matches!(mode, Mode::Permits { .. }) && over_limit;
        if !self.mode_allowed(mode) || deadline < 0 || upgrade || permits_over {
            return Err(bad);
        }
        let before = Undo::counts(h);
        self.add_hold(token, mode, deadline).map_err(|_| bad)?;
        Ok(before)
    }

    fn mode_allowed(&self, mode: Mode) -> bool {
        self.kind.allows(mode)
    }

    fn undo(&mut self, u: Undo) {
        match u {
            Undo::Remove(token) => {
                self.remove(token);
            }
            Undo::Restore(h) => self.insert(h),
            Undo::Counts {
                token,
                reads,
                writes,
                deadline,
            } => {
                self.modify(token, |h| {
                    h.reads = reads;
                    h.writes = writes;
                    h.deadline = deadline;
                });
            }
            Undo::Holders(all) => self.holders = all,
            Undo::Limit(limit) => self.limit = limit,
            Undo::Free { limit } => {
                self.holders = Holders::Empty;
                self.limit = limit;
            }
        }
    }
}

/// How to take back one replayed step.
enum Undo {
    Remove(u64),
    Restore(Holder),
    Counts {
        token: u64,
        reads: u32,
        writes: u32,
        deadline: i64,
    },
    Holders(Holders),
    Limit(u32),
    /// The state was free, with this limit.
    Free {
        limit: u32,
    },
}

impl Undo {
    fn counts(h: &Holder) -> Undo {
        Undo::Counts {
            token: h.token,
            reads: h.reads,
            writes: h.writes,
            deadline: h.deadline,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(start: u64) -> impl FnMut() -> Option<u64> {
        let mut next = start;
        move || {
            next += 1;
            Some(next)
        }
    }

    fn off() -> Delta {
        Delta::off()
    }

    #[test]
    fn a_one_holder_lock_with_a_short_owner_is_one_80_byte_block() {
        // jemalloc's size classes: 80 bytes rather than the 96 a separate
        // owner block or a wider state would take.
        assert_eq!(std::mem::size_of::<Holder>(), 72);
        assert!(std::mem::size_of::<LockState>() <= 80);
    }

    #[test]
    fn reentrant_grant_keeps_token_and_counts_holds() {
        let mut s = LockState::new(Kind::Reentrant);
        let mut issue = counter(10);
        let d = &mut off();
        assert_eq!(s.admit(b"a", Mode::Write), Admission::Fresh);
        assert_eq!(s.grant(b"a", Mode::Write, 100, &mut issue, d), Ok(11));
        assert_eq!(s.admit(b"a", Mode::Write), Admission::Reentrant);
        assert_eq!(s.grant(b"a", Mode::Write, 200, &mut issue, d), Ok(11));
        assert_eq!(s.holder(b"a").unwrap().writes, 2);
        assert_eq!(s.holder(b"a").unwrap().deadline, 200);
        assert_eq!(s.admit(b"b", Mode::Write), Admission::Busy);
        assert_eq!(s.release(b"a", Mode::Write, d), Ok((1, false)));
        assert_eq!(s.release(b"a", Mode::Write, d), Ok((0, true)));
        assert!(s.is_free());
        assert_eq!(s.release(b"a", Mode::Write, d), Err(Refused(err::NOTOWNER)));
    }

    #[test]
    fn grants_are_refused_rather_than_overflowing() {
        let mut s = LockState::new(Kind::Reentrant);
        let d = &mut off();
        assert_eq!(
            s.grant(b"a", Mode::Write, 1, &mut || None, d),
            Err(Refused(err::TOKENS_EXHAUSTED))
        );
        assert!(s.is_free());
        s.grant(b"a", Mode::Write, 1, &mut || Some(1), d).unwrap();
        s.modify(1, |h| h.writes = u32::MAX);
        assert_eq!(
            s.grant(b"a", Mode::Write, 2, &mut || Some(2), d),
            Err(Refused(err::HOLD_OVERFLOW))
        );
        assert_eq!(s.holder(b"a").unwrap().deadline, 1);
    }

    #[test]
    fn new_tenure_gets_new_token() {
        let mut s = LockState::new(Kind::Fair);
        let mut issue = counter(0);
        let d = &mut off();
        let t1 = s.grant(b"a", Mode::Write, 100, &mut issue, d).unwrap();
        s.release(b"a", Mode::Write, d).unwrap();
        let t2 = s.grant(b"a", Mode::Write, 100, &mut issue, d).unwrap();
        assert!(t2 > t1);
    }

    #[test]
    fn readers_share_writer_excludes() {
        let mut s = LockState::new(Kind::ReadWrite);
        let mut issue = counter(0);
        let d = &mut off();
        s.grant(b"r1", Mode::Read, 100, &mut issue, d).unwrap();
        assert_eq!(s.admit(b"r2", Mode::Read), Admission::Fresh);
        s.grant(b"r2", Mode::Read, 50, &mut issue, d).unwrap();
        assert!(s.is_indexed());
        assert_eq!(s.admit(b"w", Mode::Write), Admission::Busy);
        assert_eq!(s.admit(b"r1", Mode::Write), Admission::Upgrade);
        assert_eq!(s.release(b"r1", Mode::Read, d), Ok((0, true)));
        assert!(!s.is_indexed(), "back to inline with one holder");
        assert_eq!(s.release(b"r2", Mode::Read, d), Ok((0, true)));
        assert_eq!(s.admit(b"w", Mode::Write), Admission::Fresh);
        s.grant(b"w", Mode::Write, 100, &mut issue, d).unwrap();
        assert_eq!(s.admit(b"r1", Mode::Read), Admission::Busy);
        assert_eq!(s.admit(b"w", Mode::Read), Admission::Reentrant);
    }

    #[test]
    fn writer_downgrades_by_releasing_write() {
        let mut s = LockState::new(Kind::ReadWrite);
        let mut issue = counter(0);
        let d = &mut off();
        let t = s.grant(b"w", Mode::Write, 100, &mut issue, d).unwrap();
        assert_eq!(s.grant(b"w", Mode::Read, 100, &mut issue, d), Ok(t));
        assert_eq!(s.release(b"w", Mode::Write, d), Ok((0, false)));
        assert!(s.writer().is_none());
        assert_eq!(s.admit(b"r", Mode::Read), Admission::Fresh);
        assert_eq!(s.release(b"w", Mode::Write, d), Err(Refused(err::NOTOWNER)));
    }

    #[test]
    fn expiry_is_per_holder_and_strict() {
        let mut s = LockState::new(Kind::ReadWrite);
        let mut issue = counter(0);
        let d = &mut off();
        s.grant(b"r1", Mode::Read, 100, &mut issue, d).unwrap();
        s.grant(b"r2", Mode::Read, 200, &mut issue, d).unwrap();
        assert_eq!(
            s.expire(100, d),
            0,
            "valid through its deadline millisecond"
        );
        assert_eq!(s.expire(101, d), 1);
        assert_eq!(s.iter().next().unwrap().owner.as_ref(), b"r2");
        assert_eq!(s.earliest_deadline(), Some(200));
        assert_eq!(s.renew(b"r2", 300, d), Ok(()));
        assert_eq!(s.latest_deadline(), Some(300));
        assert_eq!(s.renew(b"r1", 300, d), Err(NotOwner));
        assert_eq!(s.force(d), 1);
        assert!(s.is_free());
    }

    #[test]
    fn many_holders_keep_deadline_order() {
        let mut s = LockState::new(Kind::ReadWrite);
        let mut issue = counter(0);
        let d = &mut off();
        for i in 0..1000i64 {
            let owner = format!("r{i}");
            s.grant(owner.as_bytes(), Mode::Read, 10_000 - i, &mut issue, d)
                .unwrap();
        }
        assert_eq!(s.earliest_deadline(), Some(9001));
        assert_eq!(s.latest_deadline(), Some(10_000));
        s.renew(b"r999", 20_000, d).unwrap();
        assert_eq!(s.earliest_deadline(), Some(9002));
        assert_eq!(s.latest_deadline(), Some(20_000));
        assert_eq!(s.expire(9500, d), 498);
        assert_eq!(s.holder_count(), 502);
        assert!(s.holder(b"r0").is_some() && s.holder(b"r998").is_none());
    }

    fn holder(owner: &str, token: u64, reads: u32, writes: u32) -> Holder {
        Holder {
            owner: owner.as_bytes().into(),
            token,
            deadline: 100,
            reads,
            writes,
        }
    }

    #[test]
    fn loaders_get_the_commands_rules() {
        let ok = LockState::from_holders(
            Kind::ReadWrite,
            [holder("a", 1, 1, 0), holder("b", 2, 2, 0)],
            10,
        )
        .unwrap();
        assert_eq!(ok.holder_count(), 2);
        let bad: Vec<(Kind, Vec<Holder>)> = vec![
            (Kind::Reentrant, vec![]),
            (
                Kind::Reentrant,
                vec![holder("a", 1, 0, 1), holder("b", 2, 0, 1)],
            ),
            (Kind::Reentrant, vec![holder("a", 1, 1, 0)]),
            (Kind::Fair, vec![holder("a", 1, 0, 0)]),
            (Kind::Fair, vec![holder("", 1, 0, 1)]),
            (Kind::Fair, vec![holder("a", 0, 0, 1)]),
            (Kind::Fair, vec![holder("a", 11, 0, 1)]),
            (
                Kind::ReadWrite,
                vec![holder("a", 1, 1, 0), holder("a", 2, 1, 0)],
            ),
            (
                Kind::ReadWrite,
                vec![holder("a", 1, 1, 0), holder("b", 1, 1, 0)],
            ),
            (
                Kind::ReadWrite,
                vec![holder("a", 1, 1, 0), holder("b", 2, 0, 1)],
            ),
            (
                Kind::ReadWrite,
                vec![holder("a", 1, 0, 1), holder("b", 2, 1, 0)],
            ),
            (
                Kind::ReadWrite,
                vec![Holder {
                    deadline: -1,
                    ..holder("a", 1, 1, 0)
                }],
            ),
        ];
        for (kind, holders) in bad {
            let shown = format!("{kind:?} {holders:?}");
            assert!(
                LockState::from_holders(kind, holders, 10).is_err(),
                "{shown}"
            );
        }
    }
}
