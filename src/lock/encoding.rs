//! The compact byte form of a whole lock state, as RDB stores it: one string
//! per lock instead of a framed item per field, so a lock costs an RDB file
//! about what a small Redis value does.
//!
//! Layout: `kind:u8 [limit:varint] count:varint` (the limit of a semaphore
//! only) then per holder `owner reads:varint writes:varint token:u64le
//! lease:zigzag-varint`, where `lease` is the deadline minus the millisecond in
//! the token's clock part (short for any lease, exact for every deadline).
//! The owner, in encoding version 3 (written): `tag:varint`, then for an even
//! tag `tag / 2` raw bytes; tag 1 is Redisson's `<uuid>:<threadId>` in canonical
//! form, as 16 uuid bytes and `thread:varint` (17 bytes where the text takes
//! 38: a smaller file, and a one-holder lock loads straight into its packed
//! form); other odd tags are refused. Version 2 (read only): `len:varint`
//! and the bytes. Decoding is strict: any leftover or missing byte is an
//! error; the result still goes through the state's rules.

use super::compact::{redisson_owner, redisson_parts};
use super::{err, Compact, Holder, Kind, LockState, Owner};

/// The layouts of the compact form (RDB encoding versions 2 and 3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// Owners as length and bytes.
    V2,
    /// Owners tagged, Redisson's packed.
    V3,
}

/// Where an encoding goes: a `Vec`, or a `Buf` on the stack.
pub(super) trait Sink {
    fn put(&mut self, bytes: &[u8]);
}

impl Sink for Vec<u8> {
    fn put(&mut self, bytes: &[u8]) {
        self.extend_from_slice(bytes);
    }
}

/// Room for any packed lock's encoding (at most 56 bytes), on the stack: a
/// save of a million locks allocates nothing per lock.
pub struct Buf {
    bytes: [u8; 64],
    len: usize,
}

impl Buf {
    pub(super) fn new() -> Buf {
        Buf {
            bytes: [0; 64],
            len: 0,
        }
    }

    pub fn as_slice(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl Sink for Buf {
    fn put(&mut self, bytes: &[u8]) {
        self.bytes[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
    }
}

pub(super) fn put_varint(out: &mut impl Sink, mut v: u64) {
    let mut bytes = [0u8; 10];
    let mut n = 0;
    while v >= 0x80 {
        bytes[n] = v as u8 | 0x80;
        v >>= 7;
        n += 1;
    }
    bytes[n] = v as u8;
    out.put(&bytes[..=n]);
}

fn zigzag(v: i64) -> u64 {
    ((v << 1) ^ (v >> 63)) as u64
}

fn unzigzag(v: u64) -> i64 {
    (v >> 1) as i64 ^ -((v & 1) as i64)
}

/// The millisecond a token's clock part names (the base of the stored lease).
fn token_ms(token: u64) -> i64 {
    (token >> 20) as i64
}

/// Tag of a packed Redisson owner (even tags are raw lengths, doubled).
const REDISSON_TAG: u64 = 1;

/// A holder's owner as the encoding carries it.
pub(super) enum OwnerField<'a> {
    Raw(&'a [u8]),
    Redisson { uuid: [u8; 16], thread: u64 },
}

pub(super) fn put_owner(out: &mut impl Sink, owner: &OwnerField) {
    match owner {
        OwnerField::Raw(bytes) => {
            put_varint(out, (bytes.len() as u64) << 1);
            out.put(bytes);
        }
        OwnerField::Redisson { uuid, thread } => {
            put_varint(out, REDISSON_TAG);
            out.put(uuid);
            put_varint(out, *thread);
        }
    }
}

/// Everything of a holder after its owner.
pub(super) fn put_holds(out: &mut impl Sink, reads: u64, writes: u64, token: u64, deadline: i64) {
    put_varint(out, reads);
    put_varint(out, writes);
    out.put(&token.to_le_bytes());
    put_varint(out, zigzag(deadline.wrapping_sub(token_ms(token))));
}

/// The head: kind, a semaphore's limit, the holder count.
pub(super) fn put_head(out: &mut impl Sink, kind: Kind, limit: u64, count: u64) {
    out.put(&[kind.code() as u8]);
    if kind == Kind::Semaphore {
        put_varint(out, limit);
    }
    put_varint(out, count);
}

/// A whole state in the current layout (V3).
pub fn encode<'a>(
    kind: Kind,
    limit: u32,
    count: usize,
    holders: impl Iterator<Item = &'a Holder>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    put_head(&mut out, kind, limit.into(), count as u64);
    for h in holders {
        let owner = match redisson_parts(&h.owner) {
            Some((uuid, thread)) => OwnerField::Redisson { uuid, thread },
            None => OwnerField::Raw(&h.owner),
        };
        put_owner(&mut out, &owner);
        put_holds(
            &mut out,
            h.reads.into(),
            h.writes.into(),
            h.token,
            h.deadline,
        );
    }
    out
}

pub(super) struct Reader<'a>(pub(super) &'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        (self.0.len() >= n).then(|| {
            let (head, rest) = self.0.split_at(n);
            self.0 = rest;
            head
        })
    }

    /// At most ten bytes; a value past `u64::MAX` (bits beyond the 64th in the
    /// tenth byte) is an error, not silently cut. Padded forms still read.
    pub(super) fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for (i, &b) in self.0.iter().take(10).enumerate() {
            let shift = 7 * i as u32;
            let bits = (b & 0x7f) as u64;
            if shift == 63 && bits > 1 {
                return None;
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                self.0 = &self.0[i + 1..];
                return Some(v);
            }
        }
        None
    }

    /// Kind, limit (0 but for a semaphore) and holder count.
    pub(super) fn head(&mut self) -> Option<(Kind, u64, u64)> {
        let kind = Kind::from_code(*self.take(1)?.first()? as u64)?;
        let limit = match kind {
            Kind::Semaphore => self.varint()?,
            _ => 0,
        };
        Some((kind, limit, self.varint()?))
    }

    pub(super) fn owner(&mut self, layout: Layout) -> Option<OwnerField<'a>> {
        let tag = self.varint()?;
        if layout == Layout::V2 {
            return Some(OwnerField::Raw(self.take(usize::try_from(tag).ok()?)?));
        }
        if tag & 1 == 0 {
            return Some(OwnerField::Raw(self.take(usize::try_from(tag >> 1).ok()?)?));
        }
        if tag != REDISSON_TAG {
            return None;
        }
        let uuid = self.take(16)?.try_into().ok()?;
        let thread = self.varint()?;
        Some(OwnerField::Redisson { uuid, thread })
    }

    /// Reads, writes, token and deadline (whose lease must not overflow).
    pub(super) fn holds(&mut self) -> Option<(u64, u64, u64, i64)> {
        let reads = self.varint()?;
        let writes = self.varint()?;
        let token = u64::from_le_bytes(self.take(8)?.try_into().ok()?);
        let deadline = token_ms(token).checked_add(unzigzag(self.varint()?))?;
        Some((reads, writes, token, deadline))
    }

    pub(super) fn is_done(&self) -> bool {
        self.0.is_empty()
    }
}

/// A whole state as stored: family, limit (0 for locks), holders.
pub type Decoded = (Kind, u32, Vec<Holder>);

pub fn decode(bytes: &[u8], layout: Layout) -> Option<Decoded> {
    let mut r = Reader(bytes);
    let (kind, limit, count) = r.head()?;
    let mut holders = Vec::new();
    for _ in 0..count {
        let owner = match r.owner(layout)? {
            OwnerField::Raw(bytes) => Owner::new(bytes),
            OwnerField::Redisson { uuid, thread } => redisson_owner(&uuid, thread),
        };
        let (reads, writes, token, deadline) = r.holds()?;
        holders.push(Holder {
            owner,
            token,
            deadline,
            reads: u32::try_from(reads).ok()?,
            writes: u32::try_from(writes).ok()?,
        });
    }
    r.is_done()
        .then_some((kind, u32::try_from(limit).ok()?, holders))
}

/// A whole lock read back from its compact form.
pub enum Whole {
    /// The common one-holder lock, read straight into its block (a load of a
    /// million locks builds no `LockState` and parses no owner text).
    Packed(Compact),
    State(LockState),
}

/// The compact form was cut or damaged.
pub const MALFORMED: &str = "malformed lock encoding";

/// Reads a whole lock as RDB and AOF rewrite store it, held to the rules every
/// state the commands make keeps (`err::INVALID_STATE`), or `MALFORMED`.
pub fn read_whole(bytes: &[u8], layout: Layout, max_token: u64) -> Result<Whole, &'static str> {
    if layout == Layout::V3 {
        if let Some(c) = Compact::decode(bytes) {
            return match c.is_valid(max_token) {
                true => Ok(Whole::Packed(c)),
                false => Err(err::INVALID_STATE),
            };
        }
    }
    let (kind, limit, holders) = decode(bytes, layout).ok_or(MALFORMED)?;
    LockState::from_parts(kind, limit, holders, max_token).map(Whole::State)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(owner: &[u8], token: u64, deadline: i64, reads: u32, writes: u32) -> Holder {
        Holder {
            owner: Owner::new(owner),
            token,
            deadline,
            reads,
            writes,
        }
    }

    #[test]
    fn states_round_trip_and_stay_small() {
        let now = 1_800_000_000_000i64;
        let cases = vec![
            (
                Kind::Reentrant,
                vec![holder(
                    b"0f8a3c1e-7b2d-4c9e-a1f0-3d5e7b9c2a41:17",
                    (now as u64) << 20,
                    now + 30_000,
                    0,
                    1,
                )],
            ),
            (
                Kind::ReadWrite,
                vec![
                    holder(b"a", 1, i64::MAX, 3, 0),
                    holder(&[0, 255, 13], u64::MAX >> 1, 0, u32::MAX, 0),
                    holder(b"c", 7, -5, 1, 1),
                ],
            ),
            (
                Kind::Semaphore,
                vec![holder(b"s", 9, 100, 4, 0), holder(b"t", 10, 100, 1, 0)],
            ),
        ];
        for (kind, holders) in cases {
            let limit = if kind == Kind::Semaphore { 300 } else { 0 };
            let bytes = encode(kind, limit, holders.len(), holders.iter());
            let (k, l, back) = decode(&bytes, Layout::V3).expect("decodes");
            assert_eq!((k, l), (kind, limit));
            assert_eq!(back, holders);
        }
        let one = &[holder(
            b"0f8a3c1e-7b2d-4c9e-a1f0-3d5e7b9c2a41:17",
            (now as u64) << 20,
            now + 30_000,
            0,
            1,
        )];
        assert!(encode(Kind::Reentrant, 0, 1, one.iter()).len() <= 34);
    }

    #[test]
    fn every_damaged_form_is_refused() {
        let hs = [
            holder(b"owner", 5 << 20, 100, 1, 0),
            holder(b"x", 6 << 20, 200, 2, 0),
        ];
        let good = encode(Kind::ReadWrite, 0, 2, hs.iter());
        for cut in 0..good.len() {
            assert!(decode(&good[..cut], Layout::V3).is_none(), "cut at {cut}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode(&longer, Layout::V3).is_none());
        let mut bad_kind = good.clone();
        bad_kind[0] = 9;
        assert!(decode(&bad_kind, Layout::V3).is_none());
        let far = [
            0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert!(decode(&far, Layout::V3).is_none());
    }

    #[test]
    fn a_varint_past_u64_is_refused_not_cut() {
        // One RLOCK holder, its lease as a ten-byte varint.
        let with_lease = |lease: &[u8]| {
            let mut b = vec![0, 1, 1, b'a', 0, 1];
            b.extend((5u64 << 20).to_le_bytes());
            b.extend_from_slice(lease);
            decode(&b, Layout::V2)
        };
        let nine = [0xffu8; 9];
        // 2^64 - 1 fits (zigzag: the lease i64::MIN, deadline overflows: refused
        // for that reason); a tenth byte of 2 or 0x7f says 2^64 and more.
        let max = [&nine[..], &[0x01]].concat();
        assert_eq!(Reader(&max).varint(), Some(u64::MAX));
        for last in [0x02u8, 0x03, 0x7f] {
            let v = [&nine[..], &[last]].concat();
            assert_eq!(Reader(&v).varint(), None, "tenth byte {last:#x}");
        }
        // A 10-byte form whose high bits were dropped used to decode as lease 0.
        let mut cut = vec![0x80u8; 9];
        cut.push(0x02);
        assert!(with_lease(&cut).is_none());
        // Padded (non-minimal) forms are the same number.
        assert_eq!(Reader(&[0x85, 0x80, 0x00]).varint(), Some(5));
        assert_eq!(with_lease(&[0x80, 0x00]).unwrap().2[0].deadline, 5);
    }

    const REDISSON: &[u8] = b"0f8a3c1e-7b2d-4c9e-a1f0-3d5e7b9c2a41:17";

    #[test]
    fn redisson_owners_take_seventeen_bytes_and_read_back_exactly() {
        let token = 1_800_000_000_000u64 << 20;
        let h = holder(REDISSON, token, 1_800_000_030_000, 0, 1);
        let bytes = encode(Kind::Reentrant, 0, 1, [&h].into_iter());
        // kind, count, tag 1, the uuid, thread 17, reads, writes, token, lease.
        assert_eq!(bytes.len(), 1 + 1 + 1 + 16 + 1 + 1 + 1 + 8 + 3);
        assert_eq!(bytes[2], 1);
        let (_, _, back) = decode(&bytes, Layout::V3).unwrap();
        assert_eq!(back, std::slice::from_ref(&h));
        // The same bytes in the old layout would be a 0-byte owner, then junk.
        assert_ne!(decode(&bytes, Layout::V2).map(|d| d.2), Some(vec![h]));
    }

    #[test]
    fn odd_owner_tags_but_one_are_refused() {
        let h = holder(b"ab", 5 << 20, 100, 0, 1);
        let good = encode(Kind::Reentrant, 0, 1, [&h].into_iter());
        assert_eq!(good[2], 4, "raw owner: twice its length");
        for tag in [3u8, 5, 0x7f] {
            let mut bad = good.clone();
            bad[2] = tag;
            assert!(decode(&bad, Layout::V3).is_none(), "tag {tag}");
        }
    }

    #[test]
    fn version_two_still_reads() {
        // kind 2 (read-write), 2 holders, owners as length + bytes.
        let mut v2 = vec![2, 2];
        for (owner, token) in [(&b"r1"[..], 7u64 << 20), (REDISSON, 8 << 20)] {
            put_varint(&mut v2, owner.len() as u64);
            v2.extend_from_slice(owner);
            v2.extend([1, 0]);
            v2.extend(token.to_le_bytes());
            put_varint(&mut v2, zigzag(30_000));
        }
        let (kind, limit, back) = decode(&v2, Layout::V2).expect("v2 reads");
        assert_eq!((kind, limit), (Kind::ReadWrite, 0));
        assert_eq!(
            back,
            [
                holder(b"r1", 7 << 20, 7 + 30_000, 1, 0),
                holder(REDISSON, 8 << 20, 8 + 30_000, 1, 0),
            ]
        );
        assert!(decode(&v2, Layout::V3).is_none());
    }
}
