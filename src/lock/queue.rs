//! The FIFO of clients parked on one lock key. Ids grow with arrival, so the
//! map's order is arrival order and a departure anywhere costs O(log n).

use std::collections::BTreeMap;

use super::{err, Admission, Delta, Kind, LockState, Mode, Owner};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub id: u64,
    /// Inline for the usual owner: serving reads it when the waiter's turn
    /// comes, long after it parked, and a separate block would be cold.
    pub owner: Owner,
    pub mode: Mode,
    pub lease_ms: i64,
    /// Absolute unix ms of the end of its BLOCK time (0: waits forever). Past
    /// it the waiter is never granted, even if nobody has answered it yet.
    pub deadline: i64,
    /// Waits for several keys at once (`RLOCK.ACQUIREALL`): queued on each of
    /// them, granted all of them in one step by the engine, never by one
    /// queue. While first in a queue it reserves that key.
    pub multi: bool,
}

impl Waiter {
    /// Whether its BLOCK time has run out at `now` (a timeout is due once the
    /// deadline millisecond is over, as Redis times out blocked clients).
    pub fn timed_out(&self, now: i64) -> bool {
        self.deadline != 0 && self.deadline < now
    }
}

/// What serving the queue decided for one waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    Granted {
        id: u64,
        token: u64,
        /// The lease it asked for (a holding it already had is renewed to it).
        lease_ms: i64,
    },
    /// Answered with an error instead: its owner came to hold READ while it
    /// waited for WRITE (an upgrade), or the grant itself was refused.
    Refused { id: u64, error: &'static str },
    /// Its BLOCK time ran out before it could be served (the server was busy
    /// or frozen): it is answered as a timeout, never granted.
    TimedOut { id: u64 },
}

#[derive(Debug)]
pub struct WaitQueue {
    kind: Kind,
    entries: BTreeMap<u64, Waiter>,
    /// A semaphore's limit in force while its key is gone and its waiters
    /// are not (the last holding ended, none of them fits): the latest
    /// ACQUIRE's, which a new semaphore made for them takes (0: none kept).
    limit: u32,
}

impl WaitQueue {
    pub fn new(kind: Kind) -> Self {
        WaitQueue {
            kind,
            entries: BTreeMap::new(),
            limit: 0,
        }
    }

    /// Keeps a semaphore's limit in force for when its key is gone.
    pub fn keep_limit(&mut self, limit: u32) {
        self.limit = limit;
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn push(&mut self, waiter: Waiter) {
        self.entries.insert(waiter.id, waiter);
    }

    /// Sets the BLOCK deadline of a queued waiter (known once it is parked).
    pub fn set_deadline(&mut self, id: u64, deadline: i64) {
        if let Some(w) = self.entries.get_mut(&id) {
            w.deadline = deadline;
        }
    }

    /// Drops the waiters at the head whose BLOCK time ran out at `now`.
    pub fn drop_timed_out(&mut self, now: i64) -> Vec<Served> {
        let mut out = Vec::new();
        while let Some(entry) = self.entries.first_entry() {
            if !entry.get().timed_out(now) {
                break;
            }
            out.push(Served::TimedOut {
                id: entry.remove().id,
            });
        }
        out
    }

    /// Whether serving now would hand the lock to (or answer) the head.
    pub fn head_admissible(&self, lock: &LockState) -> bool {
        self.kind == lock.kind()
            && self.head().is_some_and(|h| {
                !h.multi && !matches!(lock.admit(&h.owner, h.mode), Admission::Busy)
            })
    }

    pub fn head(&self) -> Option<&Waiter> {
        self.entries.values().next()
    }

    /// The head if it is a multi-key waiter this key could be granted to now
    /// (its other keys are the engine's business).
    pub fn multi_head_ready(&self, lock: &LockState, now: i64) -> Option<u64> {
        let h = self
            .head()
            .filter(|h| h.multi && !h.timed_out(now) && self.kind == lock.kind())?;
        matches!(
            lock.admit(&h.owner, h.mode),
            Admission::Fresh | Admission::Reentrant
        )
        .then_some(h.id)
    }

    pub fn get(&self, id: u64) -> Option<&Waiter> {
        self.entries.get(&id)
    }

    pub fn remove(&mut self, id: u64) -> Option<Waiter> {
        self.entries.remove(&id)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn head_id(&self) -> Option<u64> {
        self.entries.keys().next().copied()
    }

    /// The waiters ahead of `id`, nearest first: the first is the one it
    /// directly waits for (deadlock detection).
    pub fn waiters_ahead_of(&self, id: u64) -> impl Iterator<Item = &Waiter> {
        self.entries.range(..id).rev().map(|(_, w)| w)
    }

    pub fn waiters(&self) -> impl Iterator<Item = &Waiter> {
        self.entries.values()
    }

    /// Hands the lock to waiters in arrival order for as long as the head is
    /// compatible with the holders. Nobody overtakes an incompatible head, so a
    /// queued writer stops later readers; a run of readers at the head enters together.
    /// A head whose BLOCK time ran out is dropped (`TimedOut`), never granted.
    /// A lock of another family than the waiters' (their key was overwritten
    /// with it) is never theirs: they are all refused, WRONGTYPE.
    pub fn serve(
        &mut self,
        lock: &mut LockState,
        now: i64,
        issue: &mut dyn FnMut() -> Option<u64>,
        delta: &mut Delta,
    ) -> Vec<Served> {
        if lock.kind() != self.kind {
            return self.refuse_all(err::WRONGTYPE);
        }
        let mut served = Vec::new();
        let kept = self.limit;
        while let Some(entry) = self.entries.first_entry() {
            let head = entry.get();
            let outcome = if head.timed_out(now) {
                Served::TimedOut { id: head.id }
            } else if head.multi {
                // Reserved for a multi-key waiter: see `multi_head_ready`.
                break;
            } else {
                let mode = admitted_mode(kept, lock, head.mode);
                match lock.admit(&head.owner, mode) {
                    Admission::Busy => break,
                    Admission::Upgrade => Served::Refused {
                        id: head.id,
                        error: err::UPGRADE,
                    },
                    Admission::Fresh | Admission::Reentrant => {
                        let deadline = now.saturating_add(head.lease_ms);
                        match lock.grant(&head.owner, mode, deadline, issue, delta) {
                            Ok(token) => Served::Granted {
                                id: head.id,
                                token,
                                lease_ms: head.lease_ms,
                            },
                            Err(refused) => Served::Refused {
                                id: head.id,
                                error: refused.0,
                            },
                        }
                    }
                }
            };
            served.push(outcome);
            entry.remove();
        }
        served
    }

    fn refuse_all(&mut self, error: &'static str) -> Vec<Served> {
        std::mem::take(&mut self.entries)
            .into_keys()
            .map(|id| Served::Refused { id, error })
            .collect()
    }
}

/// The mode a waiter is admitted with: on a semaphore with no limit (its key
/// gone) the limit `kept` for it, not the one the waiter asked with.
fn admitted_mode(kept: u32, lock: &LockState, mode: Mode) -> Mode {
    match mode {
        Mode::Permits { count, .. } if lock.limit() == 0 && kept > 0 => {
            Mode::Permits { count, limit: kept }
        }
        mode => mode,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(id: u64, owner: &str, mode: Mode) -> Waiter {
        Waiter {
            id,
            owner: Owner::new(owner.as_bytes()),
            mode,
            lease_ms: 1000,
            deadline: 0,
            multi: false,
        }
    }

    fn ids(served: &[Served]) -> Vec<u64> {
        served
            .iter()
            .map(|s| match s {
                Served::Granted { id, .. }
                | Served::Refused { id, .. }
                | Served::TimedOut { id } => *id,
            })
            .collect()
    }

    #[test]
    fn the_waiter_ahead_is_the_previous_arrival_still_queued() {
        let mut q = WaitQueue::new(Kind::Reentrant);
        for (id, owner) in [(3, "a"), (5, "b"), (9, "c")] {
            q.push(waiter(id, owner, Mode::Write));
        }
        let ahead = |q: &WaitQueue, id| q.waiters_ahead_of(id).map(|w| w.id).collect::<Vec<_>>();
        assert!(ahead(&q, 3).is_empty());
        assert_eq!(ahead(&q, 9), [5, 3]);
        q.remove(5);
        assert_eq!(
            q.waiters_ahead_of(9).next().map(|w| &*w.owner),
            Some(&b"a"[..])
        );
    }

    #[test]
    fn exclusive_lock_serves_one_waiter_per_release() {
        let mut lock = LockState::new(Kind::Fair);
        let mut q = WaitQueue::new(Kind::Fair);
        let mut next = 0;
        let mut issue = || {
            next += 1;
            Some(next)
        };
        lock.grant(b"holder", Mode::Write, 10, &mut issue, &mut Delta::off())
            .unwrap();
        for (id, o) in [(1, "a"), (2, "b"), (3, "c")] {
            q.push(waiter(id, o, Mode::Write));
        }
        assert!(q
            .serve(&mut lock, 5, &mut issue, &mut Delta::off())
            .is_empty());
        lock.release(b"holder", Mode::Write, &mut Delta::off())
            .unwrap();
        let served = q.serve(&mut lock, 5, &mut issue, &mut Delta::off());
        assert_eq!(ids(&served), vec![1]);
        assert_eq!(lock.holder(b"a").unwrap().deadline, 1005);
        q.remove(2);
        lock.release(b"a", Mode::Write, &mut Delta::off()).unwrap();
        assert_eq!(
            ids(&q.serve(&mut lock, 6, &mut issue, &mut Delta::off())),
            vec![3]
        );
        assert!(q.is_empty());
    }

    #[test]
    fn reader_run_enters_together_and_stops_at_writer() {
        let mut lock = LockState::new(Kind::ReadWrite);
        let mut q = WaitQueue::new(Kind::ReadWrite);
        let mut next = 0;
        let mut issue = || {
            next += 1;
            Some(next)
        };
        lock.grant(b"w0", Mode::Write, 10, &mut issue, &mut Delta::off())
            .unwrap();
        q.push(waiter(1, "r1", Mode::Read));
        q.push(waiter(2, "r2", Mode::Read));
        q.push(waiter(3, "w1", Mode::Write));
        q.push(waiter(4, "r3", Mode::Read));
        lock.release(b"w0", Mode::Write, &mut Delta::off()).unwrap();
        assert_eq!(
            ids(&q.serve(&mut lock, 0, &mut issue, &mut Delta::off())),
            vec![1, 2]
        );
        assert_eq!(q.head_id(), Some(3));
        lock.release(b"r1", Mode::Read, &mut Delta::off()).unwrap();
        assert!(q
            .serve(&mut lock, 0, &mut issue, &mut Delta::off())
            .is_empty());
        lock.release(b"r2", Mode::Read, &mut Delta::off()).unwrap();
        assert_eq!(
            ids(&q.serve(&mut lock, 0, &mut issue, &mut Delta::off())),
            vec![3]
        );
        lock.release(b"w1", Mode::Write, &mut Delta::off()).unwrap();
        assert_eq!(
            ids(&q.serve(&mut lock, 0, &mut issue, &mut Delta::off())),
            vec![4]
        );
    }

    #[test]
    fn queued_upgrade_is_refused_not_granted() {
        let mut lock = LockState::new(Kind::ReadWrite);
        let mut q = WaitQueue::new(Kind::ReadWrite);
        let mut issue = || Some(1);
        lock.grant(b"a", Mode::Read, 10, &mut issue, &mut Delta::off())
            .unwrap();
        q.push(waiter(1, "a", Mode::Write));
        q.push(waiter(2, "b", Mode::Read));
        let served = q.serve(&mut lock, 0, &mut issue, &mut Delta::off());
        assert_eq!(
            served[0],
            Served::Refused {
                id: 1,
                error: err::UPGRADE
            }
        );
        assert!(matches!(served[1], Served::Granted { id: 2, .. }));
    }

    #[test]
    fn waiter_past_its_block_deadline_is_never_granted() {
        let mut lock = LockState::new(Kind::Reentrant);
        let mut q = WaitQueue::new(Kind::Reentrant);
        let mut next = 0;
        let mut issue = || {
            next += 1;
            Some(next)
        };
        lock.grant(b"holder", Mode::Write, 10, &mut issue, &mut Delta::off())
            .unwrap();
        // a's BLOCK ran out at 100; b's at 300; c waits forever.
        for (id, o, deadline) in [(1, "a", 100), (2, "b", 300), (3, "c", 0)] {
            let mut w = waiter(id, o, Mode::Write);
            w.deadline = deadline;
            q.push(w);
        }
        lock.release(b"holder", Mode::Write, &mut Delta::off())
            .unwrap();
        // The server catches up at 200 (frozen meanwhile): a is past its
        // deadline and is answered as a timeout; b, still in time, gets the lock.
        let served = q.serve(&mut lock, 200, &mut issue, &mut Delta::off());
        assert_eq!(served[0], Served::TimedOut { id: 1 });
        assert!(matches!(served[1], Served::Granted { id: 2, .. }));
        assert_eq!(served.len(), 2);
        assert!(lock.holder(b"b").is_some());
        // Its deadline millisecond itself still counts as in time.
        let mut w = waiter(4, "d", Mode::Write);
        w.deadline = 500;
        q.push(w);
        lock.release(b"b", Mode::Write, &mut Delta::off()).unwrap();
        assert!(matches!(
            q.serve(&mut lock, 200, &mut issue, &mut Delta::off())[0],
            Served::Granted { id: 3, .. }
        ));
        lock.release(b"c", Mode::Write, &mut Delta::off()).unwrap();
        assert!(matches!(
            q.serve(&mut lock, 500, &mut issue, &mut Delta::off())[0],
            Served::Granted { id: 4, .. }
        ));
        // Frozen past everybody's deadline: nobody is granted, the lock stays free.
        let mut w = waiter(5, "e", Mode::Write);
        w.deadline = 600;
        q.push(w);
        lock.release(b"d", Mode::Write, &mut Delta::off()).unwrap();
        assert_eq!(
            q.serve(&mut lock, 601, &mut issue, &mut Delta::off()),
            vec![Served::TimedOut { id: 5 }]
        );
        assert!(lock.is_free());
        assert!(q.is_empty());
    }

    #[test]
    fn waiters_let_in_by_the_last_release_get_the_limit_in_force() {
        let permits = |count, limit| Mode::Permits { count, limit };
        let mut lock = LockState::new(Kind::Semaphore);
        let mut q = WaitQueue::new(Kind::Semaphore);
        let mut next = 0;
        let mut issue = || {
            next += 1;
            Some(next)
        };
        let d = &mut Delta::off();
        lock.grant(b"a", permits(3, 3), 10, &mut issue, d).unwrap();
        for (id, o) in [(1, "w1"), (2, "w2"), (3, "w3")] {
            q.push(waiter(id, o, permits(1, 3)));
        }
        // The latest ACQUIRE lowered the limit to 1; then `a` returns all.
        lock.set_limit(1, d);
        lock.release(b"a", permits(3, 3), d).unwrap();
        assert!(lock.is_free());
        let served = q.serve(&mut lock, 5, &mut issue, d);
        assert_eq!(ids(&served), vec![1], "one permit under the limit in force");
        assert_eq!((lock.limit(), lock.used()), (1, 1));
        // A new semaphore takes its first grant's limit.
        let mut fresh = LockState::new(Kind::Semaphore);
        assert_eq!(fresh.admit(b"x", permits(2, 2)), Admission::Fresh);
        fresh.grant(b"x", permits(2, 2), 10, &mut issue, d).unwrap();
        assert_eq!(fresh.limit(), 2);
        // Its key gone with waiters left, the queue keeps the limit in force:
        // a new semaphore made for them takes it, not theirs.
        let mut remade = LockState::new(Kind::Semaphore);
        q.keep_limit(1);
        let served = q.serve(&mut remade, 6, &mut issue, d);
        assert_eq!(ids(&served), vec![2], "one permit under the limit kept");
        assert_eq!((remade.limit(), remade.used()), (1, 1));
    }

    #[test]
    fn waiters_are_refused_a_lock_of_another_family() {
        let mut lock = LockState::new(Kind::Fair);
        let mut q = WaitQueue::new(Kind::Reentrant);
        let mut issue = || Some(1);
        q.push(waiter(1, "a", Mode::Write));
        q.push(Waiter {
            multi: true,
            ..waiter(2, "b", Mode::Write)
        });
        assert!(!q.head_admissible(&lock));
        assert_eq!(q.multi_head_ready(&lock, 0), None);
        let served = q.serve(&mut lock, 0, &mut issue, &mut Delta::off());
        assert_eq!(
            served,
            vec![
                Served::Refused {
                    id: 1,
                    error: err::WRONGTYPE
                },
                Served::Refused {
                    id: 2,
                    error: err::WRONGTYPE
                }
            ]
        );
        assert!(q.is_empty());
        assert!(lock.is_free());
    }

    #[test]
    fn a_multi_key_waiter_first_in_line_reserves_the_key() {
        let mut lock = LockState::new(Kind::Reentrant);
        let mut q = WaitQueue::new(Kind::Reentrant);
        let mut next = 0;
        let mut issue = || {
            next += 1;
            Some(next)
        };
        q.push(Waiter {
            multi: true,
            ..waiter(1, "all", Mode::Write)
        });
        q.push(waiter(2, "one", Mode::Write));
        // Free, but nobody behind the multi-key waiter is served...
        assert!(q
            .serve(&mut lock, 5, &mut issue, &mut Delta::off())
            .is_empty());
        assert!(lock.is_free());
        assert!(!q.head_admissible(&lock));
        // ...and the queue reports it ready for the engine.
        assert_eq!(q.multi_head_ready(&lock, 5), Some(1));
        lock.grant(b"other", Mode::Write, 10, &mut issue, &mut Delta::off())
            .unwrap();
        assert_eq!(q.multi_head_ready(&lock, 5), None);
        // Its owner's own hold does not stop it (reentrant).
        let mut own = LockState::new(Kind::Reentrant);
        own.grant(b"all", Mode::Write, 10, &mut issue, &mut Delta::off())
            .unwrap();
        assert_eq!(q.multi_head_ready(&own, 5), Some(1));
        // Past its BLOCK time it is dropped like any waiter, and the next is served.
        q.set_deadline(1, 4);
        assert_eq!(
            q.multi_head_ready(&LockState::new(Kind::Reentrant), 5),
            None
        );
        let served = q.serve(
            &mut LockState::new(Kind::Reentrant),
            5,
            &mut issue,
            &mut Delta::off(),
        );
        assert_eq!(ids(&served), vec![1, 2]);
        assert!(matches!(served[0], Served::TimedOut { id: 1 }));
        assert!(matches!(served[1], Served::Granted { id: 2, .. }));
    }
}
