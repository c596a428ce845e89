//! The replicated effect of one change: the steps it made to single holders,
//! in a compact binary form (`RLOCK.DELTA key <delta>`).
//!
//! A step names its holder by the tenure's token, so a release, a renewal or an
//! expiry costs a few bytes whatever the owner's length or the number of other
//! holders; only a new holder carries its owner. Deadlines and tokens are
//! absolute, so a replica or an AOF replay makes exactly the master's change.
//!
//! Layout: `VERSION kind step...`, integers little-endian; `mode` is `r`, `w`,
//! or `p count:u32` (a semaphore's permits, one hold counting `count`):
//! - `N mode token:u64 deadline:i64 len:u32 owner` a new holder with one hold;
//! - `H mode token deadline` one more hold, lease reset;
//! - `R mode token` one hold released (the holder leaves at none);
//! - `L limit:u32` a semaphore's limit put in force;
//! - `D token deadline` lease renewed;
//! - `E token` the holder's lease ended;
//! - `F` every holder ended (forced);
//! - `S token deadline reads:u32 writes:u32 len:u32 owner` a holder as it stands
//!   (AOF rewrites before the `W` step wrote a whole lock as `S` steps on an
//!   empty key; still read);
//! - `W lock` the whole lock in its RDB form (`encoding`, current layout), the
//!   rest of the delta: how AOF rewrite writes a lock, onto an empty key only.

use std::cell::Cell;

use super::{Kind, Mode};

const VERSION: u8 = 1;

/// The command that applies a delta on a replica or from the AOF.
pub const COMMAND: &std::ffi::CStr = c"RLOCK.DELTA";

/// The command that applies several changes' deltas in turn, `key delta` for
/// each: the renewals a timer tick makes in one database.
pub const BATCH_COMMAND: &std::ffi::CStr = c"RLOCK.DELTAS";

/// Buffers larger than this are not kept for the next change.
const SPARE_LIMIT: usize = 4096;

thread_local! {
    /// The last change's buffer, reused: most commands record one small delta,
    /// and an allocation per command shows on the acquire path.
    static SPARE: Cell<Vec<u8>> = const { Cell::new(Vec::new()) };
}

/// Where a delta's bytes are written.
pub trait Sink {
    fn put(&mut self, bytes: &[u8]);
    fn written(&self) -> &[u8];
}

/// A growing buffer taken from the thread's spare and given back to it.
#[derive(Debug, Default)]
pub struct Spare(Vec<u8>);

impl Sink for Spare {
    fn put(&mut self, bytes: &[u8]) {
        self.0.extend_from_slice(bytes);
    }

    fn written(&self) -> &[u8] {
        &self.0
    }
}

impl Drop for Spare {
    fn drop(&mut self) {
        if self.0.capacity() > 0 && self.0.capacity() <= SPARE_LIMIT {
            SPARE.set(std::mem::take(&mut self.0));
        }
    }
}

/// `N` bytes on the stack, for a change whose delta takes at most `N` (a
/// first grant's: `Delta::inline`): no spare buffer to take and give back,
/// which takes a thread-local's lookup on every change.
#[derive(Debug)]
pub struct Inline<const N: usize> {
    buf: [u8; N],
    len: usize,
}

impl<const N: usize> Sink for Inline<N> {
    /// Panics past `N` bytes: `Delta::inline`'s callers keep within them.
    #[inline(always)]
    fn put(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        self.buf[self.len..end].copy_from_slice(bytes);
        self.len = end;
    }

    fn written(&self) -> &[u8] {
        &self.buf[..self.len]
    }
}

/// Steps recorded by the state machine while it changes a lock.
#[derive(Debug)]
pub struct Delta<S: Sink = Spare> {
    buf: S,
    recording: bool,
}

impl Delta {
    /// Records the steps of a change to a lock of `kind`.
    pub fn recording(kind: Kind) -> Delta {
        let mut buf = SPARE.take();
        buf.clear();
        Delta::started(Spare(buf), kind)
    }

    /// Records nothing (no replica or AOF would receive it, or a replay).
    pub fn off() -> Delta {
        Delta {
            buf: Spare::default(),
            recording: false,
        }
    }
}

impl<const N: usize> Delta<Inline<N>> {
    /// Records the steps of a change to a lock of `kind` on the stack: for a
    /// change whose delta takes at most `N` bytes (the caller knows: more
    /// panics).
    pub fn inline(kind: Kind) -> Self {
        let buf = Inline {
            buf: [0; N],
            len: 0,
        };
        Delta::started(buf, kind)
    }
}

impl<S: Sink> Delta<S> {
    #[inline(always)]
    fn started(mut buf: S, kind: Kind) -> Self {
        buf.put(&[VERSION, kind.code() as u8]);
        Delta {
            buf,
            recording: true,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.buf.written().len() <= 2
    }

    pub fn bytes(&self) -> &[u8] {
        self.buf.written()
    }

    /// Inlined: the first grant's effect runs two lines of code fewer so
    /// (`AOF=1 bench/footprint.sh`: 60 against 62).
    #[inline(always)]
    fn step(&mut self, tag: u8, mode: Option<Mode>, token: Option<u64>, deadline: Option<i64>) {
        self.buf.put(&[tag]);
        if let Some(m) = mode {
            self.buf.put(&[mode_byte(m)]);
            if let Mode::Permits { count, .. } = m {
                self.buf.put(&count.to_le_bytes());
            }
        }
        if let Some(t) = token {
            self.buf.put(&t.to_le_bytes());
        }
        if let Some(d) = deadline {
            self.buf.put(&d.to_le_bytes());
        }
    }

    pub fn new_holder(&mut self, mode: Mode, token: u64, deadline: i64, owner: &[u8]) {
        if self.recording {
            self.step(b'N', Some(mode), Some(token), Some(deadline));
            self.buf.put(&(owner.len() as u32).to_le_bytes());
            self.buf.put(owner);
        }
    }

    pub fn hold(&mut self, token: u64, mode: Mode, deadline: i64) {
        if self.recording {
            self.step(b'H', Some(mode), Some(token), Some(deadline));
        }
    }

    pub fn release(&mut self, token: u64, mode: Mode) {
        if self.recording {
            self.step(b'R', Some(mode), Some(token), None);
        }
    }

    pub fn renew(&mut self, token: u64, deadline: i64) {
        if self.recording {
            self.step(b'D', None, Some(token), Some(deadline));
        }
    }

    pub fn end(&mut self, token: u64) {
        if self.recording {
            self.step(b'E', None, Some(token), None);
        }
    }

    pub fn force(&mut self) {
        if self.recording {
            self.step(b'F', None, None, None);
        }
    }

    pub fn limit(&mut self, limit: u32) {
        if self.recording {
            self.step(b'L', None, None, None);
            self.buf.put(&limit.to_le_bytes());
        }
    }

    /// The whole lock, `encoded` as RDB stores it: the last step.
    pub fn lock(&mut self, encoded: &[u8]) {
        if self.recording {
            self.step(b'W', None, None, None);
            self.buf.put(encoded);
        }
    }

    /// A holder exactly as it stands (reads, writes, token, deadline, owner).
    #[cfg(test)]
    pub fn whole(&mut self, h: &super::Holder) {
        if self.recording {
            self.step(b'S', None, Some(h.token), Some(h.deadline));
            self.buf.put(&h.reads.to_le_bytes());
            self.buf.put(&h.writes.to_le_bytes());
            self.buf.put(&(h.owner.len() as u32).to_le_bytes());
            self.buf.put(&h.owner);
        }
    }
}

fn mode_byte(m: Mode) -> u8 {
    match m {
        Mode::Read => b'r',
        Mode::Write => b'w',
        Mode::Permits { .. } => b'p',
    }
}

/// One step of a delta, borrowed from its encoded form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op<'a> {
    New {
        mode: Mode,
        token: u64,
        deadline: i64,
        owner: &'a [u8],
    },
    Hold {
        token: u64,
        mode: Mode,
        deadline: i64,
    },
    Release {
        token: u64,
        mode: Mode,
    },
    Renew {
        token: u64,
        deadline: i64,
    },
    End {
        token: u64,
    },
    Force,
    Limit {
        limit: u32,
    },
    Whole {
        token: u64,
        deadline: i64,
        reads: u32,
        writes: u32,
        owner: &'a [u8],
    },
    /// A whole lock in its RDB form, not yet read (`encoding::read_whole`).
    Lock {
        encoded: &'a [u8],
    },
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<u8> {
        self.take(1).map(|b| b[0])
    }

    fn u64(&mut self) -> Option<u64> {
        self.take(8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    }

    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
    }

    fn i64(&mut self) -> Option<i64> {
        self.u64().map(|v| v as i64)
    }

    fn mode(&mut self) -> Option<Mode> {
        match self.u8()? {
            b'r' => Some(Mode::Read),
            b'w' => Some(Mode::Write),
            b'p' => Some(Mode::Permits {
                count: self.u32().filter(|n| *n > 0)?,
                limit: 0,
            }),
            _ => None,
        }
    }

    fn op(&mut self) -> Option<Op<'a>> {
        Some(match self.u8()? {
            b'N' => {
                let (mode, token, deadline) = (self.mode()?, self.u64()?, self.i64()?);
                let len = self.u32()? as usize;
                Op::New {
                    mode,
                    token,
                    deadline,
                    owner: self.take(len)?,
                }
            }
            b'H' => Op::Hold {
                mode: self.mode()?,
                token: self.u64()?,
                deadline: self.i64()?,
            },
            b'R' => Op::Release {
                mode: self.mode()?,
                token: self.u64()?,
            },
            b'D' => Op::Renew {
                token: self.u64()?,
                deadline: self.i64()?,
            },
            b'E' => Op::End { token: self.u64()? },
            b'F' => Op::Force,
            b'L' => Op::Limit { limit: self.u32()? },
            b'S' => {
                let (token, deadline) = (self.u64()?, self.i64()?);
                let (reads, writes) = (self.u32()?, self.u32()?);
                let len = self.u32()? as usize;
                Op::Whole {
                    token,
                    deadline,
                    reads,
                    writes,
                    owner: self.take(len)?,
                }
            }
            b'W' => Op::Lock {
                encoded: self.take(self.0.len())?,
            },
            _ => return None,
        })
    }
}

/// The steps of a decoded delta. Most changes make one step (a holder came,
/// left or renewed), which needs no allocation: replicas and AOF loading
/// decode one delta per change.
#[derive(Debug)]
pub enum Steps<'a> {
    One(Op<'a>),
    Many(Vec<Op<'a>>),
}

impl<'a> std::ops::Deref for Steps<'a> {
    type Target = [Op<'a>];

    fn deref(&self) -> &[Op<'a>] {
        match self {
            Steps::One(op) => std::slice::from_ref(op),
            Steps::Many(ops) => ops,
        }
    }
}

impl Steps<'_> {
    /// A whole lock as AOF rewrite writes it (a `W` step, or before it the
    /// holders as `S` steps; nothing else writes either): the file carries
    /// the key's TTL after it, in Redis's own `PEXPIREAT`.
    pub fn is_rewritten_lock(&self) -> bool {
        self.iter()
            .any(|op| matches!(op, Op::Whole { .. } | Op::Lock { .. }))
    }
}

/// Decodes a delta; any malformed byte makes the whole delta invalid.
pub fn decode(bytes: &[u8]) -> Option<(Kind, Steps<'_>)> {
    let mut r = Reader(bytes);
    if r.u8()? != VERSION {
        return None;
    }
    let kind = Kind::from_code(r.u8()? as u64)?;
    let first = r.op()?;
    if r.0.is_empty() {
        return Some((kind, Steps::One(first)));
    }
    let mut ops = vec![first];
    while !r.0.is_empty() {
        ops.push(r.op()?);
    }
    Some((kind, Steps::Many(ops)))
}

#[cfg(test)]
mod tests {
    use super::super::LockState;
    use super::*;

    /// Drives a master state with recording on and a replica by replay: both
    /// must always be equal, whatever the sequence (pseudo-random, seeded).
    #[test]
    fn replaying_recorded_deltas_reproduces_the_state() {
        let mut seed = 0x2545F4914F6CDD1Du64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        let mut next_token = 0;
        for kind in [
            Kind::Reentrant,
            Kind::Fair,
            Kind::ReadWrite,
            Kind::Semaphore,
        ] {
            let mut master = LockState::new(kind);
            let mut replica = LockState::new(kind);
            for step in 0..20_000i64 {
                let owner = format!("owner-{}", rnd(40));
                let mode = if kind == Kind::Semaphore {
                    Mode::Permits {
                        count: 1 + rnd(3) as u32,
                        limit: 3 + rnd(20) as u32,
                    }
                } else if kind == Kind::ReadWrite && rnd(3) > 0 {
                    Mode::Read
                } else {
                    Mode::Write
                };
                let mut d = Delta::recording(kind);
                match rnd(6) {
                    0 | 1 => {
                        // As the engine does: the latest ACQUIRE's limit first.
                        if let (Mode::Permits { limit, .. }, false) = (mode, master.is_free()) {
                            master.set_limit(limit, &mut d);
                        }
                        if matches!(
                            master.admit(owner.as_bytes(), mode),
                            super::super::Admission::Fresh | super::super::Admission::Reentrant
                        ) {
                            let deadline = step + rnd(500) as i64;
                            let mut issue = || {
                                next_token += 1;
                                Some(next_token)
                            };
                            master
                                .grant(owner.as_bytes(), mode, deadline, &mut issue, &mut d)
                                .unwrap();
                        }
                    }
                    2 => {
                        let _ = master.release(owner.as_bytes(), mode, &mut d);
                    }
                    3 => {
                        let _ = master.renew(owner.as_bytes(), step + 300, &mut d);
                    }
                    4 => {
                        master.expire(step, &mut d);
                    }
                    _ => {
                        if rnd(50) == 0 {
                            master.force(&mut d);
                        }
                    }
                }
                if !d.is_empty() {
                    let (k, ops) = decode(d.bytes()).expect("decodes");
                    assert_eq!(k, kind);
                    replica.replay(&ops, u64::MAX).expect("valid delta");
                }
                assert_eq!(master, replica, "diverged at step {step}");
            }
        }
    }

    #[test]
    fn invalid_deltas_change_nothing() {
        let mut s = LockState::new(Kind::ReadWrite);
        let mut d = Delta::recording(Kind::ReadWrite);
        s.grant(b"a", Mode::Read, 100, &mut || Some(7), &mut d)
            .unwrap();
        s.grant(b"b", Mode::Read, 100, &mut || Some(8), &mut d)
            .unwrap();
        let before = s.clone();
        let cases: Vec<Vec<Op>> = vec![
            // Valid first step, then an unknown token: the first step is undone.
            vec![Op::End { token: 7 }, Op::End { token: 99 }],
            vec![
                Op::Renew {
                    token: 8,
                    deadline: 5,
                },
                Op::Release {
                    token: 8,
                    mode: Mode::Write,
                },
            ],
            // A writer cannot join readers; an owner cannot hold twice; token reuse.
            vec![Op::New {
                mode: Mode::Write,
                token: 9,
                deadline: 1,
                owner: b"c",
            }],
            vec![Op::New {
                mode: Mode::Read,
                token: 9,
                deadline: 1,
                owner: b"a",
            }],
            vec![Op::New {
                mode: Mode::Read,
                token: 7,
                deadline: 1,
                owner: b"c",
            }],
            vec![Op::New {
                mode: Mode::Read,
                token: 9,
                deadline: 1,
                owner: b"",
            }],
            vec![Op::New {
                mode: Mode::Read,
                token: 0,
                deadline: 1,
                owner: b"c",
            }],
            // Upgrade by delta, negative deadline.
            vec![Op::Hold {
                token: 7,
                mode: Mode::Write,
                deadline: 1,
            }],
            vec![
                Op::Force,
                Op::Renew {
                    token: 7,
                    deadline: -1,
                },
            ],
        ];
        for ops in cases {
            assert!(s.replay(&ops, 1000).is_err(), "{ops:?}");
            assert_eq!(s, before, "{ops:?} left a change behind");
        }
        let mut fresh = LockState::new(Kind::Reentrant);
        assert!(fresh
            .replay(
                &[Op::Release {
                    token: 1,
                    mode: Mode::Write
                }],
                10
            )
            .is_err());
        assert!(
            fresh
                .replay(
                    &[Op::New {
                        mode: Mode::Read,
                        token: 1,
                        deadline: 1,
                        owner: b"x"
                    }],
                    10
                )
                .is_err(),
            "READ on a reentrant lock"
        );
    }

    #[test]
    fn semaphore_steps_keep_the_limit_and_the_permits() {
        let permits = |count| Mode::Permits { count, limit: 0 };
        let mut master = LockState::new(Kind::Semaphore);
        let mut d = Delta::recording(Kind::Semaphore);
        let want = |count| Mode::Permits { count, limit: 5 };
        master
            .grant(b"a", want(2), 10, &mut || Some(1), &mut d)
            .unwrap();
        master
            .grant(b"b", want(3), 10, &mut || Some(2), &mut d)
            .unwrap();
        master.release(b"b", permits(2), &mut d).unwrap();
        let (_, ops) = decode(d.bytes()).unwrap();
        assert_eq!(ops[0], Op::Limit { limit: 5 });
        let mut replica = LockState::new(Kind::Semaphore);
        replica.replay(&ops, 10).unwrap();
        assert_eq!(replica, master);
        assert_eq!((replica.limit(), replica.used()), (5, 3));
        let before = replica.clone();
        let bad: Vec<Vec<Op>> = vec![
            // Past the limit, more than held, a lock's mode, a zero limit.
            vec![Op::Hold {
                token: 1,
                mode: permits(3),
                deadline: 1,
            }],
            vec![Op::New {
                mode: permits(3),
                token: 3,
                deadline: 1,
                owner: b"c",
            }],
            vec![Op::Release {
                token: 2,
                mode: permits(2),
            }],
            vec![Op::Release {
                token: 2,
                mode: Mode::Read,
            }],
            vec![Op::Limit { limit: 0 }],
            vec![Op::New {
                mode: permits(1),
                token: 3,
                deadline: 1,
                owner: b"a",
            }],
        ];
        for ops in bad {
            assert!(replica.replay(&ops, 10).is_err(), "{ops:?}");
            assert_eq!(replica, before, "{ops:?} left a change behind");
        }
        // A holding cannot arrive before a limit says how many permits fit.
        let no_limit = [Op::New {
            mode: permits(1),
            token: 3,
            deadline: 1,
            owner: b"c",
        }];
        assert!(LockState::new(Kind::Semaphore)
            .replay(&no_limit, 10)
            .is_err());
        let mut cut = Delta::recording(Kind::Semaphore);
        cut.hold(1, permits(0), 5);
        assert!(decode(cut.bytes()).is_none(), "zero permits");
    }

    /// How AOF rewrite writes `state`.
    fn rewritten(state: &LockState) -> Vec<u8> {
        let mut d = Delta::recording(state.kind());
        d.lock(&crate::lock::encoding::encode(
            state.kind(),
            state.limit(),
            state.holder_count(),
            state.iter(),
        ));
        d.bytes().to_vec()
    }

    #[test]
    fn a_rewritten_lock_rebuilds_its_state_on_an_empty_key_only() {
        let mut off = Delta::off();
        let redisson = b"6f1c2a4e-8b1d-4e55-9a7c-3d2f1b0e9a11:1";
        let mut one = LockState::new(Kind::Reentrant);
        one.grant(redisson, Mode::Write, 50, &mut || Some(3), &mut off)
            .unwrap();
        let mut readers = LockState::new(Kind::ReadWrite);
        for (i, owner) in [b"a", b"b", b"c"].iter().enumerate() {
            let token = 10 + i as u64;
            readers
                .grant(*owner, Mode::Read, 60, &mut || Some(token), &mut off)
                .unwrap();
        }
        let mut sem = LockState::new(Kind::Semaphore);
        sem.set_limit(5, &mut off);
        let two = Mode::Permits { count: 2, limit: 5 };
        sem.grant(b"s", two, 70, &mut || Some(20), &mut off)
            .unwrap();
        for master in [one, readers, sem] {
            let bytes = rewritten(&master);
            // A Redisson lock fits an embedded string (44 bytes) as an argument.
            assert!(master.holder_count() > 1 || bytes.len() <= 44, "{bytes:?}");
            let (kind, steps) = decode(&bytes).unwrap();
            assert_eq!(kind, master.kind());
            assert!(steps.is_rewritten_lock());
            let mut copy = LockState::new(kind);
            copy.replay(&steps, 100).unwrap();
            assert_eq!(copy, master);
            // Not over a lock, not for another family, not past the tokens
            // issued, and no cut or damaged form: each refused, nothing changed.
            assert!(copy.replay(&steps, 100).is_err());
            assert_eq!(copy, master);
            let other = if kind == Kind::Fair {
                Kind::Reentrant
            } else {
                Kind::Fair
            };
            assert!(LockState::new(other).replay(&steps, 100).is_err());
            assert!(LockState::new(kind).replay(&steps, 2).is_err());
            for cut in 3..bytes.len() {
                let mut empty = LockState::new(kind);
                if let Some((_, steps)) = decode(&bytes[..cut]) {
                    assert!(empty.replay(&steps, 100).is_err(), "cut at {cut}");
                }
                assert!(empty.is_free());
            }
        }
    }

    #[test]
    fn whole_steps_rebuild_a_state_on_an_empty_key_only() {
        let mut master = LockState::new(Kind::ReadWrite);
        let mut off = Delta::off();
        master
            .grant(b"w", Mode::Write, 50, &mut || Some(3), &mut off)
            .unwrap();
        master
            .grant(b"w", Mode::Read, 60, &mut || None, &mut off)
            .unwrap();
        master.release(b"w", Mode::Write, &mut off).unwrap();
        master
            .grant(b"r", Mode::Read, 70, &mut || Some(4), &mut off)
            .unwrap();
        let mut d = Delta::recording(Kind::ReadWrite);
        master.iter().for_each(|h| d.whole(h));
        let (_, ops) = decode(d.bytes()).unwrap();
        assert!(ops.is_rewritten_lock());
        let mut change = Delta::recording(Kind::ReadWrite);
        master.clone().renew(b"r", 90, &mut change).unwrap();
        assert!(!decode(change.bytes()).unwrap().1.is_rewritten_lock());
        let mut copy = LockState::new(Kind::ReadWrite);
        copy.replay(&ops, 100).unwrap();
        assert_eq!(copy, master);
        // Not over existing holders, and never an impossible holder.
        assert!(copy.clone().replay(&ops, 100).is_err());
        let writer_among_readers = [
            Op::Whole {
                token: 1,
                deadline: 1,
                reads: 1,
                writes: 0,
                owner: b"a",
            },
            Op::Whole {
                token: 2,
                deadline: 1,
                reads: 0,
                writes: 1,
                owner: b"b",
            },
        ];
        assert!(LockState::new(Kind::ReadWrite)
            .replay(&writer_among_readers, 100)
            .is_err());
        let no_holds = [Op::Whole {
            token: 1,
            deadline: 1,
            reads: 0,
            writes: 0,
            owner: b"a",
        }];
        assert!(LockState::new(Kind::Reentrant)
            .replay(&no_holds, 100)
            .is_err());
        let reads_on_rlock = [Op::Whole {
            token: 1,
            deadline: 1,
            reads: 1,
            writes: 1,
            owner: b"a",
        }];
        assert!(LockState::new(Kind::Reentrant)
            .replay(&reads_on_rlock, 100)
            .is_err());
    }

    #[test]
    fn a_semaphore_rebuilt_by_whole_steps_needs_its_limit_first() {
        let holding = Op::Whole {
            token: 1,
            deadline: 1,
            reads: 3,
            writes: 0,
            owner: b"a",
        };
        let mut without_limit = LockState::new(Kind::Semaphore);
        assert!(without_limit.replay(&[holding], 100).is_err());
        assert!(without_limit.is_free());
        assert_eq!(without_limit.limit(), 0);
        let mut with_limit = LockState::new(Kind::Semaphore);
        with_limit
            .replay(&[Op::Limit { limit: 2 }, holding], 100)
            .unwrap();
        let rebuilt = LockState::from_parts(Kind::Semaphore, 2, with_limit.iter().cloned(), 100);
        assert_eq!(rebuilt, Ok(with_limit));
    }

    #[test]
    fn malformed_encodings_are_rejected() {
        let mut d = Delta::recording(Kind::Fair);
        d.new_holder(Mode::Write, 5, 10, b"owner");
        let good = d.bytes().to_vec();
        assert!(decode(&good).is_some());
        for cut in 0..good.len() {
            assert!(decode(&good[..cut]).is_none(), "cut at {cut}");
        }
        let mut bad_version = good.clone();
        bad_version[0] = 9;
        assert!(decode(&bad_version).is_none());
        let mut bad_kind = good.clone();
        bad_kind[1] = 7;
        assert!(decode(&bad_kind).is_none());
        let mut long_owner = good.clone();
        long_owner[2 + 1 + 1 + 16] = 200;
        assert!(decode(&long_owner).is_none());
        let mut trailing = good;
        trailing.push(b'Z');
        assert!(decode(&trailing).is_none());
    }

    #[test]
    fn steps_about_one_holder_do_not_carry_its_owner() {
        let owner = vec![b'x'; 1 << 20];
        let mut d = Delta::recording(Kind::Reentrant);
        d.renew(1, 2);
        d.release(1, Mode::Write);
        d.end(1);
        assert!(d.bytes().len() < 64);
        let mut n = Delta::recording(Kind::Reentrant);
        n.new_holder(Mode::Write, 1, 2, &owner);
        assert_eq!(n.bytes().len(), 2 + 1 + 1 + 16 + 4 + owner.len());
    }
}
