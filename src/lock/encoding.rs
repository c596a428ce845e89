//! The compact byte form of a whole lock state, as RDB (encoding version 2)
//! stores it: one string per lock instead of a framed item per field, so a
//! lock costs an RDB file about what a small Redis value does.
//!
//! Layout: `kind:u8 [limit:varint] count:varint` (the limit of a semaphore
//! only) then per holder `len:varint owner
//! reads:varint writes:varint token:u64le lease:zigzag-varint`, where `lease` is
//! the deadline minus the millisecond in the token's clock part (short for any
//! lease, exact for every deadline). Decoding is strict: any leftover or
//! missing byte is an error; the result still goes through `from_holders`.

use super::{Holder, Kind, Owner};

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
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

pub fn encode<'a>(
    kind: Kind,
    limit: u32,
    count: usize,
    holders: impl Iterator<Item = &'a Holder>,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(kind.code() as u8);
    if kind == Kind::Semaphore {
        put_varint(&mut out, limit as u64);
    }
    put_varint(&mut out, count as u64);
    for h in holders {
        put_varint(&mut out, h.owner.len() as u64);
        out.extend_from_slice(&h.owner);
        put_varint(&mut out, h.reads as u64);
        put_varint(&mut out, h.writes as u64);
        out.extend(h.token.to_le_bytes());
        put_varint(&mut out, zigzag(h.deadline.wrapping_sub(token_ms(h.token))));
    }
    out
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        (self.0.len() >= n).then(|| {
            let (head, rest) = self.0.split_at(n);
            self.0 = rest;
            head
        })
    }

    /// At most ten bytes; a value past `u64::MAX` (bits beyond the 64th in the
    /// tenth byte) is an error, not silently cut. Padded forms still read.
    fn varint(&mut self) -> Option<u64> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let b = *self.take(1)?.first()?;
            let bits = (b & 0x7f) as u64;
            if shift == 63 && bits > 1 {
                return None;
            }
            v |= bits << shift;
            if b & 0x80 == 0 {
                return Some(v);
            }
        }
        None
    }
}

/// A whole state as stored: family, limit (0 for locks), holders.
pub type Decoded = (Kind, u32, Vec<Holder>);

pub fn decode(bytes: &[u8]) -> Option<Decoded> {
    let mut r = Reader(bytes);
    let kind = Kind::from_code(*r.take(1)?.first()? as u64)?;
    let limit = match kind {
        Kind::Semaphore => u32::try_from(r.varint()?).ok()?,
        _ => 0,
    };
    let count = r.varint()?;
    let mut holders = Vec::new();
    for _ in 0..count {
        let len = usize::try_from(r.varint()?).ok()?;
        let owner = Owner::new(r.take(len)?);
        let reads = u32::try_from(r.varint()?).ok()?;
        let writes = u32::try_from(r.varint()?).ok()?;
        let token = u64::from_le_bytes(r.take(8)?.try_into().ok()?);
        let lease = unzigzag(r.varint()?);
        holders.push(Holder {
            owner,
            token,
            deadline: token_ms(token).checked_add(lease)?,
            reads,
            writes,
        });
    }
    r.0.is_empty().then_some((kind, limit, holders))
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
            let (k, l, back) = decode(&bytes).expect("decodes");
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
        assert!(encode(Kind::Reentrant, 0, 1, one.iter()).len() <= 56);
    }

    #[test]
    fn every_damaged_form_is_refused() {
        let hs = [
            holder(b"owner", 5 << 20, 100, 1, 0),
            holder(b"x", 6 << 20, 200, 2, 0),
        ];
        let good = encode(Kind::ReadWrite, 0, 2, hs.iter());
        for cut in 0..good.len() {
            assert!(decode(&good[..cut]).is_none(), "cut at {cut}");
        }
        let mut longer = good.clone();
        longer.push(0);
        assert!(decode(&longer).is_none());
        let mut bad_kind = good.clone();
        bad_kind[0] = 9;
        assert!(decode(&bad_kind).is_none());
        assert!(
            decode(&[0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01])
                .is_none()
        );
    }

    #[test]
    fn a_varint_past_u64_is_refused_not_cut() {
        // One RLOCK holder, its lease as a ten-byte varint.
        let with_lease = |lease: &[u8]| {
            let mut b = vec![0, 1, 1, b'a', 0, 1];
            b.extend((5u64 << 20).to_le_bytes());
            b.extend_from_slice(lease);
            decode(&b)
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
}
