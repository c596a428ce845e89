//! Pure lock state machines: no Redis, no FFI, no clocks. Callers pass `now`
//! and a token source, so every transition is deterministic and unit-testable.
//!
//! One `LockState` serves every family; the family (`Kind`) only changes
//! which requests are compatible with the current holders (`LockState::admit`).

mod compact;
pub mod delta;
pub mod encoding;
mod owner;
mod queue;
mod state;
mod waitfor;

pub use compact::{decimal, Compact, FIRST_GRANT_DELTA, MAX_PACKED_OWNER};
pub use delta::{Delta, Op};
pub use owner::Owner;
pub use queue::{Served, WaitQueue, Waiter};
pub use state::{Admission, Holder, LockState, NotOwner, Refused};
pub use waitfor::{direct_waits, Ahead, Cycle, Node, WaitFor};

/// Error replies of the lock rules, shared by every layer that answers a client.
pub mod err {
    pub const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
    pub const NOTOWNER: &str = "NOTOWNER the owner does not hold this lock";
    pub const UPGRADE: &str =
        "ERR the owner holds READ: upgrading to WRITE would deadlock, release READ first";
    pub const HOLD_OVERFLOW: &str = "ERR the owner's hold count would overflow";
    pub const TOKENS_EXHAUSTED: &str =
        "ERR no fencing token left in range: the clock or the token counter is out of range";
    pub const INVALID_STATE: &str = "ERR invalid lock state";
    pub const INVALID_DELTA: &str = "ERR invalid lock delta";
    pub const TOO_FEW_PERMITS: &str = "ERR the owner holds fewer permits than it releases";
    /// Redis's own text, so clients treat it as they treat any write to a replica.
    pub const READONLY: &str = "READONLY You can't write against a read only replica.";
}

/// The lock family a key belongs to. Stored in the value, so a command of one
/// family on a key of another replies WRONGTYPE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Reentrant,
    Fair,
    ReadWrite,
    /// Up to `limit` permits held at once, in holdings of any size.
    Semaphore,
}

impl Kind {
    /// The family's name, as INFO shows it and RLOCK.SETSTATE carries it.
    pub fn name(self) -> &'static str {
        self.c_name().to_str().expect("ASCII")
    }

    /// The same name, NUL-terminated for the module API.
    pub fn c_name(self) -> &'static std::ffi::CStr {
        match self {
            Kind::Reentrant => c"rlock",
            Kind::Fair => c"fairlock",
            Kind::ReadWrite => c"rwlock",
            Kind::Semaphore => c"semaphore",
        }
    }

    pub fn from_name(name: &[u8]) -> Option<Kind> {
        [
            Kind::Reentrant,
            Kind::Fair,
            Kind::ReadWrite,
            Kind::Semaphore,
        ]
        .into_iter()
        .find(|k| k.name().as_bytes() == name)
    }

    pub fn code(self) -> u64 {
        match self {
            Kind::Reentrant => 0,
            Kind::Fair => 1,
            Kind::ReadWrite => 2,
            Kind::Semaphore => 3,
        }
    }

    pub fn from_code(code: u64) -> Option<Kind> {
        match code {
            0 => Some(Kind::Reentrant),
            1 => Some(Kind::Fair),
            2 => Some(Kind::ReadWrite),
            3 => Some(Kind::Semaphore),
            _ => None,
        }
    }

    /// Whether a request of `mode` belongs to this family.
    pub fn allows(self, mode: Mode) -> bool {
        matches!(
            (self, mode),
            (Kind::Semaphore, Mode::Permits { .. })
                | (Kind::ReadWrite, Mode::Read | Mode::Write)
                | (Kind::Reentrant | Kind::Fair, Mode::Write)
        )
    }
}

/// What a request asks for: shared (read) or exclusive (write) access, or
/// permits of a semaphore. Reentrant and fair locks only ever use `Write`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Read,
    Write,
    /// `count` permits of a semaphore whose ACQUIRE says `limit` (0 where no
    /// limit is given: releases, and replayed steps, whose limit is the state's).
    Permits {
        count: u32,
        limit: u32,
    },
}

impl Mode {
    /// How many holds a grant adds or a release takes back.
    pub fn amount(self) -> u32 {
        match self {
            Mode::Read | Mode::Write => 1,
            Mode::Permits { count, .. } => count,
        }
    }
}

/// Why a hold ended; also the word published on the unlock channel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    Released,
    Expired,
    Forced,
}

impl EndReason {
    pub fn word(self) -> &'static str {
        match self {
            EndReason::Released => "released",
            EndReason::Expired => "expired",
            EndReason::Forced => "forced",
        }
    }
}
