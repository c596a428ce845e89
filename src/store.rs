//! A lock key's value as the keyspace holds it (one module type for every lock
//! family; the family lives in the value): a boxed `LockState`, or a one-holder
//! lock packed into a `Compact`. Putting, repacking, reading and freeing it.
//! The type's callbacks (RDB, AOF, digest) are `datatype`'s.
//!
//! Only held state is stored. Waiters are live connections and belong to
//! `blocking`.

use std::os::raw::c_void;
use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::raw;

use crate::ffi::{api, Key};
use crate::lock::{Compact, Holder, Kind, LockState};
use crate::stats;

/// A lock key's value as Redis holds it: a boxed `LockState`, or a
/// one-holder lock packed into a `Compact` block (48 bytes against 80),
/// marked by the low bit of the pointer (both blocks are 8-aligned).
#[derive(Clone, Copy)]
pub struct Stored(*mut c_void);

const PACKED: usize = 1;

pub enum Form {
    Full(*mut LockState),
    Packed(*mut Compact),
}

/// A stored lock's state: borrowed, or unpacked from a `Compact`.
pub enum StateRef<'a> {
    Full(&'a LockState),
    Unpacked(LockState),
}

impl std::ops::Deref for StateRef<'_> {
    type Target = LockState;

    fn deref(&self) -> &LockState {
        match self {
            StateRef::Full(s) => s,
            StateRef::Unpacked(s) => s,
        }
    }
}

impl Stored {
    pub fn from_raw(p: *mut c_void) -> Stored {
        Stored(p)
    }

    pub fn raw(self) -> *mut c_void {
        self.0
    }

    /// The value for `state`: packed when it fits.
    pub fn create(mut state: LockState) -> Stored {
        Stored::create_from(&mut state)
    }

    /// As `create`; a packed value leaves `state` as it was, a boxed one takes it.
    fn create_from(state: &mut LockState) -> Stored {
        match Compact::pack(state) {
            Some(c) => Stored::packed(c),
            None => {
                stats::lock_made();
                Stored(boxed(state).cast())
            }
        }
    }

    pub fn packed(c: Compact) -> Stored {
        stats::lock_made();
        let block =
            crate::ffi::alloc_global(std::alloc::Layout::new::<Compact>()).cast::<Compact>();
        // SAFETY: a fresh allocation of a `Compact`'s layout.
        unsafe { block.write(c) };
        Stored(block.map_addr(|a| a | PACKED).cast())
    }

    pub fn form(self) -> Form {
        if self.0.addr() & PACKED != 0 {
            Form::Packed(self.0.map_addr(|a| a & !PACKED).cast())
        } else {
            Form::Full(self.0.cast())
        }
    }

    /// # Safety
    /// A live value of the lock type.
    pub unsafe fn kind(self) -> Kind {
        match self.form() {
            Form::Full(v) => (*v).kind(),
            Form::Packed(c) => (*c).kind(),
        }
    }

    /// # Safety
    /// A live value of the lock type, not changed while the result lives.
    pub unsafe fn state<'a>(self) -> StateRef<'a> {
        match self.form() {
            Form::Full(v) => StateRef::Full(&*v),
            Form::Packed(c) => StateRef::Unpacked((*c).unpack()),
        }
    }

    /// # Safety
    /// A live value of the lock type.
    pub unsafe fn outline(self) -> Outline {
        match self.form() {
            Form::Full(v) => Outline {
                kind: (*v).kind(),
                holders: (*v).holder_count(),
                latest_deadline: (*v).latest_deadline(),
                limit: (*v).limit(),
            },
            Form::Packed(c) => Outline {
                kind: (*c).kind(),
                holders: (*c).holder_count(),
                latest_deadline: Some((*c).deadline()).filter(|_| (*c).holder_count() > 0),
                limit: (*c).limit(),
            },
        }
    }

    /// # Safety
    /// A live value of the lock type, no longer in the keyspace.
    pub unsafe fn free(self) {
        stats::lock_freed();
        match self.form() {
            Form::Full(v) => drop(Box::from_raw(v)),
            Form::Packed(c) => drop(Box::from_raw(c)),
        }
    }
}

/// Stores `state` at an open key that holds no value: packed when it fits,
/// else boxed (returned, to read the state from).
///
/// # Safety
/// `key` is open for writing and empty.
pub unsafe fn put(key: &Key, state: &mut LockState) -> Option<*mut LockState> {
    let stored = Stored::create_from(state);
    api!(RedisModule_ModuleTypeSetValue)(key.raw, lock_type(), stored.raw());
    match stored.form() {
        Form::Full(p) => Some(p),
        Form::Packed(_) => None,
    }
}

/// Stores a packed lock at an open key that holds no value, and returns it
/// as stored (valid while the key holds it).
///
/// # Safety
/// `key` is open for writing and empty.
#[inline(always)]
pub unsafe fn put_packed(key: &Key, c: Compact) -> *const Compact {
    let stored = Stored::packed(c);
    api!(RedisModule_ModuleTypeSetValue)(key.raw, lock_type(), stored.raw());
    match stored.form() {
        Form::Packed(block) => block,
        Form::Full(_) => unreachable!("a packed value"),
    }
}

/// Writes a changed packed lock back: in its block when it still fits, else
/// as a boxed state (returned) in place of the block.
///
/// # Safety
/// `key` is open for writing and holds `block`.
pub unsafe fn repack(
    key: &Key,
    block: *mut Compact,
    state: &mut LockState,
) -> Option<*mut LockState> {
    if let Some(packed) = Compact::pack(state) {
        *block = packed;
        return None;
    }
    let full = boxed(state);
    let mut old = ptr::null_mut();
    api!(RedisModule_ModuleTypeReplaceValue)(key.raw, lock_type(), full.cast(), &mut old);
    drop(Box::from_raw(block));
    Some(full)
}

/// Moves `state` into a box of its own (leaving an empty state behind).
fn boxed(state: &mut LockState) -> *mut LockState {
    Box::into_raw(Box::new(std::mem::replace(
        state,
        LockState::new(state.kind()),
    )))
}

/// What the unlink hook reads of a value leaving the keyspace, without
/// unpacking it (an expiry storm reads half a million).
pub struct Outline {
    pub kind: Kind,
    pub holders: usize,
    pub latest_deadline: Option<i64>,
    /// A semaphore's limit in force (0 for the lock families).
    pub limit: u32,
}

/// The lock at an open key: `Err(())` if the key holds anything else.
pub fn lock_at(key: &Key) -> Result<Option<Stored>, ()> {
    Ok(key
        .module_value::<c_void>(lock_type())?
        .map(Stored::from_raw))
}

/// The lock type Redis registered (`datatype::LOCK_TYPE`), set once at load.
static LOCK_TYPE: AtomicPtr<raw::RedisModuleType> = AtomicPtr::new(ptr::null_mut());

pub fn set_lock_type(t: *mut raw::RedisModuleType) {
    LOCK_TYPE.store(t, Ordering::Relaxed);
}

pub fn lock_type() -> *mut raw::RedisModuleType {
    LOCK_TYPE.load(Ordering::Relaxed)
}

/// Parses `RLOCK.SETSTATE key kind n [owner reads writes token deadline]...`
/// after the key (AOF files of earlier versions). Strict: anything else is an error.
pub fn parse_setstate(args: &[&[u8]], max_token: u64) -> Result<LockState, &'static str> {
    fn num<T: std::str::FromStr>(b: &[u8]) -> Result<T, &'static str> {
        std::str::from_utf8(b)
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or("ERR invalid number in RLOCK.SETSTATE")
    }
    let (kind, count, rest) = match args {
        [kind, count, rest @ ..] => (kind, count, rest),
        _ => return Err("ERR wrong number of arguments for 'rlock.setstate' command"),
    };
    let kind = Kind::from_name(kind).ok_or("ERR unknown lock kind in RLOCK.SETSTATE")?;
    let count: usize = num(count)?;
    if rest.len() != count.saturating_mul(5) {
        return Err("ERR wrong number of arguments for 'rlock.setstate' command");
    }
    let holders = rest
        .chunks(5)
        .map(|h| {
            Ok(Holder {
                owner: h[0].into(),
                reads: num(h[1])?,
                writes: num(h[2])?,
                token: num(h[3])?,
                deadline: num(h[4])?,
            })
        })
        .collect::<Result<Vec<_>, &'static str>>()?;
    LockState::from_holders(kind, holders, max_token)
        .map_err(|_| "ERR invalid holder in RLOCK.SETSTATE")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lock::Owner;

    #[test]
    fn a_value_is_packed_only_when_it_fits_and_reads_back_the_same() {
        let one = |owner: &[u8]| {
            let h = Holder {
                owner: Owner::new(owner),
                reads: 0,
                writes: 1,
                token: 7,
                deadline: 100,
            };
            LockState::from_holders(Kind::Reentrant, [h], 100).unwrap()
        };
        for (state, packed) in [(one(b"short"), true), (one(&[b'o'; 25]), false)] {
            let stored = Stored::create(state.clone());
            assert_eq!(matches!(stored.form(), Form::Packed(_)), packed);
            unsafe {
                assert_eq!(*stored.state(), state);
                assert_eq!(stored.kind(), Kind::Reentrant);
                let outline = stored.outline();
                assert_eq!(outline.holders, 1);
                assert_eq!(outline.latest_deadline, Some(100));
                stored.free();
            }
        }
    }

    #[test]
    fn setstate_parse_rejects_malformed_input() {
        let ok: Vec<&[u8]> = vec![
            b"rwlock", b"2", b"a", b"1", b"0", b"7", b"100", b"b", b"2", b"0", b"8", b"200",
        ];
        let s = parse_setstate(&ok, 100).unwrap();
        assert_eq!(s.holder_count(), 2);
        assert_eq!(s.holder(b"b").unwrap().reads, 2);
        for bad in [
            vec![&b"rlock"[..]],
            vec![&b"nolock"[..], b"0"],
            vec![&b"rlock"[..], b"0"],
            vec![&b"rlock"[..], b"1", b"a", b"0", b"1", b"7"],
            vec![&b"rlock"[..], b"1", b"a", b"0", b"0", b"7", b"100"],
            vec![&b"rlock"[..], b"1", b"", b"0", b"1", b"7", b"100"],
            vec![&b"rlock"[..], b"1", b"a", b"1", b"1", b"7", b"100"],
            vec![&b"rlock"[..], b"1", b"a", b"0", b"1", b"x", b"100"],
            vec![&b"rlock"[..], b"1", b"a", b"0", b"1", b"101", b"100"],
            vec![&b"rlock"[..], b"1", b"a", b"0", b"4294967296", b"7", b"100"],
        ] {
            assert!(parse_setstate(&bad, 100).is_err(), "{bad:?}");
        }
    }
}
