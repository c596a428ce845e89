//! The one-holder lock packed into 48 bytes, the way Redis keeps a small hash
//! as a listpack: the common value (one holder, small counts, a short owner or
//! Redisson's `<uuid>:<threadId>`) fits the allocator's 48-byte class, where a
//! `LockState` takes 80. Anything else stays a `LockState`.
//!
//! A packed lock is unpacked into a `LockState` for every change and packed
//! again after it, so the state machine keeps one representation. The one
//! exception is the most common change of all, the first grant of a free key:
//! `first_grant` builds its block directly, and the tests hold it to
//! `LockState::grant` followed by `pack`.

use super::delta::Sink;
use super::encoding::{self, Buf, Layout, OwnerField, Reader};
use super::{Delta, Holder, Kind, LockState, Mode, Owner};

/// Owner bytes kept as they are, up to this many.
const RAW_OWNER: usize = 24;
/// `owner_form` of a Redisson owner: 16 uuid bytes, then the thread id (LE).
const UUID_THREAD: u8 = 0xFF;
/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`: where the dashes are.
const DASHES: [usize; 4] = [8, 13, 18, 23];
const UUID_LEN: usize = 36;
/// The longest owner a block holds: a Redisson owner with a 20-digit thread id.
pub const MAX_PACKED_OWNER: usize = UUID_LEN + 1 + 20;
/// The most bytes a first grant's steps take (`first_grant_steps`): 33 for the
/// delta's header, a semaphore's limit and a new holder with its permits,
/// and the owner.
pub const FIRST_GRANT_DELTA: usize = 33 + MAX_PACKED_OWNER;

#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compact {
    token: u64,
    deadline: i64,
    owner: [u8; RAW_OWNER],
    reads: u16,
    writes: u16,
    limit: u16,
    kind: u8,
    /// 0..=24: a raw owner of that length; `UUID_THREAD`: a packed one.
    owner_form: u8,
}

impl Compact {
    /// The packed form of `state`, if it has one holder and everything fits.
    pub fn pack(state: &LockState) -> Option<Compact> {
        let h = state.only_holder()?;
        let (owner_form, owner) = pack_owner(&h.owner)?;
        Some(Compact {
            token: h.token,
            deadline: h.deadline,
            owner,
            reads: h.reads.try_into().ok()?,
            writes: h.writes.try_into().ok()?,
            limit: state.limit().try_into().ok()?,
            kind: state.kind().code() as u8,
            owner_form,
        })
    }

    /// What `LockState::grant` makes of a free lock of `kind`, packed: `owner`
    /// the only holder, with one hold of `mode` (a semaphore: its permits, and
    /// the request's limit in force) and the token `issue` gives, its lease to
    /// `deadline`. `None`, with nothing issued, when that lock would not be
    /// packed or no token is left: the general path then decides. The first
    /// grant of a free key is the most common change there is, and building
    /// its block directly is what keeps that acquire's code short
    /// (bench/findings.md acquire-vs-set); the tests hold it to the state
    /// machine's grant.
    pub fn first_grant(
        kind: Kind,
        owner: &[u8],
        mode: Mode,
        deadline: i64,
        issue: impl FnOnce() -> Option<u64>,
    ) -> Option<Compact> {
        let (owner_form, packed_owner) = pack_owner(owner)?;
        let (mut reads, mut writes, mut limit) = (0, 0, 0);
        match mode {
            Mode::Write => writes = 1,
            Mode::Read => reads = 1,
            Mode::Permits { count, limit: l } => {
                reads = count.try_into().ok()?;
                limit = l.try_into().ok()?;
            }
        }
        if (kind == Kind::Semaphore) != (limit > 0) {
            return None;
        }
        Some(Compact {
            token: issue()?,
            deadline,
            owner: packed_owner,
            reads,
            writes,
            limit,
            kind: kind.code() as u8,
            owner_form,
        })
    }

    /// The steps `LockState::grant` records for the first grant that made
    /// this lock (`first_grant` of `owner` and `mode`).
    #[inline(always)]
    pub fn first_grant_steps(&self, owner: &[u8], mode: Mode, delta: &mut Delta<impl Sink>) {
        if self.limit > 0 {
            delta.limit(self.limit.into());
        }
        delta.new_holder(mode, self.token, self.deadline, owner);
    }

    pub fn unpack(&self) -> LockState {
        if self.reads == 0 && self.writes == 0 {
            return LockState::new(self.kind());
        }
        let holder = Holder {
            owner: self.owner(),
            token: self.token,
            deadline: self.deadline,
            reads: self.reads.into(),
            writes: self.writes.into(),
        };
        LockState::with_holder(self.kind(), self.limit.into(), holder)
    }

    /// Marks the lock free (no holds left), as a value the engine is about to
    /// delete must read: the unlink hook tells a release from a deletion by it.
    pub fn clear(&mut self) {
        (self.reads, self.writes) = (0, 0);
    }

    /// 0 once cleared, else 1.
    pub fn holder_count(&self) -> usize {
        usize::from(self.reads != 0 || self.writes != 0)
    }

    /// The one holder's deadline.
    pub fn deadline(&self) -> i64 {
        self.deadline
    }

    pub fn kind(&self) -> Kind {
        Kind::from_code(self.kind.into()).expect("packed from a Kind")
    }

    /// A semaphore's limit (0 for the lock families).
    pub fn limit(&self) -> u32 {
        self.limit.into()
    }

    fn owner(&self) -> Owner {
        match self.owner_field() {
            OwnerField::Raw(bytes) => Owner::new(bytes),
            OwnerField::Redisson { uuid, thread } => redisson_owner(&uuid, thread),
        }
    }

    fn owner_field(&self) -> OwnerField<'_> {
        if self.owner_form != UUID_THREAD {
            return OwnerField::Raw(&self.owner[..self.owner_form as usize]);
        }
        OwnerField::Redisson {
            uuid: self.owner[..16].try_into().expect("16 bytes"),
            thread: u64::from_le_bytes(self.owner[16..].try_into().expect("8 bytes")),
        }
    }

    /// The holder's token.
    pub fn token(&self) -> u64 {
        self.token
    }

    /// The RDB encoding (`encoding::encode` of the unpacked state, byte for
    /// byte), built on the stack without unpacking.
    pub fn encode(&self) -> Buf {
        let mut out = Buf::new();
        encoding::put_head(&mut out, self.kind(), self.limit.into(), 1);
        encoding::put_owner(&mut out, &self.owner_field());
        let (reads, writes) = (self.reads.into(), self.writes.into());
        encoding::put_holds(&mut out, reads, writes, self.token, self.deadline);
        out
    }

    /// A version-3 encoding of a lock with one holder that fits the packed
    /// form, read straight into it (a load of a million locks builds no
    /// `LockState`); `None` for anything else, which `encoding::decode`
    /// reads or refuses. Not yet checked against the rules (`is_valid`).
    pub fn decode(bytes: &[u8]) -> Option<Compact> {
        let mut r = Reader(bytes);
        let (kind, limit, count) = r.head()?;
        if count != 1 {
            return None;
        }
        let mut owner = [0u8; RAW_OWNER];
        let owner_form = match r.owner(Layout::V3)? {
            OwnerField::Raw(bytes) if bytes.len() <= RAW_OWNER => {
                owner[..bytes.len()].copy_from_slice(bytes);
                bytes.len() as u8
            }
            OwnerField::Raw(_) => return None,
            OwnerField::Redisson { uuid, thread } => {
                owner[..16].copy_from_slice(&uuid);
                owner[16..].copy_from_slice(&thread.to_le_bytes());
                UUID_THREAD
            }
        };
        let (reads, writes, token, deadline) = r.holds()?;
        if !r.is_done() {
            return None;
        }
        Some(Compact {
            token,
            deadline,
            owner,
            reads: reads.try_into().ok()?,
            writes: writes.try_into().ok()?,
            limit: limit.try_into().ok()?,
            kind: kind.code() as u8,
            owner_form,
        })
    }

    /// The rules `LockState::from_parts` applies to a lone holder.
    pub fn is_valid(&self, max_token: u64) -> bool {
        let kind = self.kind();
        (kind == Kind::Semaphore) == (self.limit > 0)
            && self.owner_form != 0
            && LockState::lone_holds_valid(
                kind,
                (self.reads.into(), self.writes.into()),
                self.token,
                self.deadline,
                max_token,
            )
    }
}

/// Redisson's owner text for a uuid and thread id. Written by hand: this runs
/// on every change to a packed lock, where `write!` cost ~1,000 instructions
/// (callgrind).
pub(super) fn redisson_owner(uuid: &[u8; 16], thread: u64) -> Owner {
    // 36 + ':' + at most 20 digits of a u64.
    let mut text = [b'-'; UUID_LEN + 21];
    for (&byte, &at) in uuid.iter().zip(&HEX_AT) {
        text[at] = HEX[(byte >> 4) as usize];
        text[at + 1] = HEX[(byte & 15) as usize];
    }
    text[UUID_LEN] = b':';
    let mut digits = [0u8; 20];
    let digits = decimal(thread, &mut digits);
    let len = UUID_LEN + 1 + digits.len();
    text[UUID_LEN + 1..len].copy_from_slice(digits);
    Owner::new(&text[..len])
}

/// `n` in decimal, written at the end of `buf` (a u64 has at most 20 digits):
/// the digits. The hot paths that print a number (a Redisson owner's thread
/// id, a channel's db) use this rather than `core::fmt`, whose machinery cost
/// a release's publish ~240 instructions for one db number.
pub fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut first = buf.len();
    loop {
        first -= 1;
        buf[first] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            return &buf[first..];
        }
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";
/// Where each uuid byte's two hex digits start in `xxxxxxxx-xxxx-...`.
const HEX_AT: [usize; 16] = [0, 2, 4, 6, 9, 11, 14, 16, 19, 21, 24, 26, 28, 30, 32, 34];

/// A thread id in canonical decimal (no sign, no leading zero, in range).
fn canonical_u64(digits: &[u8]) -> Option<u64> {
    match digits {
        [b'0'] => return Some(0),
        [b'1'..=b'9', ..] => {}
        _ => return None,
    }
    digits.iter().try_fold(0u64, |n, &d| {
        let d = d.is_ascii_digit().then(|| d - b'0')?;
        n.checked_mul(10)?.checked_add(d.into())
    })
}

/// A Redisson owner (lower-case uuid, `:`, a thread id in canonical decimal)
/// as its uuid bytes and thread id, if `owner` is one: exactly the owners
/// `redisson_owner` gives back byte for byte.
pub(super) fn redisson_parts(owner: &[u8]) -> Option<([u8; 16], u64)> {
    let (uuid, thread) = (owner.get(..UUID_LEN)?, owner.get(UUID_LEN + 1..)?);
    if owner[UUID_LEN] != b':' || DASHES.iter().any(|&d| uuid[d] != b'-') {
        return None;
    }
    Some((uuid_bytes(uuid)?, canonical_u64(thread)?))
}

/// The 32 digits of a uuid whose dashes were checked, as its 16 bytes.
#[cfg(not(target_arch = "x86_64"))]
fn uuid_bytes(uuid: &[u8]) -> Option<[u8; 16]> {
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    let mut bytes = [0u8; 16];
    for (byte, &at) in bytes.iter_mut().zip(&HEX_AT) {
        *byte = digit(uuid[at])? << 4 | digit(uuid[at + 1])?;
    }
    Some(bytes)
}

/// `uuid_bytes` sixteen digits at a time in SSE2 registers (every x86-64 has
/// them): every acquire of a Redisson owner runs it, and eight digits per
/// 64-bit word took ~200 instructions, a table load per digit ~270.
#[cfg(target_arch = "x86_64")]
fn uuid_bytes(uuid: &[u8]) -> Option<[u8; 16]> {
    use std::arch::x86_64::*;
    // The digits without the dashes: 8, 4, 4, 4 and 12.
    let mut digits = [0u8; 32];
    digits[..8].copy_from_slice(&uuid[..8]);
    digits[8..12].copy_from_slice(&uuid[9..13]);
    digits[12..16].copy_from_slice(&uuid[14..18]);
    digits[16..20].copy_from_slice(&uuid[19..23]);
    digits[20..].copy_from_slice(&uuid[24..36]);
    // SAFETY: SSE2 is part of x86-64; the loads and the store are unaligned
    // ones of 16 bytes inside `digits` and `out`.
    unsafe {
        let splat = |c: u8| _mm_set1_epi8(c as i8);
        // Per byte: its value if it is one of 0-9a-f, and whether it is
        // (signed compares: a byte of 0x80 and up is negative, so not a digit).
        let value = |v: __m128i| {
            let within = |lo: u8, hi: u8| {
                let above = _mm_cmpgt_epi8(v, splat(lo - 1));
                _mm_and_si128(above, _mm_cmpgt_epi8(splat(hi + 1), v))
            };
            let letter = within(b'a', b'f');
            let valid = _mm_or_si128(within(b'0', b'9'), letter);
            let nibble = _mm_and_si128(v, splat(0x0f));
            let nibble = _mm_add_epi8(nibble, _mm_and_si128(letter, splat(9)));
            // Each 16-bit lane holds a pair of digits, the first in its low
            // byte: first << 4 | second.
            let first = _mm_slli_epi16(_mm_and_si128(nibble, _mm_set1_epi16(0x0f)), 4);
            (_mm_or_si128(first, _mm_srli_epi16(nibble, 8)), valid)
        };
        let (low, low_valid) = value(_mm_loadu_si128(digits.as_ptr().cast()));
        let (high, high_valid) = value(_mm_loadu_si128(digits.as_ptr().add(16).cast()));
        if _mm_movemask_epi8(_mm_and_si128(low_valid, high_valid)) != 0xffff {
            return None;
        }
        let mut out = [0u8; 16];
        _mm_storeu_si128(out.as_mut_ptr().cast(), _mm_packus_epi16(low, high));
        Some(out)
    }
}

/// An owner as it fits 24 bytes: raw if short enough, else a Redisson owner.
fn pack_owner(owner: &[u8]) -> Option<(u8, [u8; RAW_OWNER])> {
    let mut out = [0u8; RAW_OWNER];
    if owner.len() <= RAW_OWNER {
        out[..owner.len()].copy_from_slice(owner);
        return Some((owner.len() as u8, out));
    }
    let (uuid, thread) = redisson_parts(owner)?;
    out[..16].copy_from_slice(&uuid);
    out[16..].copy_from_slice(&thread.to_le_bytes());
    Some((UUID_THREAD, out))
}

#[cfg(test)]
mod tests {
    use super::super::delta::Inline;
    use super::*;

    const UUID: &str = "0f3c2a9e-7b1d-4e5f-a6b7-c8d9e0f1a2b3";

    fn one(kind: Kind, limit: u32, owner: &[u8], reads: u32, writes: u32) -> LockState {
        let h = Holder {
            owner: Owner::new(owner),
            token: 1 << 40 | 7,
            deadline: 1_700_000_000_123,
            reads,
            writes,
        };
        LockState::with_holder(kind, limit, h)
    }

    #[test]
    fn decimal_writes_what_display_writes() {
        let mut n = 1u64;
        let mut values = vec![0, 9, 10, 99, 100, u64::MAX - 1, u64::MAX];
        while n < u64::MAX / 10 {
            values.extend([n - 1, n, n + 1]);
            n *= 10;
        }
        for v in values {
            assert_eq!(decimal(v, &mut [0; 20]), v.to_string().as_bytes(), "{v}");
        }
    }

    #[test]
    fn is_48_bytes() {
        assert_eq!(std::mem::size_of::<Compact>(), 48);
        assert_eq!(std::mem::align_of::<Compact>(), 8);
    }

    /// `redisson_parts` one digit at a time: the reference.
    fn parts_digit_by_digit(owner: &[u8]) -> Option<([u8; 16], u64)> {
        let (uuid, thread) = (owner.get(..UUID_LEN)?, owner.get(UUID_LEN + 1..)?);
        if owner[UUID_LEN] != b':' || DASHES.iter().any(|&d| uuid[d] != b'-') {
            return None;
        }
        let digit = |c: u8| HEX.iter().position(|&h| h == c).map(|v| v as u8);
        let mut bytes = [0u8; 16];
        for (byte, &at) in bytes.iter_mut().zip(&HEX_AT) {
            *byte = digit(uuid[at])? << 4 | digit(uuid[at + 1])?;
        }
        Some((bytes, canonical_u64(thread)?))
    }

    #[test]
    fn sixteen_digits_at_once_read_as_one_at_a_time() {
        let valid = format!("{UUID}:42").into_bytes();
        assert_eq!(redisson_parts(&valid), parts_digit_by_digit(&valid));
        assert!(redisson_parts(&valid).is_some());
        // Every byte value at every position of the uuid and the colon.
        for at in 0..=UUID_LEN {
            for b in 0..=255u8 {
                let mut owner = valid.clone();
                owner[at] = b;
                assert_eq!(
                    redisson_parts(&owner),
                    parts_digit_by_digit(&owner),
                    "byte {b:#04x} at {at}"
                );
            }
        }
        // Every digit value in every lane of every group.
        for at in HEX_AT.iter().flat_map(|&a| [a, a + 1]) {
            for &h in HEX {
                let mut owner = valid.clone();
                owner[at] = h;
                let (bytes, _) = redisson_parts(&owner).expect("a uuid");
                assert_eq!(Some((bytes, 42)), parts_digit_by_digit(&owner));
            }
        }
    }

    #[test]
    fn packs_and_unpacks_every_owner_form_exactly() {
        let long_raw = [b'x'; RAW_OWNER];
        let owners: Vec<Vec<u8>> = vec![
            b"w".to_vec(),
            b"\0\xff\r\n".to_vec(),
            long_raw.to_vec(),
            format!("{UUID}:0").into_bytes(),
            format!("{UUID}:1").into_bytes(),
            format!("{UUID}:42").into_bytes(),
            format!("{UUID}:{}", u64::MAX).into_bytes(),
        ];
        for owner in &owners {
            for (kind, limit, reads, writes) in [
                (Kind::Reentrant, 0, 0, 3),
                (Kind::Fair, 0, 0, 1),
                (Kind::ReadWrite, 0, 2, 0),
                (Kind::ReadWrite, 0, 0, 65535),
                (Kind::Semaphore, 65535, 9, 0),
            ] {
                let state = one(kind, limit, owner, reads, writes);
                let packed = Compact::pack(&state).expect("fits");
                assert_eq!(
                    packed.unpack(),
                    state,
                    "{:?}",
                    String::from_utf8_lossy(owner)
                );
                assert_eq!(packed.kind(), kind);
            }
        }
    }

    /// The first grant's block and steps are the state machine's: a free
    /// `LockState` granted, then packed. When that lock would not be packed,
    /// nothing is issued.
    #[test]
    fn a_first_grant_is_the_state_machines_grant_packed() {
        let owners: Vec<Vec<u8>> = vec![
            b"w".to_vec(),
            b"\0\xff\r\n".to_vec(),
            [b'x'; RAW_OWNER].to_vec(),
            [b'x'; RAW_OWNER + 1].to_vec(),
            format!("{UUID}:0").into_bytes(),
            format!("{UUID}:{}", u64::MAX).into_bytes(),
            format!("{UUID}:01").into_bytes(),
            format!("{}:7", UUID.to_uppercase()).into_bytes(),
        ];
        let permits = |count, limit| Mode::Permits { count, limit };
        let requests = [
            (Kind::Reentrant, Mode::Write),
            (Kind::Fair, Mode::Write),
            (Kind::ReadWrite, Mode::Read),
            (Kind::ReadWrite, Mode::Write),
            (Kind::Semaphore, permits(1, 1)),
            (Kind::Semaphore, permits(3, 65535)),
            (Kind::Semaphore, permits(65535, 65535)),
            (Kind::Semaphore, permits(65536, 70000)),
            (Kind::Semaphore, permits(2, 65536)),
        ];
        let (deadline, token) = (1_700_000_000_123, 1 << 40 | 7);
        let (mut packed, mut unpacked) = (0, 0);
        for owner in &owners {
            for &(kind, mode) in &requests {
                let what = format!("{kind:?} {mode:?} {:?}", String::from_utf8_lossy(owner));
                let mut state = LockState::new(kind);
                let mut steps = Delta::recording(kind);
                let issue = &mut || Some(token);
                assert_eq!(
                    state.grant(owner, mode, deadline, issue, &mut steps),
                    Ok(token)
                );
                let expected = Compact::pack(&state);

                let mut issued = 0;
                let issue = || {
                    issued += 1;
                    Some(token)
                };
                let got = Compact::first_grant(kind, owner, mode, deadline, issue);
                assert_eq!(got, expected, "{what}");
                match got {
                    Some(block) => {
                        packed += 1;
                        let mut first_steps = Delta::recording(kind);
                        block.first_grant_steps(owner, mode, &mut first_steps);
                        assert_eq!(first_steps.bytes(), steps.bytes(), "{what}");
                        // In a buffer of exactly the bound (more would panic).
                        let mut on_stack = Delta::<Inline<FIRST_GRANT_DELTA>>::inline(kind);
                        block.first_grant_steps(owner, mode, &mut on_stack);
                        assert_eq!(on_stack.bytes(), steps.bytes(), "{what}");
                        assert_eq!(issued, 1, "{what}");
                        let none = Compact::first_grant(kind, owner, mode, deadline, || None);
                        assert_eq!(none, None, "{what}: no token left");
                    }
                    None => {
                        unpacked += 1;
                        assert_eq!(issued, 0, "{what}");
                    }
                }
            }
        }
        // Both outcomes were exercised.
        assert!(
            packed > 20 && unpacked > 20,
            "{packed} packed, {unpacked} not"
        );
    }

    #[test]
    fn what_does_not_come_back_exactly_stays_unpacked() {
        let upper = UUID.to_uppercase();
        let not_packed: Vec<String> = vec![
            format!("{UUID}:01"),
            format!("{UUID}:-1"),
            format!("{UUID}:+1"),
            format!("{UUID}:"),
            format!("{UUID}:18446744073709551616"),
            format!("{UUID}:1 "),
            format!("{UUID}-1"),
            format!("{upper}:1"),
            format!("{}:1", UUID.replace('-', "_")),
            format!("{}x:1", &UUID[..35]),
            "a-much-longer-owner-than-24-bytes".into(),
        ];
        for owner in &not_packed {
            let state = one(Kind::Reentrant, 0, owner.as_bytes(), 0, 1);
            assert_eq!(Compact::pack(&state), None, "{owner}");
        }
        for state in [
            one(Kind::Reentrant, 0, b"w", 0, 65536),
            one(Kind::ReadWrite, 0, b"w", 65536, 0),
            one(Kind::Semaphore, 65536, b"w", 1, 0),
            LockState::new(Kind::Reentrant),
        ] {
            assert_eq!(Compact::pack(&state), None);
        }
    }

    #[test]
    fn a_cleared_lock_unpacks_free() {
        let mut packed = Compact::pack(&one(Kind::Fair, 0, b"w", 0, 2)).unwrap();
        assert_eq!(packed.holder_count(), 1);
        packed.clear();
        assert!(packed.unpack().is_free());
        assert_eq!(packed.holder_count(), 0);
        assert_eq!(packed.kind(), Kind::Fair);
    }

    #[test]
    fn encodes_as_its_unpacked_state_and_decodes_back() {
        let max_token = u64::MAX >> 1;
        for owner in [
            b"w".to_vec(),
            [b'x'; RAW_OWNER].to_vec(),
            format!("{UUID}:0").into_bytes(),
            format!("{UUID}:{}", u64::MAX).into_bytes(),
        ] {
            for (kind, limit, reads, writes) in [
                (Kind::Reentrant, 0, 0, 3),
                (Kind::ReadWrite, 0, 65535, 0),
                (Kind::Semaphore, 65535, 9, 0),
            ] {
                let state = one(kind, limit, &owner, reads, writes);
                let packed = Compact::pack(&state).unwrap();
                let bytes = packed.encode();
                let general = encoding::encode(kind, limit, 1, state.iter());
                assert_eq!(bytes.as_slice(), &general[..]);
                assert_eq!(Compact::decode(bytes.as_slice()), Some(packed));
                assert!(packed.is_valid(max_token));
                for cut in 0..general.len() {
                    assert_eq!(Compact::decode(&general[..cut]), None, "cut at {cut}");
                }
            }
        }
    }

    #[test]
    fn what_the_packed_form_cannot_hold_is_left_to_the_general_decoder() {
        let long = one(Kind::Reentrant, 0, b"an-owner-longer-than-24-bytes", 0, 1);
        let reads = one(Kind::ReadWrite, 0, b"w", 70_000, 0);
        let two = {
            let mut s = one(Kind::ReadWrite, 0, b"w", 1, 0);
            let other = Holder {
                owner: Owner::new(b"v"),
                token: 9,
                deadline: 5,
                reads: 1,
                writes: 0,
            };
            s = LockState::from_holders(
                Kind::ReadWrite,
                [s.only_holder().unwrap().clone(), other],
                u64::MAX,
            )
            .unwrap();
            s
        };
        for state in [long, reads, two] {
            let bytes = encoding::encode(state.kind(), 0, state.holder_count(), state.iter());
            assert_eq!(Compact::decode(&bytes), None);
            assert!(encoding::decode(&bytes, Layout::V3).is_some());
        }
    }

    #[test]
    fn a_decoded_block_is_held_to_the_state_rules() {
        let valid = |kind, limit, owner: &[u8], reads, writes, token, deadline| {
            let h = Holder {
                owner: Owner::new(owner),
                token,
                deadline,
                reads,
                writes,
            };
            let bytes = encoding::encode(kind, limit, 1, [&h].into_iter());
            let packed = Compact::decode(&bytes).expect("fits the packed form");
            let by_rules = LockState::from_parts(kind, limit, [h], 1000).is_ok();
            assert_eq!(packed.is_valid(1000), by_rules, "{kind:?} {reads}/{writes}");
            by_rules
        };
        assert!(valid(Kind::Reentrant, 0, b"w", 0, 1, 5, 0));
        assert!(!valid(Kind::Reentrant, 0, b"", 0, 1, 5, 0));
        assert!(!valid(Kind::Fair, 0, b"w", 1, 1, 5, 0));
        assert!(!valid(Kind::ReadWrite, 0, b"w", 0, 0, 5, 0));
        assert!(!valid(Kind::ReadWrite, 0, b"w", 1, 0, 0, 0));
        assert!(!valid(Kind::ReadWrite, 0, b"w", 1, 0, 1001, 0));
        assert!(!valid(Kind::ReadWrite, 0, b"w", 1, 0, 5, -1));
        assert!(!valid(Kind::Semaphore, 0, b"w", 1, 0, 5, 0));
        // More permits than the limit: a limit lowered under the holding.
        assert!(valid(Kind::Semaphore, 2, b"w", 3, 0, 5, 0));
        assert!(!valid(Kind::Semaphore, 2, b"w", 1, 1, 5, 0));
        assert!(valid(Kind::Semaphore, 2, b"w", 2, 0, 5, 0));
    }

    #[test]
    fn the_longest_encoding_fits_its_buffer() {
        let h = Holder {
            owner: Owner::new(format!("{UUID}:{}", u64::MAX).as_bytes()),
            token: u64::MAX,
            deadline: i64::MIN,
            reads: 65535,
            writes: 65535,
        };
        let state = LockState::with_holder(Kind::Semaphore, 65535, h);
        let packed = Compact::pack(&state).unwrap();
        assert_eq!(packed.encode().as_slice().len(), 56);
    }
}
