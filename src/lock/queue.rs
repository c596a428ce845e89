//! The FIFO of clients parked on one lock key. Ids grow with arrival, so the
//! map's order is arrival order and a departure anywhere costs O(log n).

use std::collections::BTreeMap;

use super::{err, Admission, Delta, Kind, LockState, Mode};

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiter {
    pub id: u64,
    pub owner: Vec<u8>,
    pub mode: Mode,
    pub lease_ms: i64,
}

/// What serving the queue decided for one waiter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    Granted {
        id: u64,
        token: u64,
    },
    /// Answered with an error instead: its owner came to hold READ while it
    /// waited for WRITE (an upgrade), or the grant itself was refused.
    Refused {
        id: u64,
        error: &'static str,
    },
}

#[derive(Debug)]
pub struct WaitQueue {
    kind: Kind,
    entries: BTreeMap<u64, Waiter>,
}

impl WaitQueue {
    pub fn new(kind: Kind) -> Self {
        WaitQueue {
            kind,
            entries: BTreeMap::new(),
        }
    }

    pub fn kind(&self) -> Kind {
        self.kind
    }

    pub fn push(&mut self, waiter: Waiter) {
        self.entries.insert(waiter.id, waiter);
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

    pub fn waiters(&self) -> impl Iterator<Item = &Waiter> {
        self.entries.values()
    }

    /// Hands the lock to waiters in arrival order for as long as the head is
    /// compatible with the holders. Nobody overtakes an incompatible head, so a
    /// queued writer stops later readers; a run of readers at the head enters together.
    pub fn serve(
        &mut self,
        lock: &mut LockState,
        now: i64,
        issue: &mut dyn FnMut() -> Option<u64>,
        delta: &mut Delta,
    ) -> Vec<Served> {
        let mut served = Vec::new();
        while let Some(entry) = self.entries.first_entry() {
            let head = entry.get();
            let outcome = match lock.admit(&head.owner, head.mode) {
                Admission::Busy => break,
                Admission::Upgrade => Served::Refused {
                    id: head.id,
                    error: err::UPGRADE,
                },
                Admission::Fresh | Admission::Reentrant => {
                    let deadline = now.saturating_add(head.lease_ms);
                    match lock.grant(&head.owner, head.mode, deadline, issue, delta) {
                        Ok(token) => Served::Granted { id: head.id, token },
                        Err(refused) => Served::Refused {
                            id: head.id,
                            error: refused.0,
                        },
                    }
                }
            };
            served.push(outcome);
            entry.remove();
        }
        served
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(id: u64, owner: &str, mode: Mode) -> Waiter {
        Waiter {
            id,
            owner: owner.as_bytes().to_vec(),
            mode,
            lease_ms: 1000,
        }
    }

    fn ids(served: &[Served]) -> Vec<u64> {
        served
            .iter()
            .map(|s| match s {
                Served::Granted { id, .. } | Served::Refused { id, .. } => *id,
            })
            .collect()
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
}
