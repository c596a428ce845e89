//! Who holds a lock, in which mode, until when, and with which fencing token.

use super::{Kind, Mode};

/// One owner's tenure on a lock. The token is fixed for the whole tenure; the
/// deadline is per holder, so one reader's lease never moves another's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub owner: Vec<u8>,
    pub reads: u64,
    pub writes: u64,
    pub token: u64,
    /// Last unix millisecond at which the hold is valid (expired once `now > deadline`,
    /// the same rule Redis applies to key TTLs).
    pub deadline: i64,
}

impl Holder {
    pub fn holds(&self, mode: Mode) -> u64 {
        match mode {
            Mode::Read => self.reads,
            Mode::Write => self.writes,
        }
    }

    fn holds_mut(&mut self, mode: Mode) -> &mut u64 {
        match mode {
            Mode::Read => &mut self.reads,
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

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LockState {
    pub kind: Kind,
    pub holders: Vec<Holder>,
}

impl LockState {
    pub fn new(kind: Kind) -> Self {
        LockState {
            kind,
            holders: Vec::new(),
        }
    }

    pub fn is_free(&self) -> bool {
        self.holders.is_empty()
    }

    pub fn holder(&self, owner: &[u8]) -> Option<&Holder> {
        self.holders.iter().find(|h| h.owner == owner)
    }

    fn position(&self, owner: &[u8]) -> Option<usize> {
        self.holders.iter().position(|h| h.owner == owner)
    }

    /// The holder with WRITE holds, if any.
    pub fn writer(&self) -> Option<&Holder> {
        self.holders.iter().find(|h| h.writes > 0)
    }

    pub fn admit(&self, owner: &[u8], mode: Mode) -> Admission {
        if let Some(h) = self.holder(owner) {
            return match (self.kind, mode) {
                (Kind::ReadWrite, Mode::Write) if h.writes == 0 => Admission::Upgrade,
                _ => Admission::Reentrant,
            };
        }
        let compatible = match mode {
            Mode::Write => self.holders.is_empty(),
            Mode::Read => self.writer().is_none(),
        };
        if compatible {
            Admission::Fresh
        } else {
            Admission::Busy
        }
    }

    /// Adds one hold of `mode` for `owner` and resets its lease to `deadline`.
    /// A new holder takes a fresh token from `issue`; an existing one keeps its own.
    pub fn grant(
        &mut self,
        owner: &[u8],
        mode: Mode,
        deadline: i64,
        issue: &mut dyn FnMut() -> u64,
    ) -> u64 {
        let holder = match self.position(owner) {
            Some(i) => &mut self.holders[i],
            None => {
                // Most locks have one holder: a first push would reserve four.
                if self.holders.is_empty() {
                    self.holders.reserve_exact(1);
                }
                self.holders.push(Holder {
                    owner: owner.to_vec(),
                    reads: 0,
                    writes: 0,
                    token: issue(),
                    deadline,
                });
                self.holders.last_mut().expect("just pushed")
            }
        };
        *holder.holds_mut(mode) += 1;
        holder.deadline = deadline;
        holder.token
    }

    /// Drops one hold of `mode`. Returns the owner's remaining holds of that mode
    /// and whether the owner's tenure ended (no holds of any mode left).
    pub fn release(&mut self, owner: &[u8], mode: Mode) -> Result<(u64, bool), NotOwner> {
        let i = self.position(owner).ok_or(NotOwner)?;
        let holder = &mut self.holders[i];
        let count = holder.holds_mut(mode);
        if *count == 0 {
            return Err(NotOwner);
        }
        *count -= 1;
        let remaining = *count;
        let ended = holder.reads == 0 && holder.writes == 0;
        if ended {
            self.holders.remove(i);
        }
        Ok((remaining, ended))
    }

    pub fn renew(&mut self, owner: &[u8], deadline: i64) -> Result<(), NotOwner> {
        let i = self.position(owner).ok_or(NotOwner)?;
        self.holders[i].deadline = deadline;
        Ok(())
    }

    /// Ends every hold; returns how many holders there were.
    pub fn force(&mut self) -> usize {
        std::mem::take(&mut self.holders).len()
    }

    /// Ends the holds whose lease ran out before `now`; returns how many.
    pub fn expire(&mut self, now: i64) -> usize {
        let before = self.holders.len();
        self.holders.retain(|h| h.deadline >= now);
        before - self.holders.len()
    }

    pub fn earliest_deadline(&self) -> Option<i64> {
        self.holders.iter().map(|h| h.deadline).min()
    }

    pub fn latest_deadline(&self) -> Option<i64> {
        self.holders.iter().map(|h| h.deadline).max()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counter(start: u64) -> impl FnMut() -> u64 {
        let mut next = start;
        move || {
            next += 1;
            next
        }
    }

    #[test]
    fn reentrant_grant_keeps_token_and_counts_holds() {
        let mut s = LockState::new(Kind::Reentrant);
        let mut issue = counter(10);
        assert_eq!(s.admit(b"a", Mode::Write), Admission::Fresh);
        assert_eq!(s.grant(b"a", Mode::Write, 100, &mut issue), 11);
        assert_eq!(s.admit(b"a", Mode::Write), Admission::Reentrant);
        assert_eq!(s.grant(b"a", Mode::Write, 200, &mut issue), 11);
        assert_eq!(s.holders[0].writes, 2);
        assert_eq!(s.holders[0].deadline, 200);
        assert_eq!(s.admit(b"b", Mode::Write), Admission::Busy);
        assert_eq!(s.release(b"a", Mode::Write), Ok((1, false)));
        assert_eq!(s.release(b"a", Mode::Write), Ok((0, true)));
        assert!(s.is_free());
        assert_eq!(s.release(b"a", Mode::Write), Err(NotOwner));
    }

    #[test]
    fn a_single_holder_takes_room_for_one() {
        let mut s = LockState::new(Kind::Reentrant);
        s.grant(b"a", Mode::Write, 1, &mut || 1);
        assert_eq!(s.holders.capacity(), 1);
    }

    #[test]
    fn new_tenure_gets_new_token() {
        let mut s = LockState::new(Kind::Fair);
        let mut issue = counter(0);
        let t1 = s.grant(b"a", Mode::Write, 100, &mut issue);
        s.release(b"a", Mode::Write).unwrap();
        let t2 = s.grant(b"a", Mode::Write, 100, &mut issue);
        assert!(t2 > t1);
    }

    #[test]
    fn readers_share_writer_excludes() {
        let mut s = LockState::new(Kind::ReadWrite);
        let mut issue = counter(0);
        s.grant(b"r1", Mode::Read, 100, &mut issue);
        assert_eq!(s.admit(b"r2", Mode::Read), Admission::Fresh);
        s.grant(b"r2", Mode::Read, 50, &mut issue);
        assert_eq!(s.admit(b"w", Mode::Write), Admission::Busy);
        assert_eq!(s.admit(b"r1", Mode::Write), Admission::Upgrade);
        assert_eq!(s.release(b"r1", Mode::Read), Ok((0, true)));
        assert_eq!(s.release(b"r2", Mode::Read), Ok((0, true)));
        assert_eq!(s.admit(b"w", Mode::Write), Admission::Fresh);
        s.grant(b"w", Mode::Write, 100, &mut issue);
        assert_eq!(s.admit(b"r1", Mode::Read), Admission::Busy);
        assert_eq!(s.admit(b"w", Mode::Read), Admission::Reentrant);
    }

    #[test]
    fn writer_downgrades_by_releasing_write() {
        let mut s = LockState::new(Kind::ReadWrite);
        let mut issue = counter(0);
        let t = s.grant(b"w", Mode::Write, 100, &mut issue);
        assert_eq!(s.grant(b"w", Mode::Read, 100, &mut issue), t);
        assert_eq!(s.release(b"w", Mode::Write), Ok((0, false)));
        assert!(s.writer().is_none());
        assert_eq!(s.admit(b"r", Mode::Read), Admission::Fresh);
        assert_eq!(s.release(b"w", Mode::Write), Err(NotOwner));
    }

    #[test]
    fn expiry_is_per_holder_and_strict() {
        let mut s = LockState::new(Kind::ReadWrite);
        let mut issue = counter(0);
        s.grant(b"r1", Mode::Read, 100, &mut issue);
        s.grant(b"r2", Mode::Read, 200, &mut issue);
        assert_eq!(s.expire(100), 0, "valid through its deadline millisecond");
        assert_eq!(s.expire(101), 1);
        assert_eq!(s.holders[0].owner, b"r2");
        assert_eq!(s.earliest_deadline(), Some(200));
        assert_eq!(s.renew(b"r2", 300), Ok(()));
        assert_eq!(s.latest_deadline(), Some(300));
        assert_eq!(s.renew(b"r1", 300), Err(NotOwner));
        assert_eq!(s.force(), 1);
        assert!(s.is_free());
    }
}
