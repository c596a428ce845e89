//! Untrusted payloads (issue 12): mutated `DUMP` payloads of every lock family
//! through `RESTORE`, the same mutations inside RDB files loaded at startup, and
//! mutated replicated effects (`RLOCK.DELTA`, `RLOCK.DELTAS`, `RLOCK.SETSTATE`) replayed from an
//! AOF. Nothing may crash the server, leave an impossible or unreleasable lock,
//! leak memory, or poison the fencing tokens.
//!
//! The mutations are generated from a seeded PRNG: the seed is printed, and
//! `RLOCK_FUZZ_SEED=<n>` replays a run. Payloads carry a valid CRC64 (computed
//! here) so that every mutation gets past Redis's checksum and reaches the
//! module's loader.
//!
//! Each `RESTORE` is also judged by a model of how Redis and the module read a
//! payload (`judge`): a well-formed payload that encodes a valid state must be
//! restored exactly (its live holders shown by `*.INFO`), one that encodes an
//! invalid state or is malformed must get `ERR Bad data format`; only payloads
//! whose type byte or module type name changed, or that use encodings the
//! model does not read (LZF), may go either way (and are then checked for
//! validity alone).
//!
//! Every RDB encoding version of a lock value is covered: version 3 (one
//! compact string, Redisson owners packed: what `DUMP` writes) from real
//! `DUMP`s, and versions 2 (the compact string with owners as text) and 1 (an
//! item per field), what older RDB files hold, crafted from the same states and
//! checked to load as exactly those states. A fifth of the mutations each run
//! on the version-1 and version-2 payloads, and every truncation and designed
//! RDB case runs on all three.
//!
//! And a restored lock's TTL: whatever TTL `RESTORE` was given, the key's TTL
//! becomes the lock's latest deadline, everywhere the lock goes.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use redis::ConnectionLike;

const YEAR_MS: i64 = 365 * 24 * 3600 * 1000;

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The largest token the module may ever hand out or accept at `now`: its
/// clock floor one year ahead (see `src/token.rs`), plus a little slack for the
/// time between the server's clock reading and ours.
fn token_bound(now: i64) -> u64 {
    ((now + YEAR_MS + 5_000) as u64) << 20
}

// ---------------------------------------------------------------------------
// CRC-64 as Redis computes it for DUMP payloads and RDB files (crc64.c): the
// Jones polynomial 0xad93d23594c935a9, reflected input and output, initial
// value 0, no final xor. Table-driven over the reflected polynomial.

const JONES_REFLECTED: u64 = 0x95ac_9329_ac4b_c9b5;

fn crc64(data: &[u8]) -> u64 {
    static TABLE: std::sync::OnceLock<[u64; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u64; 256];
        for (i, slot) in t.iter_mut().enumerate() {
            let mut crc = i as u64;
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ JONES_REFLECTED
                } else {
                    crc >> 1
                };
            }
            *slot = crc;
        }
        t
    });
    data.iter().fold(0u64, |crc, &b| {
        table[((crc ^ b as u64) & 0xff) as usize] ^ (crc >> 8)
    })
}

#[test]
fn crc64_matches_redis_check_value() {
    // The test vector of Redis's crc64.c.
    assert_eq!(crc64(b"123456789"), 0xe9c6_d914_c4b8_d9ca);
    assert_eq!(crc64(b""), 0);
}

// ---------------------------------------------------------------------------
// Seeded PRNG (common::Rng, splitmix64): what these tests pick with it.

impl Rng {
    fn index(&mut self, len: usize) -> usize {
        self.below(len as u64) as usize
    }

    fn chance(&mut self, one_in: u64) -> bool {
        self.below(one_in) == 0
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.index(xs.len())]
    }
}

fn seed(test: &str) -> u64 {
    let seed = match std::env::var("RLOCK_FUZZ_SEED") {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("RLOCK_FUZZ_SEED={s}: not a number")),
        Err(_) => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64,
    };
    eprintln!("{test}: seed {seed} (RLOCK_FUZZ_SEED={seed} replays this run)");
    seed
}

// ---------------------------------------------------------------------------
// The RDB encoding of a module value (Redis's rdb.c / module.c, module type
// encoding v2): the type byte RDB_TYPE_MODULE_2 (7), the 64-bit module type id
// (its low 10 bits are the module's encoding version, passed to its loader),
// then each saved item as an opcode and its value, then the EOF opcode 0.
// A DUMP payload adds the RDB version (2 bytes, little-endian) and the CRC64 of
// everything before it (8 bytes, little-endian).
//
// rlock's own encoding versions (`src/store.rs`):
// - version 1: items `kind count [owner reads writes token deadline]...`
//   (unsigned, unsigned, then string, unsigned x3, signed per holder);
// - version 2: one string item, the compact form of `src/lock/encoding.rs`:
//   `kind:u8 count:varint`, then per holder
//   `len:varint owner reads:varint writes:varint token:u64le lease:zigzag-varint`
//   with lease = deadline - (token >> 20);
// - version 3 (what DUMP writes): version 2 with each owner as `tag:varint`,
//   then `tag / 2` bytes for an even tag, or for tag 1 a Redisson owner
//   (`<lower-case uuid>:<thread id in canonical decimal>`) as 16 uuid bytes and
//   `thread:varint`; other odd tags are refused.
// Both are modelled here as the same list of fields (`Item`s, holder `h`'s field
// `f` at `at(h, f)`), written in one layout or the other.

/// The semaphore's kind code: its layout (a limit after the kind byte) is
/// not in the lock model; `mutated_semaphore_payloads_are_refused_or_restored_valid`
/// checks semaphore values.
const SEMAPHORE_KIND: u8 = 3;
/// Why a payload is left to that test.
const SEMAPHORE_LAYOUT: &str = "kind byte mutated to the semaphore's (another layout)";

const OP_EOF: u64 = 0;
const OP_UINT: u64 = 2;
const OP_STRING: u64 = 5;

/// `rdbSaveLen`.
fn put_len(out: &mut Vec<u8>, v: u64) {
    if v < 1 << 6 {
        out.push(v as u8);
    } else if v < 1 << 14 {
        out.extend([0x40 | (v >> 8) as u8, v as u8]);
    } else if v <= u32::MAX as u64 {
        out.push(0x80);
        out.extend((v as u32).to_be_bytes());
    } else {
        out.push(0x81);
        out.extend(v.to_be_bytes());
    }
}

/// `rdbSaveRawString` with compression off: short decimal integers are saved
/// as integers, everything else as length + bytes.
fn put_string(out: &mut Vec<u8>, s: &[u8]) {
    if s.len() <= 11 {
        if let Some(v) = std::str::from_utf8(s)
            .ok()
            .and_then(|t| t.parse::<i64>().ok())
            .filter(|v| v.to_string().as_bytes() == s)
        {
            if let Ok(b) = i8::try_from(v) {
                out.extend([0xc0, b as u8]);
                return;
            } else if let Ok(h) = i16::try_from(v) {
                out.push(0xc1);
                out.extend(h.to_le_bytes());
                return;
            } else if let Ok(w) = i32::try_from(v) {
                out.push(0xc2);
                out.extend(w.to_le_bytes());
                return;
            }
        }
    }
    put_len(out, s.len() as u64);
    out.extend_from_slice(s);
}

/// LEB128, as `encoding.rs` writes it.
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

/// The millisecond a token's clock part names: the base of a v2 or v3 lease.
fn token_ms(token: u64) -> i64 {
    (token >> 20) as i64
}

/// The module's encoding versions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Enc {
    V1,
    V2,
    V3,
}

impl Enc {
    fn number(self) -> u64 {
        match self {
            Enc::V1 => 1,
            Enc::V2 => 2,
            Enc::V3 => 3,
        }
    }

    /// One compact string (v2, v3), not an item per field (v1).
    fn compact(self) -> bool {
        self != Enc::V1
    }

    fn index(self) -> usize {
        self.number() as usize - 1
    }
}

/// One field saved by the module, or bytes that no honest writer produces.
#[derive(Clone, Debug)]
enum Item {
    /// v1: an unsigned item; v2, v3: a varint.
    U(u64),
    /// v1: a string item; v2: a varint length and the bytes; v3: an owner.
    S(Vec<u8>),
    /// A string whose length field says `len` but `bytes` follow (v3: a raw
    /// owner's tag says `len`).
    LyingString(u64, Vec<u8>),
    /// v2, v3: one byte (the kind). v1 writes it as an unsigned item.
    Byte(u8),
    /// v2, v3: eight bytes little-endian (the token). v1: an unsigned item.
    Fixed(u64),
    /// v2, v3: a zigzag varint (the lease). v1: an unsigned item (two's complement).
    Lease(i64),
    /// Raw bytes, spliced in as they are.
    Raw(Vec<u8>),
}

fn put_item_v1(out: &mut Vec<u8>, item: &Item) {
    match item {
        Item::U(v) | Item::Fixed(v) => {
            put_len(out, OP_UINT);
            put_len(out, *v);
        }
        Item::Byte(b) => {
            put_len(out, OP_UINT);
            put_len(out, *b as u64);
        }
        Item::Lease(l) => {
            put_len(out, OP_UINT);
            put_len(out, *l as u64);
        }
        Item::S(s) => {
            put_len(out, OP_STRING);
            put_string(out, s);
        }
        Item::LyingString(len, bytes) => {
            put_len(out, OP_STRING);
            put_len(out, *len);
            out.extend_from_slice(bytes);
        }
        Item::Raw(bytes) => out.extend_from_slice(bytes),
    }
}

/// `<lower-case uuid>:<thread id>` in the one form that formats back to the
/// same bytes, as the module packs it (`src/lock/compact.rs`).
fn redisson_parts(owner: &[u8]) -> Option<([u8; 16], u64)> {
    let text = std::str::from_utf8(owner).ok()?;
    let (uuid, thread) = text.split_once(':')?;
    let hex: String = uuid.split('-').collect();
    let lens: Vec<usize> = uuid.split('-').map(str::len).collect();
    if lens != [8, 4, 4, 4, 12] || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
        return None;
    }
    let thread: u64 = thread.parse().ok()?;
    if thread.to_string() != text.split_once(':')?.1 {
        return None;
    }
    let mut bytes = [0u8; 16];
    for (i, b) in bytes.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some((bytes, thread))
}

fn redisson_text(uuid: &[u8], thread: u64) -> Vec<u8> {
    let hex: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}:{thread}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
    .into_bytes()
}

fn put_item_compact(out: &mut Vec<u8>, item: &Item, enc: Enc) {
    match item {
        Item::U(v) => put_varint(out, *v),
        Item::S(s) if enc == Enc::V3 => match redisson_parts(s) {
            Some((uuid, thread)) => {
                put_varint(out, 1);
                out.extend(uuid);
                put_varint(out, thread);
            }
            None => {
                put_varint(out, (s.len() as u64) << 1);
                out.extend_from_slice(s);
            }
        },
        Item::S(s) => {
            put_varint(out, s.len() as u64);
            out.extend_from_slice(s);
        }
        Item::LyingString(len, bytes) => {
            put_varint(out, if enc == Enc::V3 { len << 1 } else { *len });
            out.extend_from_slice(bytes);
        }
        Item::Byte(b) => out.push(*b),
        Item::Fixed(v) => out.extend(v.to_le_bytes()),
        Item::Lease(l) => put_varint(out, zigzag(*l)),
        Item::Raw(bytes) => out.extend_from_slice(bytes),
    }
}

/// A lock value: its fields `kind count [owner reads writes token deadline]...`
/// in the layout `enc`, and what frames them.
#[derive(Clone, Debug)]
struct Payload {
    /// The layout the items are written in.
    enc: Enc,
    /// Type byte and module type id (whose low 10 bits Redis passes to the
    /// loader as the encoding version: normally `enc`).
    head: Vec<u8>,
    items: Vec<Item>,
    /// v2, v3: what the string item's length says, when it lies.
    outer_len: Option<u64>,
    /// v2, v3: items (v1 framing) between the module's string and the EOF opcode.
    after: Vec<Item>,
    eof: bool,
    version: [u8; 2],
}

fn module_id(head: &[u8]) -> u64 {
    u64::from_be_bytes(head[2..10].try_into().unwrap())
}

impl Payload {
    /// v2, v3: the bytes of the module's one string.
    fn compact(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for item in &self.items {
            put_item_compact(&mut out, item, self.enc);
        }
        out
    }

    /// Everything before the footer.
    fn body(&self) -> Vec<u8> {
        let mut out = self.head.clone();
        match self.enc {
            Enc::V1 => self.items.iter().for_each(|i| put_item_v1(&mut out, i)),
            Enc::V2 | Enc::V3 => {
                let compact = self.compact();
                put_len(&mut out, OP_STRING);
                match self.outer_len {
                    None => put_string(&mut out, &compact),
                    Some(n) => {
                        put_len(&mut out, n);
                        out.extend_from_slice(&compact);
                    }
                }
            }
        }
        self.after.iter().for_each(|i| put_item_v1(&mut out, i));
        if self.eof {
            put_len(&mut out, OP_EOF);
        }
        out
    }

    fn encode(&self) -> Vec<u8> {
        with_footer(&self.body(), self.version)
    }

    fn holder_count(&self) -> usize {
        self.items.len().saturating_sub(2) / 5
    }

    /// The module id's encoding version set to `v`.
    fn set_encver(&mut self, v: u64) {
        let id = (module_id(&self.head) & !1023) | v;
        self.head[2..10].copy_from_slice(&id.to_be_bytes());
    }

    /// Holder `h`'s token, if that field is still a token.
    fn token(&self, h: usize) -> Option<u64> {
        match self.items.get(at(h, 3)) {
            Some(Item::U(t) | Item::Fixed(t)) => Some(*t),
            _ => None,
        }
    }

    fn kind_item(&self, code: u64) -> Item {
        match self.enc {
            Enc::V1 => Item::U(code),
            Enc::V2 | Enc::V3 => Item::Byte(code as u8),
        }
    }

    fn token_item(&self, token: u64) -> Item {
        match self.enc {
            Enc::V1 => Item::U(token),
            Enc::V2 | Enc::V3 => Item::Fixed(token),
        }
    }

    /// The deadline field for `deadline`, given the token holder `h` carries
    /// (v2 and v3 store it relative to the token, as the module's encoder does).
    fn deadline_item(&self, h: usize, deadline: i64) -> Item {
        match self.enc {
            Enc::V1 => Item::U(deadline as u64),
            Enc::V2 | Enc::V3 => {
                Item::Lease(deadline.wrapping_sub(token_ms(self.token(h).unwrap_or(0))))
            }
        }
    }

    fn set_deadline(&mut self, h: usize, deadline: i64) {
        self.items[at(h, 4)] = self.deadline_item(h, deadline);
    }

    /// Sets holder `h`'s token; in v2 and v3, keeping its deadline or (`keep_lease`)
    /// its stored lease, so that the deadline moves with the token.
    fn set_token(&mut self, h: usize, token: u64, keep_lease: bool) {
        let deadline = match (&self.items[at(h, 4)], self.token(h)) {
            (Item::Lease(l), Some(t)) => token_ms(t).checked_add(*l),
            (Item::U(d), _) => Some(*d as i64),
            _ => None,
        };
        self.items[at(h, 3)] = self.token_item(token);
        if let (true, Some(d), false) = (self.enc.compact(), deadline, keep_lease) {
            self.set_deadline(h, d);
        }
    }

    /// The same fields in the other layout, under a module id saying so.
    fn in_layout(&self, enc: Enc) -> Payload {
        let mut p = self.clone();
        p.enc = enc;
        p.set_encver(enc.number());
        let lock = self.fields();
        p.items = vec![p.kind_item(lock.0), Item::U(lock.1.len() as u64)];
        for (h, x) in lock.1.iter().enumerate() {
            p.items.extend([
                Item::S(x.owner.clone()),
                Item::U(x.reads),
                Item::U(x.writes),
                p.token_item(x.token),
                Item::U(0),
            ]);
            p.set_deadline(h, x.deadline);
        }
        p
    }

    /// The kind code and holders of an unmutated payload.
    fn fields(&self) -> (u64, Vec<Holder>) {
        let bytes = self.encode();
        let mut r = RdbReader {
            buf: &bytes,
            pos: 10,
        };
        match read_value(&mut r, module_id(&self.head) & 1023) {
            Read::Ok(v) => v,
            other => panic!("not a well-formed payload: {other:?} ({self:?})"),
        }
    }
}

fn with_footer(body: &[u8], version: [u8; 2]) -> Vec<u8> {
    let mut out = body.to_vec();
    out.extend(version);
    let crc = crc64(&out);
    out.extend(crc.to_le_bytes());
    out
}

/// `rdbLoadLen` over a byte stream, as Redis reads it (any of the encodings,
/// minimal or not; a special-encoding byte `11xxxxxx` reads as its low 6 bits).
struct RdbReader<'a> {
    buf: &'a [u8],
    pos: usize,
}

/// What a load step found.
#[derive(Debug)]
enum Read<T> {
    Ok(T),
    /// Redis or the module refuses these bytes.
    Bad(&'static str),
    /// Bytes this model does not decode (LZF strings).
    Unmodelled(&'static str),
}

impl<'a> RdbReader<'a> {
    fn take(&mut self, n: u64) -> Option<&'a [u8]> {
        let n = usize::try_from(n).ok()?;
        if self.buf.len() - self.pos < n {
            return None;
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Some(out)
    }

    /// (value, special-encoding flag), or None when Redis refuses the length.
    fn len(&mut self) -> Option<(u64, bool)> {
        let b = self.take(1)?[0];
        Some(match b >> 6 {
            0 => ((b & 0x3f) as u64, false),
            1 => ((((b & 0x3f) as u64) << 8) | self.take(1)?[0] as u64, false),
            2 if b == 0x80 => (
                u32::from_be_bytes(self.take(4)?.try_into().unwrap()) as u64,
                false,
            ),
            2 if b == 0x81 => (u64::from_be_bytes(self.take(8)?.try_into().unwrap()), false),
            2 => return None,
            _ => ((b & 0x3f) as u64, true),
        })
    }

    /// `RM_LoadUnsigned` / `RM_LoadSigned`.
    fn unsigned(&mut self) -> Read<u64> {
        match self.len() {
            Some((OP_UINT, _)) => match self.len() {
                Some((v, _)) => Read::Ok(v),
                None => Read::Bad("short or bad integer"),
            },
            _ => Read::Bad("expected an integer opcode"),
        }
    }

    /// `RM_LoadStringBuffer`.
    fn string(&mut self) -> Read<Vec<u8>> {
        match self.len() {
            Some((OP_STRING, _)) => {}
            _ => return Read::Bad("expected a string opcode"),
        }
        match self.len() {
            None => Read::Bad("bad string length"),
            Some((len, false)) => match self.take(len) {
                Some(b) => Read::Ok(b.to_vec()),
                None => Read::Bad("short string"),
            },
            Some((enc, true)) => {
                let v = match enc {
                    0 => self.take(1).map(|b| b[0] as i8 as i64),
                    1 => self
                        .take(2)
                        .map(|b| i16::from_le_bytes(b.try_into().unwrap()) as i64),
                    2 => self
                        .take(4)
                        .map(|b| i32::from_le_bytes(b.try_into().unwrap()) as i64),
                    3 => return Read::Unmodelled("LZF string"),
                    _ => return Read::Bad("unknown string encoding"),
                };
                match v {
                    Some(v) => Read::Ok(v.to_string().into_bytes()),
                    None => Read::Bad("short integer string"),
                }
            }
        }
    }
}

/// The compact form (v2, or v3 with tagged owners), read as the spec in
/// `src/lock/encoding.rs` says:
/// strict (a missing or leftover byte is an error), varints of at most ten
/// bytes and at most `u64::MAX` (padded forms read as their value), a deadline
/// that overflows is an error. Hold counts are returned as read (the rules
/// refuse those beyond u32).
fn decode_compact(bytes: &[u8], enc: Enc) -> Result<(u64, Vec<Holder>), &'static str> {
    struct C<'a>(&'a [u8]);
    impl C<'_> {
        fn take(&mut self, n: u64) -> Result<&[u8], &'static str> {
            let n = usize::try_from(n).map_err(|_| "length beyond the address space")?;
            if self.0.len() < n {
                return Err("compact form cut short");
            }
            let (head, rest) = self.0.split_at(n);
            self.0 = rest;
            Ok(head)
        }

        fn varint(&mut self) -> Result<u64, &'static str> {
            let mut v = 0u64;
            for i in 0..10 {
                let b = self.take(1)?[0];
                let bits = (b & 0x7f) as u64;
                if i == 9 && bits > 1 {
                    return Err("varint beyond u64");
                }
                v |= bits << (7 * i);
                if b & 0x80 == 0 {
                    return Ok(v);
                }
            }
            Err("varint longer than ten bytes")
        }
    }
    let mut c = C(bytes);
    let code = c.take(1)?[0] as u64;
    let count = c.varint()?;
    let mut holders = Vec::new();
    for _ in 0..count {
        let tag = c.varint()?;
        let owner = match (enc, tag) {
            (Enc::V3, 1) => {
                let uuid = c.take(16)?.to_vec();
                redisson_text(&uuid, c.varint()?)
            }
            (Enc::V3, t) if t & 1 == 1 => return Err("odd owner tag other than 1"),
            (Enc::V3, t) => c.take(t >> 1)?.to_vec(),
            (_, len) => c.take(len)?.to_vec(),
        };
        let reads = c.varint()?;
        let writes = c.varint()?;
        let token = u64::from_le_bytes(c.take(8)?.try_into().unwrap());
        let lease = unzigzag(c.varint()?);
        let deadline = token_ms(token)
            .checked_add(lease)
            .ok_or("deadline overflows")?;
        holders.push(Holder {
            owner,
            reads,
            writes,
            token,
            deadline,
        });
    }
    if !c.0.is_empty() {
        return Err("bytes after the last holder");
    }
    Ok((code, holders))
}

/// What the module's loader reads for encoding version `encver`: the kind code
/// and the holders, or why it refuses (`Bad`) — not yet the rules.
fn read_value(r: &mut RdbReader, encver: u64) -> Read<(u64, Vec<Holder>)> {
    macro_rules! read {
        ($e:expr) => {
            match $e {
                Read::Ok(v) => v,
                Read::Bad(why) => return Read::Bad(why),
                Read::Unmodelled(why) => return Read::Unmodelled(why),
            }
        };
    }
    match encver {
        1 => {
            let code = read!(r.unsigned());
            let count = read!(r.unsigned());
            let mut holders = Vec::new();
            for _ in 0..count {
                let owner = read!(r.string());
                let reads = read!(r.unsigned());
                let writes = read!(r.unsigned());
                let token = read!(r.unsigned());
                let deadline = read!(r.unsigned()) as i64;
                holders.push(Holder {
                    owner,
                    reads,
                    writes,
                    token,
                    deadline,
                });
            }
            Read::Ok((code, holders))
        }
        2 | 3 => {
            let enc = if encver == 2 { Enc::V2 } else { Enc::V3 };
            let value = read!(r.string());
            if value.first() == Some(&SEMAPHORE_KIND) {
                return Read::Unmodelled(SEMAPHORE_LAYOUT);
            }
            match decode_compact(&value, enc) {
                Ok(v) => Read::Ok(v),
                Err(why) => Read::Bad(why),
            }
        }
        _ => Read::Bad("unknown encoding version"),
    }
}

/// Parses a real DUMP payload of a lock (written by the server with
/// `rdbcompression no`, in encoding version 3); panics on anything else.
fn parse_dump(dump: &[u8]) -> Payload {
    let n = dump.len();
    assert!(n > 12, "payload too short: {dump:?}");
    let crc = u64::from_le_bytes(dump[n - 8..].try_into().unwrap());
    assert_eq!(
        crc64(&dump[..n - 8]),
        crc,
        "our CRC64 differs from the server's"
    );
    let version = [dump[n - 10], dump[n - 9]];
    let body = &dump[..n - 10];
    assert_eq!(body[0], 7, "not a module value (RDB_TYPE_MODULE_2)");
    assert_eq!(body[1], 0x81, "module id is a 64-bit length");
    let head = body[..10].to_vec();
    assert_eq!(module_id(&head) & 1023, 3, "DUMP is not encoding version 3");
    let mut r = RdbReader { buf: body, pos: 10 };
    let compact = match r.string() {
        Read::Ok(s) => s,
        other => panic!("the value is not one string: {other:?}"),
    };
    assert_eq!(r.len(), Some((OP_EOF, false)), "no EOF after the string");
    assert_eq!(r.pos, body.len(), "bytes after the EOF opcode");
    let (code, holders) = decode_compact(&compact, Enc::V3).expect("the server's compact form");
    let mut p = Payload {
        enc: Enc::V3,
        head,
        items: vec![Item::Byte(code as u8), Item::U(holders.len() as u64)],
        outer_len: None,
        after: Vec::new(),
        eof: true,
        version,
    };
    for h in &holders {
        p.items.extend([
            Item::S(h.owner.clone()),
            Item::U(h.reads),
            Item::U(h.writes),
            Item::Fixed(h.token),
            Item::Lease(h.deadline - token_ms(h.token)),
        ]);
    }
    // Our encoder writes exactly what the server wrote: the model of the
    // format the mutations rely on is right.
    assert_eq!(
        p.compact(),
        compact,
        "re-encoding differs from the server's"
    );
    assert_eq!(
        p.encode(),
        dump,
        "re-encoding differs from the server's DUMP"
    );
    p
}

// ---------------------------------------------------------------------------
// The judge: how Redis and the module must read a (mutated) payload.

#[derive(Clone, Debug, PartialEq)]
struct Holder {
    owner: Vec<u8>,
    reads: u64,
    writes: u64,
    token: u64,
    deadline: i64,
}

#[derive(Clone, Debug)]
struct Lock {
    family: Family,
    holders: Vec<Holder>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    Rlock,
    Fair,
    Rw,
}

impl Family {
    fn name(self) -> &'static str {
        match self {
            Family::Rlock => "rlock",
            Family::Fair => "fairlock",
            Family::Rw => "rwlock",
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Family::Rlock => "RLOCK",
            Family::Fair => "FAIRLOCK",
            Family::Rw => "RWLOCK",
        }
    }
}

#[derive(Debug)]
enum Verdict {
    /// Must be restored, with exactly these holders.
    Valid(Lock),
    /// Must be refused.
    Invalid(String),
    /// May go either way (the parsed lock, if the model could read it).
    Either(String, Option<Lock>),
}

/// Kind codes as the module saves them, learnt from real DUMPs.
type Codes = HashMap<u64, Family>;

/// Reads `payload` as Redis and the module do (the module id's low 10 bits
/// choose the layout: 1 and 2 load, anything else is refused), then applies
/// the rules every loader applies (issue 12): a known kind; at least one
/// holder; non-empty owners, each holding once; holds >= 1 and each count a
/// u32; READ holds only on a read-write lock; a writer alone; tokens unique,
/// in 1..=max (the clock floor a year ahead); deadlines >= 0.
fn judge(payload: &[u8], head: &[u8], codes: &Codes, now: i64) -> Verdict {
    if payload.len() < head.len() + 10 || payload[..2] != head[..2] {
        return Verdict::Either("type byte changed".into(), None);
    }
    let id = module_id(payload);
    if id >> 10 != module_id(head) >> 10 {
        return Verdict::Either("module type name changed".into(), None);
    }
    let mut r = RdbReader {
        buf: payload,
        pos: head.len(),
    };
    let (code, holders) = match read_value(&mut r, id & 1023) {
        Read::Ok(v) => v,
        Read::Bad(why) => return Verdict::Invalid(why.into()),
        Read::Unmodelled(why) => return Verdict::Either(why.into(), None),
    };
    // The module has read its value; Redis then wants the EOF opcode.
    match r.len() {
        Some((0, _)) => {}
        _ => return Verdict::Invalid("no EOF opcode after the value".into()),
    }
    let Some(&family) = codes.get(&code) else {
        return Verdict::Invalid(format!("unknown kind {code}"));
    };
    let lock = Lock { family, holders };
    let mut bad: Option<String> = None;
    let mut uncertain = None;
    let low = ((now + YEAR_MS - 5_000) as u64) << 20;
    for (i, h) in lock.holders.iter().enumerate() {
        let earlier = &lock.holders[..i];
        let why = if h.owner.is_empty() {
            "empty owner"
        } else if h.reads > u32::MAX as u64 || h.writes > u32::MAX as u64 {
            "hold count beyond u32"
        } else if h.reads + h.writes == 0 {
            "no holds"
        } else if family != Family::Rw && h.reads > 0 {
            "READ holds on an exclusive lock"
        } else if h.token == 0 || h.token > i64::MAX as u64 || h.token > token_bound(now) {
            "token out of range"
        } else if h.deadline < 0 {
            "negative deadline"
        } else if earlier.iter().any(|e| e.owner == h.owner) {
            "owner twice"
        } else if earlier.iter().any(|e| e.token == h.token) {
            "token twice"
        } else if i > 0 && (family != Family::Rw || h.writes > 0 || lock.holders[0].writes > 0) {
            "second holder with a writer or on an exclusive lock"
        } else {
            if h.token > low {
                uncertain = Some("token next to the accepted maximum");
            }
            continue;
        };
        bad.get_or_insert(why.to_string());
    }
    if lock.holders.is_empty() {
        bad.get_or_insert("no holders".into());
    }
    match (bad, uncertain) {
        (Some(why), _) => Verdict::Invalid(why),
        (None, Some(why)) => Verdict::Either(why.into(), Some(lock)),
        (None, None) => Verdict::Valid(lock),
    }
}

// ---------------------------------------------------------------------------
// Mutations.

fn extreme_tokens(now: i64) -> Vec<u64> {
    vec![
        0,
        1,
        2,
        (i64::MAX as u64),
        (1 << 63) + 5,
        u64::MAX,
        1 << 63,
        ((now + 10 * YEAR_MS) as u64) << 20, // far beyond the clock
        ((now + 2 * YEAR_MS) as u64) << 20,
        ((now as u64) << 20) + 12_345,  // in range
        ((now - YEAR_MS) as u64) << 20, // in range, old
    ]
}

fn extreme_deadlines(now: i64) -> Vec<u64> {
    [
        -1i64,
        i64::MIN,
        0,
        1,
        now - 60_000,    // ended
        now + 3_600_000, // an hour ahead
        i64::MAX,
        i64::MAX - 1,
    ]
    .into_iter()
    .map(|d| d as u64)
    .collect()
}

/// Compact-form leases as stored (relative to the token's millisecond), whatever
/// deadline they make: overflowing, negative, huge.
fn extreme_leases(token: u64) -> Vec<i64> {
    vec![
        i64::MIN,
        i64::MAX,
        i64::MAX - token_ms(token),
        i64::MAX - token_ms(token) + 1,
        -token_ms(token),
        -token_ms(token) - 1,
        -1,
        0,
        30_000,
    ]
}

const HOLD_COUNTS: [u64; 8] = [
    0,
    1,
    2,
    1000,
    u32::MAX as u64,
    u32::MAX as u64 + 1,
    u64::MAX,
    1 << 31,
];

/// Index of holder `h`'s field `f` (0 owner, 1 reads, 2 writes, 3 token, 4 deadline).
fn at(h: usize, f: usize) -> usize {
    2 + 5 * h + f
}

fn random_owner(rng: &mut Rng) -> Vec<u8> {
    // Redisson's `<uuid>:<threadId>`, which a one-holder lock keeps packed
    // (lock/compact.rs), and forms that must stay as they are: upper-case
    // hex, a thread id with a leading zero or out of a u64's range.
    let uuid = format!("0f3c2a9e-7b1d-4e5f-a6b7-{:012x}", rng.next() >> 16);
    match rng.below(9) {
        6 => format!("{uuid}:{}", rng.next() >> rng.below(64)).into_bytes(),
        7 => format!("{}:1", uuid.to_uppercase()).into_bytes(),
        8 => format!("{uuid}:0{}", rng.below(10)).into_bytes(),
        0 => Vec::new(),
        1 => b"\x00".to_vec(),
        2 => (0..rng.below(40) + 1).map(|_| rng.next() as u8).collect(),
        3 => vec![b'L'; 10_000],
        4 => rng.below(100_000).to_string().into_bytes(),
        _ => format!("owner-{}", rng.below(1000)).into_bytes(),
    }
}

/// A varint for `v` padded with `extra` continuation bytes (a longer, not
/// minimal, form of the same number; past ten bytes in all, not a varint).
fn padded_varint(v: u64, extra: usize) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(&mut out, v);
    let last = out.len() - 1;
    out[last] |= 0x80;
    out.extend(std::iter::repeat_n(0x80, extra.saturating_sub(1)));
    out.push(0);
    out
}

/// The number an item carries, if any.
fn number(item: &Item) -> Option<u64> {
    match item {
        Item::U(v) | Item::Fixed(v) => Some(*v),
        Item::Byte(b) => Some(*b as u64),
        Item::Lease(l) => Some(*l as u64),
        _ => None,
    }
}

/// One structured change to the items of `p` (which stays encodable).
fn mutate_items(
    rng: &mut Rng,
    p: &mut Payload,
    other: &Payload,
    codes: &Codes,
    now: i64,
) -> &'static str {
    let n = p.holder_count();
    let h = rng.index(n.max(1));
    let has = |p: &Payload, i: usize| i < p.items.len();
    let compact = p.enc.compact();
    // (A previous change may have left fewer items than a lock has.)
    match rng.below(13) {
        0 if p.items.len() >= 2 => {
            let c = number(&p.items[1]).unwrap_or(1);
            let v = rng.pick(&[
                0,
                1,
                2,
                c.wrapping_add(1),
                c.wrapping_sub(1),
                c.wrapping_add(100),
                u64::MAX,
                1 << 40,
            ]);
            p.items[1] = Item::U(v);
            "holder count changed"
        }
        1 if !p.items.is_empty() => {
            let mut known: Vec<u64> = codes.keys().copied().collect();
            known.extend([3, 7, 255]);
            if !compact {
                known.push(u64::MAX);
            }
            p.items[0] = p.kind_item(rng.pick(&known));
            "kind changed"
        }
        2 if has(p, at(h, 4)) => {
            p.set_token(h, rng.pick(&extreme_tokens(now)), rng.chance(3));
            "extreme token"
        }
        3 if has(p, at(h, 4)) => {
            if compact && rng.chance(2) {
                let t = p.token(h).unwrap_or(0);
                p.items[at(h, 4)] = Item::Lease(rng.pick(&extreme_leases(t)));
                "extreme lease"
            } else {
                p.set_deadline(h, rng.pick(&extreme_deadlines(now)) as i64);
                "extreme deadline"
            }
        }
        4 if has(p, at(h, 2)) => {
            let f = rng.pick(&[1, 2]);
            p.items[at(h, f)] = Item::U(rng.pick(&HOLD_COUNTS));
            "hold count extreme"
        }
        5 if has(p, at(h, 0)) => {
            p.items[at(h, 0)] = Item::S(random_owner(rng));
            "owner changed"
        }
        6 if n > 0 => {
            // Drop a holder, keeping or fixing the count.
            p.items.drain(at(h, 0)..at(h, 5));
            if rng.chance(2) {
                p.items[1] = Item::U((n - 1) as u64);
            }
            "holder dropped"
        }
        7 if n > 0 => {
            // Duplicate a holder (same owner and token), or a copy with a new
            // owner (same token), or a new owner and token (a second holder).
            let mut copy: Vec<Item> = p.items[at(h, 0)..at(h, 5)].to_vec();
            match rng.below(3) {
                0 => {}
                1 => copy[0] = Item::S(random_owner(rng)),
                _ => {
                    copy[0] = Item::S(format!("extra-{}", rng.below(1000)).into_bytes());
                    // (In the compact form the copied lease keeps the deadline: the new
                    // token's millisecond is the same.)
                    copy[3] = p.token_item(((now as u64) << 20) + 777 + rng.below(100));
                    if rng.chance(2) {
                        copy[1] = Item::U(rng.below(3));
                        copy[2] = Item::U(rng.below(3));
                    }
                }
            }
            let at_h = at(rng.index(n + 1), 0);
            p.items.splice(at_h..at_h, copy);
            if !rng.chance(4) {
                p.items[1] = Item::U((n + 1) as u64);
            }
            "holder added"
        }
        8 if !p.items.is_empty() => {
            // Type confusion: an integer where a string belongs, or the
            // reverse; in the compact form also a field of another width.
            let i = rng.index(p.items.len());
            let v = number(&p.items[i]).unwrap_or_else(|| rng.next());
            p.items[i] = match (&p.items[i], compact) {
                (Item::U(v), false) => Item::S(v.to_le_bytes().to_vec()),
                (_, false) => Item::U(rng.next()),
                (_, true) => match rng.below(5) {
                    0 => Item::U(v),
                    1 => Item::Fixed(v),
                    2 => Item::Byte(v as u8),
                    3 => Item::Lease(v as i64),
                    _ => Item::S(v.to_le_bytes().to_vec()),
                },
            };
            "item of the wrong type"
        }
        9 if has(p, at(h, 0)) => {
            let owner = match &p.items[at(h, 0)] {
                Item::S(s) => s.clone(),
                _ => b"x".to_vec(),
            };
            let len = rng.pick(&[
                owner.len() as u64 + 1,
                owner.len() as u64 + 1000,
                owner.len().saturating_sub(1) as u64,
                u32::MAX as u64,
                1 << 40,
                u64::MAX,
            ]);
            p.items[at(h, 0)] = Item::LyingString(len, owner);
            "string length lies"
        }
        10 if !compact => {
            match rng.below(4) {
                0 => p.eof = false,
                1 => p.items.push(Item::U(rng.next())),
                2 => p
                    .items
                    .push(Item::Raw(vec![rng.next() as u8; 1 + rng.index(8)])),
                _ => {
                    let i = rng.index(p.items.len() + 1);
                    p.items.insert(
                        i,
                        Item::Raw(vec![rng.pick(&[0x81, 0x80, 0xc3, 0xff, 0xbf])]),
                    );
                }
            }
            "framing changed"
        }
        10 => {
            // v2, v3: the string item around the compact form, and the varints in it.
            let numbered: Vec<usize> = (1..p.items.len())
                .filter(|&i| matches!(p.items[i], Item::U(_) | Item::Lease(_)))
                .collect();
            match rng.below(8) {
                0 => {
                    p.eof = false;
                    "compact framing: no EOF"
                }
                1 => {
                    let extra = if rng.chance(2) {
                        Item::U(rng.next())
                    } else {
                        Item::S(b"more".to_vec())
                    };
                    p.after.push(extra);
                    "compact framing: an item after the string"
                }
                2 => {
                    p.items
                        .push(Item::Raw(vec![rng.next() as u8; 1 + rng.index(8)]));
                    "compact framing: trailing bytes in the string"
                }
                3 => {
                    let len = p.compact().len() as u64;
                    p.outer_len = Some(rng.pick(&[
                        len + 1,
                        len.saturating_sub(1),
                        len + 1000,
                        0,
                        u32::MAX as u64,
                        1 << 40,
                        u64::MAX,
                    ]));
                    "compact framing: string length lies"
                }
                4 if !numbered.is_empty() => {
                    // A padded varint: ten bytes at most is the same number.
                    let i = rng.pick(&numbered);
                    let v = match &p.items[i] {
                        Item::Lease(l) => zigzag(*l),
                        other => number(other).unwrap(),
                    };
                    let mut min = Vec::new();
                    put_varint(&mut min, v);
                    let extra = rng.pick(&[1, 2, 10 - min.len().min(9), 11 - min.len().min(10)]);
                    p.items[i] = Item::Raw(padded_varint(v, extra.max(1)));
                    "compact varint padded"
                }
                5 if !numbered.is_empty() => {
                    let i = rng.pick(&numbered);
                    let mut v = vec![0xffu8; 9];
                    v.push(rng.pick(&[0x01, 0x02, 0x7f, 0x81]));
                    if rng.chance(3) {
                        v[..9].fill(0x80);
                    }
                    p.items[i] = Item::Raw(v);
                    "compact varint at or past u64"
                }
                6 => {
                    let i = rng.index(p.items.len() + 1);
                    p.items.insert(
                        i,
                        Item::Raw(vec![rng.pick(&[0x80, 0xff, 0x00, 0x01, 0x7f])]),
                    );
                    "compact byte inserted"
                }
                _ => {
                    // The compact form cut inside, its string length right.
                    let compact = p.compact();
                    let cut = rng.index(compact.len());
                    p.items = vec![Item::Raw(compact[..cut].to_vec())];
                    "compact cut inside the string"
                }
            }
        }
        11 => {
            // The module id's encoding version: the other layout's loader, or
            // one the module does not know.
            let own = module_id(&p.head) & 1023;
            let others: Vec<u64> = [1, 2, 3, 0, 4, 1023]
                .into_iter()
                .filter(|&v| v != own)
                .collect();
            p.set_encver(rng.pick(&others));
            "encoding version changed"
        }
        _ => {
            // Splice: this value's kind and count with another's holders.
            let keep = 2.min(p.items.len());
            p.items.truncate(keep);
            p.items.extend(other.items.iter().skip(2).cloned());
            "holders from another value"
        }
    }
}

struct Case {
    payload: Vec<u8>,
    label: &'static str,
    base: usize,
}

/// The corpus: every cut point of the smaller payloads (in v2 and v3 also every
/// cut of the compact string inside a right string length), then random byte
/// and structured mutations up to `total`, a fifth of them each on v1 and v2
/// bases, the rest on v3 (what DUMP writes).
fn corpus(rng: &mut Rng, bases: &[Payload], codes: &Codes, total: usize, now: i64) -> Vec<Case> {
    let mut out = Vec::new();
    let cuts = |rng: &mut Rng, len: usize| -> Vec<usize> {
        if len <= 400 {
            (0..len).collect()
        } else {
            (0..150).map(|_| rng.index(len)).collect()
        }
    };
    for (b, p) in bases.iter().enumerate() {
        let body = p.body();
        for cut in cuts(rng, body.len()) {
            out.push(Case {
                payload: with_footer(&body[..cut], p.version),
                label: "truncated",
                base: b,
            });
        }
        if p.enc.compact() {
            let compact = p.compact();
            for cut in cuts(rng, compact.len()) {
                let mut m = p.clone();
                m.items = vec![Item::Raw(compact[..cut].to_vec())];
                out.push(Case {
                    payload: m.encode(),
                    label: "compact string truncated",
                    base: b,
                });
            }
        }
    }
    let of =
        |enc: Enc| -> Vec<usize> { (0..bases.len()).filter(|&b| bases[b].enc == enc).collect() };
    let layouts = [of(Enc::V1), of(Enc::V2), of(Enc::V3)];
    while out.len() < total {
        let b = match rng.below(5) {
            0 => rng.pick(&layouts[0]),
            1 => rng.pick(&layouts[1]),
            _ => rng.pick(&layouts[2]),
        };
        let p = &bases[b];
        let case = match rng.below(10) {
            0..=2 => {
                let mut body = p.body();
                let flips = 1 + rng.below(3);
                for _ in 0..flips {
                    // Mostly past the header, where the module reads.
                    let from = if rng.chance(10) { 0 } else { p.head.len() };
                    let i = from + rng.index(body.len() - from);
                    body[i] ^= 1 << rng.below(8);
                }
                Case {
                    payload: with_footer(&body, p.version),
                    label: "bit flips",
                    base: b,
                }
            }
            3 => {
                let mut body = p.body();
                let i = p.head.len() + rng.index(body.len() - p.head.len());
                body[i] = rng.pick(&[0x00, 0xff, 0x80, 0x81, 0x7f, 0xc0, 0xc3, 0x40, 0x05, 0x02]);
                Case {
                    payload: with_footer(&body, p.version),
                    label: "byte overwritten",
                    base: b,
                }
            }
            _ => {
                let mut m = p.clone();
                let same = &layouts[p.enc.index()];
                let other = &bases[rng.pick(same)];
                let mut label = mutate_items(rng, &mut m, other, codes, now);
                if rng.chance(4) {
                    mutate_items(rng, &mut m, other, codes, now);
                    label = "several structured changes";
                }
                Case {
                    payload: m.encode(),
                    label,
                    base: b,
                }
            }
        };
        out.push(case);
    }
    out
}

// ---------------------------------------------------------------------------
// Reading the server's view of a key.

/// One holder as `*.INFO` shows it.
#[derive(Debug, Clone)]
struct Seen {
    owner: Vec<u8>,
    reads: u64,
    writes: u64,
    token: u64,
    ttl: i64,
}

fn bulk(v: &Value) -> Vec<u8> {
    match v {
        Value::BulkString(b) => b.clone(),
        other => panic!("not a bulk string: {other:?}"),
    }
}

/// The holders an `*.INFO` reply lists, checked for shape and range.
fn seen_holders(family: Family, info: &[(String, Value)], bound: u64) -> Vec<Seen> {
    assert_eq!(as_string(&field(info, "kind")), family.name());
    let mut out: Vec<Seen> = Vec::new();
    match family {
        Family::Rlock | Family::Fair => {
            out.push(Seen {
                owner: bulk(&field(info, "owner")),
                reads: 0,
                writes: as_int(&field(info, "holds")) as u64,
                token: as_int(&field(info, "token")) as u64,
                ttl: as_int(&field(info, "ttl")),
            });
        }
        Family::Rw => {
            if let Value::BulkString(w) = field(info, "writer") {
                out.push(Seen {
                    owner: w,
                    reads: 0,
                    writes: as_int(&field(info, "writer_holds")) as u64,
                    token: as_int(&field(info, "writer_token")) as u64,
                    ttl: as_int(&field(info, "ttl")),
                });
            }
            let Value::Array(readers) = field(info, "readers") else {
                panic!("readers: {info:?}")
            };
            for r in readers {
                let r = parse_info(r).expect("reader");
                let owner = bulk(&field(&r, "owner"));
                let reads = as_int(&field(&r, "holds")) as u64;
                let token = as_int(&field(&r, "token")) as u64;
                let ttl = as_int(&field(&r, "ttl"));
                match out.iter_mut().find(|s| s.owner == owner) {
                    Some(w) => {
                        assert_eq!(w.token, token, "writer and its reads differ: {info:?}");
                        w.reads = reads;
                    }
                    None => out.push(Seen {
                        owner,
                        reads,
                        writes: 0,
                        token,
                        ttl,
                    }),
                }
            }
            let writers = out.iter().filter(|s| s.writes > 0).count();
            assert!(
                writers == 0 || (writers == 1 && out.len() == 1),
                "a writer with other holders: {info:?}"
            );
        }
    }
    for s in &out {
        assert!(!s.owner.is_empty(), "empty owner: {info:?}");
        assert!(s.reads + s.writes >= 1, "holder without holds: {info:?}");
        assert!(
            s.token >= 1 && s.token <= bound,
            "token {} out of range: {info:?}",
            s.token
        );
        assert!(s.ttl >= 0, "negative ttl shown: {info:?}");
    }
    out
}

/// Checks the holders shown against the ones the payload encodes: those
/// whose deadline is clearly ahead must be shown exactly, those clearly past
/// must not be, and nobody else.
fn compare(seen: &[Seen], lock: &Lock, now: i64, what: &str) {
    for s in seen {
        let h = lock
            .holders
            .iter()
            .find(|h| h.owner == s.owner)
            .unwrap_or_else(|| panic!("{what}: shown holder {s:?} is not in {lock:?}"));
        assert_eq!(
            (s.reads, s.writes, s.token),
            (h.reads, h.writes, h.token),
            "{what}: holder differs from the payload ({lock:?})"
        );
        assert!(
            h.deadline >= now - 3_000,
            "{what}: ended holder shown: {h:?}"
        );
    }
    for h in &lock.holders {
        if h.deadline > now + 3_000 {
            assert!(
                seen.iter().any(|s| s.owner == h.owner),
                "{what}: live holder {h:?} not shown ({seen:?})"
            );
        }
    }
}

fn exec(c: &mut Connection, commands: &[Vec<Vec<u8>>]) -> Vec<Value> {
    let mut p = redis::pipe();
    p.atomic();
    for args in commands {
        let mut one = cmd(std::str::from_utf8(&args[0]).unwrap());
        for a in &args[1..] {
            one.arg(&a[..]);
        }
        p.add_command(one);
    }
    let packed = p.get_packed_pipeline();
    let mut replies = c
        .req_packed_commands(&packed, commands.len() + 1, 1)
        .expect("EXEC");
    match replies.pop() {
        Some(Value::Array(v)) => v,
        other => panic!("EXEC: {other:?}"),
    }
}

fn args(parts: &[&[u8]]) -> Vec<Vec<u8>> {
    parts.iter().map(|p| p.to_vec()).collect()
}

fn server_error(v: &Value) -> Option<String> {
    match v {
        Value::ServerError(e) => Some(
            format!("{} {}", e.code(), e.details().unwrap_or(""))
                .trim()
                .to_string(),
        ),
        _ => None,
    }
}

/// A base lock: its payload (v3 as DUMP wrote it, or v1 or v2 crafted from it), the
/// payload's bytes and its family.
struct Base {
    p: Payload,
    dump: Vec<u8>,
    family: Family,
}

/// Counts of what happened, for the report.
#[derive(Default, Debug)]
struct Tally {
    /// Per layout of the base (v1, v2, v3): tried, refused, restored.
    by_enc: [(usize, usize, usize); 3],
    tried: usize,
    refused: usize,
    restored: usize,
    restored_ended: usize,
    released_by_owner: usize,
    force_released: usize,
    either: usize,
    either_why: HashMap<String, usize>,
    by_label: HashMap<(Enc, &'static str), (usize, usize)>,
}

/// Restores one case under `key` and checks everything. Returns the highest
/// token the restored value carried (0 if refused).
#[allow(clippy::too_many_arguments)]
fn run_case(
    c: &mut Connection,
    rng: &mut Rng,
    case: &Case,
    i: usize,
    bases: &[Base],
    codes: &Codes,
    tally: &mut Tally,
    vanish: &mut Vec<(Vec<u8>, Instant, String)>,
) -> u64 {
    let key = format!("k:{i}").into_bytes();
    let now = now_ms();
    let base = &bases[case.base];
    let verdict = judge(&case.payload, &base.p.head, codes, now);
    let enc = base.p.enc;
    let what = format!(
        "case {i} ({}, base {} in {enc:?}): {verdict:?}",
        case.label, case.base
    );
    // A quarter of the cases replace an existing lock.
    let replaced = i.is_multiple_of(4);
    let (old_payload, old_family) = (&base.dump, base.family);
    if replaced {
        let mut restore = cmd("RESTORE");
        restore.arg(&key[..]).arg(0).arg(&old_payload[..]);
        let _: () = restore.query(c).unwrap();
    }
    // TTL variants: none, a TTL, or an absolute TTL already past (Redis then
    // loads the value and drops it at once).
    let past_abs = i % 29 == 3;
    let mut restore: Vec<Vec<u8>> = args(&[b"RESTORE", &key]);
    if past_abs {
        restore.push((now - 1_000).to_string().into_bytes());
    } else if i % 7 == 1 {
        restore.push(b"600000".to_vec());
    } else {
        restore.push(b"0".to_vec());
    }
    restore.push(case.payload.clone());
    restore.push(b"REPLACE".to_vec());
    if past_abs {
        restore.push(b"ABSTTL".to_vec());
    }
    // The replaced lock's digest is taken in the same transaction: the lease
    // timer may set its TTL (part of the digest) to the latest deadline on
    // any tick after the RESTORE above.
    let mut snapshot = exec(
        c,
        &[
            args(&[b"DEBUG", b"DIGEST-VALUE", &key]),
            restore,
            args(&[b"TYPE", &key]),
            args(&[b"RLOCK.INFO", &key]),
            args(&[b"FAIRLOCK.INFO", &key]),
            args(&[b"RWLOCK.INFO", &key]),
            args(&[b"DEBUG", b"DIGEST-VALUE", &key]),
        ],
    );
    let before = snapshot.remove(0);
    tally.tried += 1;
    tally.by_enc[enc.index()].0 += 1;
    let entry = tally.by_label.entry((enc, case.label)).or_default();
    let snap_now = now_ms();
    let key_type = as_string(&snapshot[1]);
    if let Some(e) = server_error(&snapshot[0]) {
        tally.refused += 1;
        tally.by_enc[enc.index()].1 += 1;
        entry.1 += 1;
        assert_eq!(
            e, "ERR Bad data format",
            "{what}: refused with another error"
        );
        assert!(
            !matches!(verdict, Verdict::Valid(_)),
            "{what}: a valid payload was refused"
        );
        if let Verdict::Either(why, _) = &verdict {
            tally.either += 1;
            *tally.either_why.entry(why.clone()).or_default() += 1;
        }
        // A refused RESTORE changes nothing.
        if replaced {
            assert_eq!(key_type, "rlock-lck", "{what}");
            let digest = |v: &Value| match v {
                Value::Array(d) if d.len() == 1 => as_string(&d[0]),
                other => panic!("{what}: DEBUG DIGEST-VALUE gave {other:?}"),
            };
            assert_eq!(
                digest(&snapshot[5]),
                digest(&before),
                "{what}: the replaced lock changed"
            );
            let n = int(
                c,
                &[
                    &format!("{}.FORCERELEASE", old_family.prefix()),
                    &format!("k:{i}"),
                ],
            );
            assert_eq!(n, 1, "{what}");
            vanish.push((key, Instant::now(), what));
        } else {
            assert_eq!(key_type, "none", "{what}: refused but the key exists");
        }
        return 0;
    }
    assert_eq!(snapshot[0], Value::Okay, "{what}");
    tally.restored += 1;
    tally.by_enc[enc.index()].2 += 1;
    entry.0 += 1;
    if let Verdict::Invalid(why) = &verdict {
        panic!("{what}: restored an invalid payload ({why})");
    }
    if let Verdict::Either(why, _) = &verdict {
        tally.either += 1;
        *tally.either_why.entry(why.clone()).or_default() += 1;
    }
    let lock = match &verdict {
        Verdict::Valid(l) | Verdict::Either(_, Some(l)) => Some(l.clone()),
        _ => None,
    };
    let top_token = lock
        .as_ref()
        .map_or(0, |l| l.holders.iter().map(|h| h.token).max().unwrap_or(0));
    if past_abs {
        assert_eq!(
            key_type, "none",
            "{what}: ABSTTL in the past must not create the key"
        );
        return top_token;
    }
    if key_type != "rlock-lck" {
        // Only a changed type byte can make another type; it is not ours.
        assert!(lock.is_none(), "{what}: restored as {key_type}");
        let _ = call(c, &["DEL", &format!("k:{i}")]);
        return 0;
    }
    if matches!(&verdict, Verdict::Either(why, None) if why == SEMAPHORE_LAYOUT) {
        // Restored as a semaphore (the lock families all say WRONGTYPE): its
        // own test checks what such values hold. Forced out like any other.
        for reply in &snapshot[2..5] {
            let e = server_error(reply).unwrap_or_else(|| panic!("{what}: a lock family answers"));
            assert!(e.starts_with("WRONGTYPE"), "{what}: {e}");
        }
        assert_eq!(
            int(c, &["SEMAPHORE.FORCERELEASE", &format!("k:{i}")]),
            1,
            "{what}"
        );
        return 0;
    }
    // Exactly one family answers; the others say WRONGTYPE.
    let mut family = None;
    for (f, reply) in [Family::Rlock, Family::Fair, Family::Rw]
        .into_iter()
        .zip(&snapshot[2..5])
    {
        match server_error(reply) {
            Some(e) => assert!(e.starts_with("WRONGTYPE"), "{what}: {e}"),
            None => {
                assert!(family.is_none(), "{what}: two families answer");
                family = Some((f, reply.clone()));
            }
        }
    }
    let (family, info) = family.unwrap_or_else(|| panic!("{what}: no family answers"));
    match &snapshot[5] {
        Value::Array(d) if d.len() == 1 => {
            let d = as_string(&d[0]);
            assert!(
                d.len() == 40 && d.bytes().all(|b| b.is_ascii_hexdigit()),
                "{what}: digest {d}"
            );
        }
        other => panic!("{what}: DEBUG DIGEST-VALUE gave {other:?}"),
    }
    if let Some(l) = &lock {
        assert_eq!(l.family, family, "{what}");
    }
    let bound = token_bound(snap_now);
    let seen = match parse_info(info) {
        None => Vec::new(),
        Some(info) => seen_holders(family, &info, bound),
    };
    if let Some(l) = &lock {
        compare(&seen, l, snap_now, &what);
    }
    let top_token = top_token.max(seen.iter().map(|s| s.token).max().unwrap_or(0));
    if seen.is_empty() {
        // Every lease already ended: the lock must leave the keyspace by itself.
        tally.restored_ended += 1;
        vanish.push((key, Instant::now(), what));
        return top_token;
    }
    // Release it: by its owners (every hold), or by force.
    let sure = seen.iter().all(|s| s.ttl > 3_000);
    let small = seen.iter().all(|s| s.reads + s.writes <= 20);
    let k = format!("k:{i}");
    if small && rng.chance(2) {
        tally.released_by_owner += 1;
        for s in &seen {
            let owner = &s.owner[..];
            for (mode, n) in [("WRITE", s.writes), ("READ", s.reads)] {
                for left in (0..n).rev() {
                    let mut release = cmd(&format!("{}.RELEASE", family.prefix()));
                    release.arg(&k);
                    if family == Family::Rw {
                        release.arg(mode);
                    }
                    release.arg(owner);
                    let r: redis::RedisResult<i64> = release.query(c);
                    match r {
                        Ok(v) => assert_eq!(v as u64, left, "{what}: release by {s:?}"),
                        Err(e) => assert!(!sure, "{what}: release by {s:?}: {e}"),
                    }
                }
            }
        }
    } else {
        tally.force_released += 1;
        let n = int(c, &[&format!("{}.FORCERELEASE", family.prefix()), &k]);
        assert!(n == 1 || !sure, "{what}: FORCERELEASE gave {n}");
    }
    vanish.push((key, Instant::now(), what));
    top_token
}

/// Every key in `vanish` must be gone within a second of being listed.
fn check_vanished(c: &mut Connection, vanish: &mut Vec<(Vec<u8>, Instant, String)>) {
    for (key, since, what) in vanish.drain(..) {
        loop {
            let exists: i64 = cmd("EXISTS").arg(&key[..]).query(c).unwrap();
            if exists == 0 {
                break;
            }
            assert!(
                since.elapsed() < Duration::from_secs(1),
                "{what}: the key is still there a second after its last lease ended or was released\n{:?}",
                call(c, &["PTTL", std::str::from_utf8(&key).unwrap()])
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// A base lock: its key, family and the commands that make it.
type Recipe = (&'static str, Family, Vec<Vec<Vec<u8>>>);

/// `RESTORE key 0 payload`, then the value's `DEBUG DIGEST-VALUE`.
fn restored_digest(c: &mut Connection, key: &str, payload: &[u8]) -> Vec<String> {
    // In one transaction: the lease timer sets a restored lock's TTL (part of
    // the digest) on its next tick.
    let (digest,): (Vec<String>,) = redis::pipe()
        .atomic()
        .cmd("RESTORE")
        .arg(key)
        .arg(0)
        .arg(payload)
        .ignore()
        .cmd("DEBUG")
        .arg("DIGEST-VALUE")
        .arg(key)
        .query(c)
        .unwrap();
    digest
}

/// Makes the base locks on `c` and returns their DUMP payloads (encoding
/// version 3), parsed, then the same states crafted in versions 1 and 2.
fn base_locks(c: &mut Connection) -> Vec<Base> {
    let long_owner = "o".repeat(16 * 1024);
    let binary_owner: &[u8] = b"\x00bin\r\n\xff owner";
    let px = ["PX", "600000"];
    let mut make: Vec<Recipe> = Vec::new();
    let acquire = |family: Family, key: &str, mode: Option<&str>, owner: &[u8], px: &[&str]| {
        let mut a: Vec<Vec<u8>> = vec![
            format!("{}.ACQUIRE", family.prefix()).into_bytes(),
            key.as_bytes().to_vec(),
        ];
        if let Some(m) = mode {
            a.push(m.as_bytes().to_vec());
        }
        a.push(owner.to_vec());
        a.extend(px.iter().map(|s| s.as_bytes().to_vec()));
        a
    };
    make.push((
        "b:r1",
        Family::Rlock,
        vec![acquire(Family::Rlock, "b:r1", None, b"worker-1", &px)],
    ));
    make.push((
        "b:r2",
        Family::Rlock,
        vec![acquire(Family::Rlock, "b:r2", None, binary_owner, &px); 3],
    ));
    make.push((
        "b:r3",
        Family::Rlock,
        vec![acquire(
            Family::Rlock,
            "b:r3",
            None,
            long_owner.as_bytes(),
            &px,
        )],
    ));
    make.push((
        "b:r4",
        Family::Rlock,
        vec![acquire(Family::Rlock, "b:r4", None, b"12345", &px)],
    ));
    make.push((
        "b:f1",
        Family::Fair,
        vec![acquire(Family::Fair, "b:f1", None, b"fair-owner", &px); 2],
    ));
    make.push((
        "b:f2",
        Family::Fair,
        vec![acquire(Family::Fair, "b:f2", None, b"f", &px)],
    ));
    make.push((
        "b:w1",
        Family::Rw,
        vec![acquire(Family::Rw, "b:w1", Some("WRITE"), b"writer", &px); 2],
    ));
    make.push((
        "b:w2",
        Family::Rw,
        vec![
            acquire(Family::Rw, "b:w2", Some("WRITE"), b"w", &px),
            acquire(Family::Rw, "b:w2", Some("READ"), b"w", &px),
        ],
    ));
    make.push((
        "b:rw3",
        Family::Rw,
        vec![
            acquire(Family::Rw, "b:rw3", Some("READ"), b"r1", &px),
            acquire(Family::Rw, "b:rw3", Some("READ"), b"r2", &px),
            acquire(Family::Rw, "b:rw3", Some("READ"), b"r2", &["PX", "900000"]),
            acquire(Family::Rw, "b:rw3", Some("READ"), b"r3", &px),
        ],
    ));
    let mut twelve: Vec<Vec<Vec<u8>>> = (0..11)
        .map(|r| {
            acquire(
                Family::Rw,
                "b:rw12",
                Some("READ"),
                format!("reader-{r}").as_bytes(),
                &px,
            )
        })
        .collect();
    twelve.push(acquire(
        Family::Rw,
        "b:rw12",
        Some("READ"),
        "R".repeat(2048).as_bytes(),
        &px,
    ));
    make.push(("b:rw12", Family::Rw, twelve));
    let mut out = Vec::new();
    let mut older = Vec::new();
    for (key, family, commands) in make {
        for a in commands {
            let mut one = cmd(std::str::from_utf8(&a[0]).unwrap());
            a[1..].iter().for_each(|x| {
                one.arg(&x[..]);
            });
            let t: i64 = one.query(c).unwrap();
            assert!(t > 0);
        }
        let dump: Vec<u8> = cmd("DUMP").arg(key).query(c).unwrap();
        let p = parse_dump(&dump);
        let _: i64 = cmd("DEL").arg(key).query(c).unwrap();
        // The digest of the value restored without a TTL (a key's TTL is part
        // of its digest), as the fuzz loop restores it before replacing it.
        let digest = restored_digest(c, key, &dump);
        let _: i64 = cmd("DEL").arg(key).query(c).unwrap();
        // The same state in the older layouts loads as exactly that state:
        // the same digest, and DUMP writes it back byte for byte in version 3.
        for enc in [Enc::V1, Enc::V2] {
            let old = p.in_layout(enc);
            assert_eq!(module_id(&old.head) & 1023, enc.number());
            let old_dump = old.encode();
            let old_digest = restored_digest(c, key, &old_dump);
            assert_eq!(
                old_digest, digest,
                "{key}: {enc:?} payload of the same state"
            );
            let again: Vec<u8> = cmd("DUMP").arg(key).query(c).unwrap();
            assert_eq!(again, dump, "{key}: {enc:?} payload re-dumped");
            let _: i64 = cmd("DEL").arg(key).query(c).unwrap();
            older.push(Base {
                p: old,
                dump: old_dump,
                family,
            });
        }
        out.push(Base { p, dump, family });
    }
    out.extend(older);
    out
}

/// The kind codes, learnt from the DUMPs (the compact form's kind byte) and
/// checked against the v1 layout's kind item.
fn kind_codes(bases: &[Base]) -> Codes {
    let mut codes = Codes::new();
    for b in bases {
        let code = match (b.p.enc, &b.p.items[0]) {
            (Enc::V2 | Enc::V3, Item::Byte(code)) => *code as u64,
            (Enc::V1, Item::U(code)) => *code,
            other => panic!("kind item {other:?}"),
        };
        assert_eq!(*codes.entry(code).or_insert(b.family), b.family);
    }
    assert_eq!(codes.len(), 3);
    codes
}

/// Calls every command the fuzz loop uses once, so Redis's per-command
/// structures (latency histograms...) exist before the memory baseline.
fn warm_up(c: &mut Connection, bases: &[Base]) {
    for (i, Base { dump, family, .. }) in bases.iter().enumerate() {
        let key = format!("warm:{i}");
        let _ = exec(
            c,
            &[
                args(&[b"RESTORE", key.as_bytes(), b"0", dump, b"REPLACE"]),
                args(&[b"TYPE", key.as_bytes()]),
                args(&[b"RLOCK.INFO", key.as_bytes()]),
                args(&[b"FAIRLOCK.INFO", key.as_bytes()]),
                args(&[b"RWLOCK.INFO", key.as_bytes()]),
                args(&[b"DEBUG", b"DIGEST-VALUE", key.as_bytes()]),
            ],
        );
        let _ = call(c, &["RESTORE", &key, "0", "garbage"]);
        let _ = call(c, &["RLOCK.RELEASE", &key, "nobody"]);
        let _ = call(c, &["FAIRLOCK.RELEASE", &key, "nobody"]);
        let _ = call(c, &["RWLOCK.RELEASE", &key, "READ", "nobody"]);
        let _ = call(c, &[&format!("{}.FORCERELEASE", family.prefix()), &key]);
        let _ = call(c, &["EXISTS", &key]);
        let _ = call(c, &["PTTL", &key]);
        let _ = call(c, &["DEL", &key]);
    }
    let _ = call(c, &["PING"]);
    let _ = call(c, &["DBSIZE"]);
    let _: String = cmd("INFO").arg("rlock").query(c).unwrap();
    let _ = dataset_bytes(c);
}

/// Settles the server: no keys, nothing scheduled, no lock values alive.
fn assert_clean(c: &mut Connection, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let counts = (
            int(c, &["DBSIZE"]),
            stat(c, "locks"),
            stat(c, "lease_schedule"),
        );
        if counts == (0, 0, 0) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: (keys, rlock_locks, rlock_lease_schedule) = {counts:?}, not all 0"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn mutated_dump_payloads_are_refused_or_restored_valid() {
    let started = Instant::now();
    let mut rng = Rng(seed("restore"));
    let s = Server::start_with(
        &["--save", "", "--appendonly", "no", "--rdbcompression", "no"],
        &[],
    );
    let mut c = s.client();
    let bases = base_locks(&mut c);
    let codes = kind_codes(&bases);
    let payloads: Vec<Payload> = bases.iter().map(|b| b.p.clone()).collect();
    let now = now_ms();
    // RLOCK_FUZZ_CASES=<n> runs a longer (or shorter) corpus by hand.
    let total = std::env::var("RLOCK_FUZZ_CASES")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(20_000);
    let cases = corpus(&mut rng, &payloads, &codes, total, now);
    let mut max_token: u64 = 0;
    for b in &bases {
        for h in b.p.fields().1 {
            max_token = max_token.max(h.token);
        }
    }

    warm_up(&mut c, &bases);
    // The first cases warm the rest up (the keyspace, the lease schedule).
    let mut tally = Tally::default();
    let mut vanish = Vec::new();
    let warm = 200;
    for (i, case) in cases.iter().enumerate().take(warm) {
        let t = run_case(
            &mut c,
            &mut rng,
            case,
            i,
            &bases,
            &codes,
            &mut tally,
            &mut vanish,
        );
        max_token = max_token.max(t);
    }
    check_vanished(&mut c, &mut vanish);
    assert_clean(&mut c, "after warm-up");
    let baseline = dataset_bytes(&mut c);

    for (i, case) in cases.iter().enumerate().skip(warm) {
        let t = run_case(
            &mut c,
            &mut rng,
            case,
            i,
            &bases,
            &codes,
            &mut tally,
            &mut vanish,
        );
        max_token = max_token.max(t);
        if i.is_multiple_of(500) {
            assert_eq!(
                call(&mut c, &["PING"]).unwrap(),
                Value::SimpleString("PONG".into())
            );
            check_vanished(&mut c, &mut vanish);
        }
    }
    check_vanished(&mut c, &mut vanish);
    assert_clean(&mut c, "after the corpus");
    let after = dataset_bytes(&mut c);
    eprintln!(
        "restore: {} payloads tried, {} refused, {} restored ({} with every lease ended, \
         {} released by their owners, {} force-released), {} undecided by the model; \
         dataset.bytes {baseline} -> {after}; {:?}",
        tally.tried,
        tally.refused,
        tally.restored,
        tally.restored_ended,
        tally.released_by_owner,
        tally.force_released,
        tally.either,
        started.elapsed()
    );
    for enc in [Enc::V1, Enc::V2, Enc::V3] {
        let (tried, refused, restored) = tally.by_enc[enc.index()];
        eprintln!("  {enc:?} bases: {tried} tried, {refused} refused, {restored} restored");
    }
    eprintln!("  undecided: {:?}", tally.either_why);
    let mut labels: Vec<_> = tally.by_label.iter().collect();
    labels.sort();
    for ((enc, label), (ok, refused)) in labels {
        eprintln!("  {enc:?} {label}: {ok} restored, {refused} refused");
    }
    assert!(tally.tried >= total.min(10_000));
    // Issue 12's 10,000 mutations of what DUMP writes (version 3).
    assert!(tally.by_enc[Enc::V3.index()].0 >= (total / 2).min(10_000));
    assert!(tally.refused > 1000 && tally.restored > 1000, "{tally:?}");
    // Every loader gets a real share of both outcomes.
    for enc in [Enc::V1, Enc::V2, Enc::V3] {
        let (tried, refused, restored) = tally.by_enc[enc.index()];
        let share = total / 10;
        assert!(
            tried >= share && refused >= share / 4 && restored >= share / 4,
            "{enc:?}: {tried} tried, {refused} refused, {restored} restored"
        );
    }
    // Nothing kept per payload: one leaked allocation per payload tried would
    // be at least 20,000 x 16 bytes. The bound leaves room for the server's
    // own accounting, which on Redis 8.2 moves from run to run with the same
    // seed (556-638 KB after the corpus from a 573 KB baseline, four runs;
    // not traced further), while Redis 7.0 gives the same figure every run.
    assert!(
        after - baseline < 128 * 1024,
        "dataset.bytes grew from {baseline} to {after}"
    );

    // Tokens are not poisoned: a fresh grant is above everything seen, below
    // the clock floor a year ahead.
    let t = int(&mut c, &["RLOCK.ACQUIRE", "fresh", "me"]) as u64;
    let now = now_ms();
    assert!(t > max_token, "fresh token {t} not above {max_token}");
    assert!(
        t < ((now + YEAR_MS) as u64) << 20,
        "fresh token {t} beyond the clock"
    );
    assert!(stat(&mut c, "last_token") as u64 == t);
    assert!(s.log().contains("rlock: refused a lock value"));
    assert!(!s.log().contains("Guru Meditation"));
}

// ---------------------------------------------------------------------------
// The same mutations inside an RDB file loaded at startup.

/// Lines that mean the server crashed rather than refused.
fn crashed(log: &str) -> bool {
    [
        "Guru Meditation",
        "crashed by signal",
        "BUG REPORT",
        "panicked",
    ]
    .iter()
    .any(|m| log.contains(m))
}

/// The file was refused and Redis went on to check it itself: the module
/// refused a value, or read one that was whole and valid with more bytes
/// after it, which Redis finds as a missing end-of-value marker.
fn redis_check_after_refusal(log: &str) -> bool {
    let refused = log.contains("rlock: refused a lock value:")
        || log.contains("not terminated by the proper module value EOF marker");
    refused && log.contains("Internal error in RDB reading")
}

#[test]
fn corrupt_lock_values_in_an_rdb_file_load_valid_or_refuse_to_start() {
    let started = Instant::now();
    let mut rng = Rng(seed("rdb"));
    let mut s = Server::start_with(
        &["--save", "", "--appendonly", "no", "--rdbcompression", "no"],
        &[],
    );
    let mut c = s.client();
    let codes = kind_codes(&base_locks(&mut c));
    for r in ["r1", "r2", "r3"] {
        int(
            &mut c,
            &["RWLOCK.ACQUIRE", "victim", "READ", r, "PX", "600000"],
        );
    }
    let other_token = int(&mut c, &["RLOCK.ACQUIRE", "other", "o", "PX", "600000"]);
    let _: () = cmd("SET").arg("plain").arg("v").query(&mut c).unwrap();
    let victim = parse_dump(&cmd("DUMP").arg("victim").query::<Vec<u8>>(&mut c).unwrap());
    let _: () = cmd("SAVE").query(&mut c).unwrap();
    s.kill();
    let rdb_path = s.dir.join("dump.rdb");
    let rdb = std::fs::read(&rdb_path).unwrap();
    let crc = u64::from_le_bytes(rdb[rdb.len() - 8..].try_into().unwrap());
    assert_eq!(
        crc64(&rdb[..rdb.len() - 8]),
        crc,
        "RDB checksum differs from ours"
    );
    // The value in the file is the DUMP body after its type byte.
    let value = &victim.body()[1..];
    let pos = rdb
        .windows(value.len())
        .position(|w| w == value)
        .expect("the lock value in dump.rdb");
    assert!(
        rdb[pos + 1..].windows(value.len()).all(|w| w != value),
        "found twice"
    );

    let now = now_ms();
    let mut mutations: Vec<(String, Payload, bool)> = Vec::new();
    for victim in [
        victim.clone(),
        victim.in_layout(Enc::V2),
        victim.in_layout(Enc::V1),
    ] {
        let v = format!("{:?}", victim.enc);
        let mut push = |label: &str, m: Payload, must_load: bool| {
            mutations.push((format!("{v} {label}"), m, must_load));
        };
        let mut m = victim.clone();
        m.items.truncate(2);
        if victim.enc == Enc::V1 {
            m.eof = false;
        }
        push("cut after the holder count", m, false);
        if victim.enc.compact() {
            let mut m = victim.clone();
            m.outer_len = Some(victim.compact().len() as u64 + 1000);
            push("string length says more", m, false);
            let mut m = victim.clone();
            let mut lease = vec![0x80u8; 9];
            lease.push(0x02);
            m.items[at(1, 4)] = Item::Raw(lease);
            push("lease varint past u64", m, false);
        }
        let mut m = victim.clone();
        m.set_encver(4);
        push("unknown encoding version", m, false);
        for token in [u64::MAX, (1 << 63) + 5, ((now + 10 * YEAR_MS) as u64) << 20] {
            let mut m = victim.clone();
            m.set_token(1, token, false);
            push("token out of range", m, false);
        }
        let mut m = victim.clone();
        m.items[at(1, 2)] = Item::U(1);
        push("a writer among readers", m, false);
        let mut m = victim.clone();
        m.items[at(2, 1)] = Item::U(0);
        push("a holder with no holds", m, false);
        let mut m = victim.clone();
        m.items[at(2, 0)] = m.items[at(0, 0)].clone();
        push("an owner twice", m, false);
        let mut m = victim.clone();
        for h in 0..3 {
            m.set_deadline(h, now - 60_000);
        }
        push("every lease ended", m, true);
        let mut m = victim.clone();
        m.items.truncate(at(1, 0));
        m.items[1] = Item::U(1);
        m.set_deadline(0, now - 60_000);
        push("one holder, its lease ended", m, true);
        let mut m = victim.clone();
        m.set_deadline(0, i64::MAX);
        m.set_token(2, ((now as u64) << 20) + 99, false);
        push("far deadline, new token", m, true);
        // And a few random ones from the RESTORE corpus's generator.
        for _ in 0..2 {
            let mut m = victim.clone();
            mutate_items(&mut rng, &mut m, &victim, &codes, now);
            push("random structured change", m, false);
        }
    }
    let victim_tokens: Vec<u64> = victim.fields().1.iter().map(|h| h.token).collect();

    let mut outcomes = Vec::new();
    for (label, m, must_load) in mutations {
        let body = m.body();
        let verdict = judge(
            &with_footer(&body, m.version),
            &victim.head,
            &codes,
            now_ms(),
        );
        let mut file = rdb[..pos].to_vec();
        file.extend_from_slice(&body[1..]);
        file.extend_from_slice(&rdb[pos + value.len()..rdb.len() - 8]);
        let crc = crc64(&file);
        file.extend(crc.to_le_bytes());
        std::fs::write(&rdb_path, &file).unwrap();
        let what = format!("RDB with {label}: {verdict:?}");
        match s.try_start_again() {
            // Redis 7.0's own redis-check-rdb pass, which it runs after the
            // file was refused, can loop for ever on a cut module value
            // (`rdbLoadCheckModuleValue` reading past the end); the file is
            // refused by then (by the module, or by Redis finding bytes after
            // a whole value). Not a hang of ours: ended here.
            Err((None, log)) if redis_check_after_refusal(&log) => {
                assert!(!must_load, "{what}: refused to start\n{log}");
                s.kill();
                outcomes.push(format!(
                    "{label}: refused to start (then Redis's own RDB check did not finish)"
                ));
            }
            Err((status, log)) => {
                assert!(!must_load, "{what}: refused to start\n{log}");
                assert!(
                    !matches!(verdict, Verdict::Valid(_)),
                    "{what}: refused to start\n{log}"
                );
                assert!(!crashed(&log), "{what}: crashed\n{log}");
                // An exit, not a signal (Redis exits 1, or 0 after its own
                // redis-check-rdb pass, which skips module values, finds the file fine).
                assert!(
                    status.and_then(|s| s.code()).is_some(),
                    "{what}: did not exit by itself ({status:?})\n{log}"
                );
                // The designed cases reach the module, which must say why.
                if !label.ends_with("random structured change") {
                    assert!(
                        log.contains("rlock: refused a lock value:"),
                        "{what}: no line from rlock\n{log}"
                    );
                }
                let line = log
                    .lines()
                    .find(|l| l.contains("rlock: refused"))
                    .unwrap_or("(no rlock line)")
                    .to_string();
                outcomes.push(format!("{label}: refused to start ({line})"));
            }
            Ok(()) => {
                let mut c = s.client();
                assert!(!matches!(verdict, Verdict::Invalid(_)), "{what}: loaded");
                assert_eq!(as_string(&call(&mut c, &["GET", "plain"]).unwrap()), "v");
                let o = info_map(&mut c, &["RLOCK.INFO", "other"]).expect("other lock");
                assert_eq!(as_int(&field(&o, "token")), other_token, "{what}");
                let lock = match &verdict {
                    Verdict::Valid(l) | Verdict::Either(_, Some(l)) => Some(l.clone()),
                    _ => None,
                };
                let now = now_ms();
                let reply = call(&mut c, &["RWLOCK.INFO", "victim"]);
                let seen = match reply {
                    Ok(v) => parse_info(v)
                        .map(|i| seen_holders(Family::Rw, &i, token_bound(now)))
                        .unwrap_or_default(),
                    Err(e) => {
                        // Another family, from a changed kind.
                        assert!(e.to_string().contains("WRONGTYPE"), "{what}: {e}");
                        let _ = call(&mut c, &["DEL", "victim"]);
                        Vec::new()
                    }
                };
                if let Some(l) = &lock {
                    if l.family == Family::Rw {
                        compare(&seen, l, now, &what);
                    }
                }
                if seen.is_empty() {
                    let since = Instant::now();
                    while int(&mut c, &["EXISTS", "victim"]) == 1 {
                        assert!(
                            since.elapsed() < Duration::from_secs(1),
                            "{what}: a lock whose leases all ended stays after loading: PTTL {}",
                            int(&mut c, &["PTTL", "victim"])
                        );
                        std::thread::sleep(Duration::from_millis(5));
                    }
                }
                let tokens = lock
                    .iter()
                    .flat_map(|l| l.holders.iter().map(|h| h.token))
                    .chain(victim_tokens.iter().copied())
                    .chain([other_token as u64]);
                let top = tokens.max().unwrap();
                let t = int(&mut c, &["RLOCK.ACQUIRE", "fresh", "f"]) as u64;
                assert!(
                    t > top && t < ((now_ms() + YEAR_MS) as u64) << 20,
                    "{what}: token {t}"
                );
                outcomes.push(format!("{label}: loaded, {} live holders", seen.len()));
                s.kill();
            }
        }
        assert!(!crashed(&s.log()), "{what}\n{}", s.log());
    }
    eprintln!(
        "rdb: {} files, {:?}: {}",
        outcomes.len(),
        started.elapsed(),
        outcomes.join("; ")
    );
}

/// The two leftovers the fuzz loop found, made on purpose: `RESTORE ... REPLACE`
/// of a lock whose lease ended over another lock key (the old value's unlink
/// dropped the new value's watch: the ended lock stayed, PTTL -1), and a
/// `RESTORE ... ABSTTL` in the past (Redis drops the value at once; its watch
/// entry stayed until the lease's deadline, for ever with `i64::MAX`).
#[test]
fn restore_replace_and_past_absttl_leave_nothing_behind() {
    let s = Server::start();
    let mut c = s.client();
    int(&mut c, &["RLOCK.ACQUIRE", "src", "w", "PX", "600000"]);
    let live = parse_dump(&cmd("DUMP").arg("src").query::<Vec<u8>>(&mut c).unwrap());
    let _ = call(&mut c, &["DEL", "src"]);
    // In every layout (v3 as DUMP writes it, v1 and v2 as older files hold it).
    for live in [
        live.clone(),
        live.in_layout(Enc::V2),
        live.in_layout(Enc::V1),
    ] {
        let mut ended = live.clone();
        ended.set_deadline(0, now_ms() - 1_000);
        let mut forever = live.clone();
        forever.set_deadline(0, i64::MAX);
        int(&mut c, &["RLOCK.ACQUIRE", "k", "other", "PX", "600000"]);
        let _: () = cmd("RESTORE")
            .arg("k")
            .arg(0)
            .arg(ended.encode())
            .arg("REPLACE")
            .query(&mut c)
            .unwrap();
        let past = (now_ms() - 1_000).to_string();
        for key in ["gone1", "gone2"] {
            let _: () = cmd("RESTORE")
                .arg(key)
                .arg(&past)
                .arg(forever.encode())
                .arg("REPLACE")
                .arg("ABSTTL")
                .query(&mut c)
                .unwrap();
            assert_eq!(int(&mut c, &["EXISTS", key]), 0);
        }
        wait_until(Duration::from_secs(1), || {
            int(&mut c, &["EXISTS", "k"]) == 0
        });
    }
    assert_clean(&mut c, "after RESTORE REPLACE and ABSTTL");
}

// ---------------------------------------------------------------------------
// A restored lock's TTL. SPEC: `PTTL key` is the latest deadline of the key,
// whatever TTL `RESTORE` was given (none, or one of the caller's). The module
// sets it right after the command and propagates it as `PEXPIREAT`, so the
// TTL is in the replicas, the AOF and any RDB saved later.

/// `DUMP` of the lock the commands make on `key`, which is then deleted.
fn dump_of(c: &mut Connection, key: &str, acquires: &[&[&str]]) -> Vec<u8> {
    for args in acquires {
        int(c, args);
    }
    let dump: Vec<u8> = cmd("DUMP").arg(key).query(c).unwrap();
    int(c, &["DEL", key]);
    dump
}

fn restore(c: &mut Connection, key: &str, ttl: &str, dump: &[u8]) {
    let _: () = cmd("RESTORE").arg(key).arg(ttl).arg(dump).query(c).unwrap();
}

/// With no TTL and with a far longer one, a one-holder lock and a lock with
/// two readers (the later deadline counts) get their latest deadline as TTL
/// within a second, on the master and its replica alike.
#[test]
fn a_restored_lock_gets_its_latest_deadline_as_ttl() {
    let s = Server::start();
    let replica = Server::start();
    replica.replicate_from(&s);
    let mut c = s.client();
    let one = dump_of(
        &mut c,
        "one",
        &[&["RLOCK.ACQUIRE", "one", "w", "PX", "3000"]],
    );
    let rw = dump_of(
        &mut c,
        "rw",
        &[
            &["RWLOCK.ACQUIRE", "rw", "READ", "r1", "PX", "2000"],
            &["RWLOCK.ACQUIRE", "rw", "READ", "r2", "PX", "4000"],
        ],
    );
    let cases = [
        ("one_none", "0", &one, 3000),
        ("one_long", "5000000", &one, 3000),
        ("rw_none", "0", &rw, 4000),
        ("rw_long", "5000000", &rw, 4000),
    ];
    for (key, ttl, dump, _) in cases {
        restore(&mut c, key, ttl, dump);
    }
    // Within the lease, and past the earlier reader's deadline: the latest.
    let right = |c: &mut Connection, key: &str, lease: i64| {
        let pttl = int(c, &["PTTL", key]);
        pttl > lease - 1500 && pttl <= lease
    };
    wait_until(Duration::from_secs(1), || {
        cases
            .iter()
            .all(|(key, _, _, lease)| right(&mut c, key, *lease))
    });
    let _: i64 = cmd("WAIT").arg(1).arg(2000).query(&mut c).unwrap();
    let mut r = replica.client();
    for (key, _, _, lease) in cases {
        assert!(
            right(&mut r, key, lease),
            "{key}: replica PTTL {}",
            int(&mut r, &["PTTL", key])
        );
    }
    let digest = |c: &mut Connection| -> String { cmd("DEBUG").arg("DIGEST").query(c).unwrap() };
    assert_eq!(digest(&mut c), digest(&mut r));
}

/// `DEBUG RELOAD` right after `RESTORE` (a later command, or the next one in
/// the same pipeline): the reloaded lock still ends at its deadline.
#[test]
fn a_restored_lock_reloaded_at_once_still_ends_at_its_deadline() {
    for pipelined in [false, true] {
        let s = Server::start();
        let mut c = s.client();
        let dump = dump_of(
            &mut c,
            "src",
            &[&["RLOCK.ACQUIRE", "src", "w", "PX", "1000"]],
        );
        let acquired = Instant::now();
        if pipelined {
            let _: () = redis::pipe()
                .cmd("RESTORE")
                .arg("k")
                .arg(0)
                .arg(&dump)
                .ignore()
                .cmd("DEBUG")
                .arg("RELOAD")
                .ignore()
                .query(&mut c)
                .unwrap();
        } else {
            restore(&mut c, "k", "0", &dump);
            let _: () = cmd("DEBUG").arg("RELOAD").query(&mut c).unwrap();
        }
        assert_eq!(int(&mut c, &["EXISTS", "k"]), 1, "pipelined {pipelined}");
        wait_until(Duration::from_secs(3), || {
            int(&mut c, &["EXISTS", "k"]) == 0
        });
        let gone = acquired.elapsed();
        assert!(gone >= Duration::from_millis(900), "{gone:?}");
        assert_clean(&mut c, &format!("pipelined {pipelined}"));
    }
}

/// The TTL is in the AOF: a restart from it gives back the lock with it.
#[test]
fn a_restored_lock_keeps_its_ttl_through_the_aof() {
    let mut s = Server::start_with(&["--save", "", "--appendonly", "yes"], &[]);
    let mut c = s.client();
    let dump = dump_of(
        &mut c,
        "src",
        &[&["RLOCK.ACQUIRE", "src", "w", "PX", "600000"]],
    );
    restore(&mut c, "k", "0", &dump);
    wait_until(Duration::from_secs(1), || int(&mut c, &["PTTL", "k"]) > 0);
    s.restart();
    let mut c = s.client();
    let pttl = int(&mut c, &["PTTL", "k"]);
    assert!(pttl > 590_000 && pttl <= 600_000, "PTTL {pttl}");
}

// ---------------------------------------------------------------------------
// Mutated replicated effects (`RLOCK.DELTA`, `RLOCK.DELTAS`, `RLOCK.SETSTATE`) replayed from an
// AOF at startup: the server starts, and every key is either exactly as the
// unmutated effects left it, or a valid lock that can be released.

/// RESP encoding of one command, as the AOF stores it.
fn resp(args: &[Vec<u8>]) -> Vec<u8> {
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend(format!("${}\r\n", a.len()).into_bytes());
        out.extend_from_slice(a);
        out.extend_from_slice(b"\r\n");
    }
    out
}

fn setstate(key: &str, family: Family, holders: &[Holder]) -> Vec<Vec<u8>> {
    let mut a = vec![
        b"RLOCK.SETSTATE".to_vec(),
        key.as_bytes().to_vec(),
        family.name().as_bytes().to_vec(),
        holders.len().to_string().into_bytes(),
    ];
    for h in holders {
        a.push(h.owner.clone());
        for n in [
            h.reads.to_string(),
            h.writes.to_string(),
            h.token.to_string(),
        ] {
            a.push(n.into_bytes());
        }
        a.push(h.deadline.to_string().into_bytes());
    }
    a
}

/// Delta steps (`src/lock/delta.rs`): integers little-endian.
fn step(out: &mut Vec<u8>, tag: u8, mode: Option<u8>, token: Option<u64>, deadline: Option<i64>) {
    out.push(tag);
    out.extend(mode);
    out.extend(token.map(u64::to_le_bytes).into_iter().flatten());
    out.extend(deadline.map(i64::to_le_bytes).into_iter().flatten());
}

fn step_new(out: &mut Vec<u8>, mode: u8, token: u64, deadline: i64, owner: &[u8]) {
    step(out, b'N', Some(mode), Some(token), Some(deadline));
    out.extend((owner.len() as u32).to_le_bytes());
    out.extend_from_slice(owner);
}

/// A lock family and its holders (owner, reads, writes).
type Template = (Family, &'static [(&'static [u8], u64, u64)]);

struct Effect {
    key: String,
    base: Option<Vec<Vec<u8>>>,
    mutated: Vec<Vec<u8>>,
    label: &'static str,
    /// Must be refused (the key left exactly as it was).
    must_refuse: bool,
}

fn effects(rng: &mut Rng, codes: &Codes, n: usize, now: i64) -> Vec<Effect> {
    let code_of = |f: Family| *codes.iter().find(|(_, g)| **g == f).unwrap().0 as u8;
    let templates: [Template; 4] = [
        (Family::Rlock, &[(b"a", 0, 2)]),
        (Family::Fair, &[(b"f\x00bin", 0, 1)]),
        (Family::Rw, &[(b"w", 1, 1)]),
        (Family::Rw, &[(b"r1", 1, 0), (b"r2", 3, 0), (b"r3", 1, 0)]),
    ];
    let bound = ((now + YEAR_MS - 60_000) as u64) << 20;
    let out_of_range = |t: u64| t == 0 || t > i64::MAX as u64 || t > bound;
    let mut out = Vec::new();
    for j in 0..n {
        let key = format!("a:{j}");
        let (family, template) = templates[rng.index(templates.len())];
        let first = ((now as u64) << 20) + 16 * j as u64 + 1;
        let deadline = now + 600_000 + rng.below(1000) as i64;
        let holders: Vec<Holder> = template
            .iter()
            .enumerate()
            .map(|(i, (owner, reads, writes))| Holder {
                owner: owner.to_vec(),
                reads: *reads,
                writes: *writes,
                token: first + i as u64,
                deadline,
            })
            .collect();
        let base = (j % 10 != 0).then(|| setstate(&key, family, &holders));
        let mut must_refuse = false;
        let (mutated, label) = if rng.chance(2) {
            let mut hs = holders.clone();
            let h = rng.index(hs.len());
            let mut count_delta = 0i64;
            let mut kind = family.name().as_bytes().to_vec();
            let mut junk: Option<&[u8]> = None;
            let label = match rng.below(9) {
                0 => {
                    hs[h].token = rng.pick(&extreme_tokens(now));
                    must_refuse = out_of_range(hs[h].token);
                    "SETSTATE: extreme token"
                }
                1 => {
                    hs[h].deadline = rng.pick(&extreme_deadlines(now)) as i64;
                    must_refuse = hs[h].deadline < 0;
                    "SETSTATE: extreme deadline"
                }
                2 => {
                    let v = rng.pick(&HOLD_COUNTS);
                    if rng.chance(2) {
                        hs[h].reads = v;
                    } else {
                        hs[h].writes = v;
                    }
                    must_refuse = hs[h].reads > u32::MAX as u64
                        || hs[h].writes > u32::MAX as u64
                        || hs[h].reads + hs[h].writes == 0
                        || (family != Family::Rw && hs[h].reads > 0);
                    "SETSTATE: extreme hold count"
                }
                3 => {
                    hs[h].owner.clear();
                    must_refuse = true;
                    "SETSTATE: empty owner"
                }
                4 => {
                    let mut dup = hs[h].clone();
                    dup.token += 8;
                    hs.push(dup);
                    must_refuse = true;
                    "SETSTATE: an owner twice"
                }
                5 => {
                    count_delta = rng.pick(&[-1, 1]);
                    must_refuse = true;
                    "SETSTATE: holder count differs"
                }
                6 => {
                    kind = rng
                        .pick(&[
                            &b"RLOCK"[..],
                            b"rwlock\x00",
                            b"",
                            b"nolock",
                            b"fairlock",
                            b"rlock",
                        ])
                        .to_vec();
                    must_refuse = !matches!(&kind[..], b"fairlock" | b"rlock");
                    "SETSTATE: kind name"
                }
                7 => {
                    let v: &[u8] = rng.pick(&[
                        &b""[..],
                        b"-1",
                        b" 5",
                        b"5 ",
                        b"1e3",
                        b"0x10",
                        b"18446744073709551616",
                        b"abc",
                    ]);
                    junk = Some(v);
                    must_refuse = true;
                    "SETSTATE: not a number"
                }
                _ => {
                    for (i, x) in hs.iter_mut().enumerate() {
                        x.token = first + 8 + i as u64;
                        x.deadline = now + 900_000;
                    }
                    "SETSTATE: another valid state"
                }
            };
            let mut a = setstate(&key, family, &hs);
            a[2] = kind;
            a[3] = (hs.len() as i64 + count_delta).to_string().into_bytes();
            if let Some(v) = junk {
                // A numeric field of a holder: reads, writes, token or deadline.
                let i = 4 + 5 * rng.index(hs.len()) + 1 + rng.index(4);
                a[i] = v.to_vec();
            }
            (a, label)
        } else {
            let mode_of = |h: &Holder| if h.writes > 0 { b'w' } else { b'r' };
            let mut d = vec![1u8, code_of(family)];
            let h = &holders[rng.index(holders.len())];
            for _ in 0..1 + rng.below(3) {
                match rng.below(6) {
                    0 => step(
                        &mut d,
                        b'H',
                        Some(mode_of(h)),
                        Some(h.token),
                        Some(now + 700_000),
                    ),
                    1 => step(&mut d, b'R', Some(mode_of(h)), Some(h.token), None),
                    2 => step(&mut d, b'D', None, Some(h.token), Some(now + 800_000)),
                    3 => step(&mut d, b'E', None, Some(h.token), None),
                    4 => step(&mut d, b'F', None, None, None),
                    _ => step_new(
                        &mut d,
                        if family == Family::Rw { b'r' } else { b'w' },
                        first + 9,
                        now + 700_000,
                        format!("n{j}").as_bytes(),
                    ),
                }
            }
            let label = match rng.below(9) {
                0 => "DELTA: as built",
                1 => {
                    d.truncate(rng.index(d.len()));
                    "DELTA: truncated"
                }
                2 => {
                    let i = rng.index(d.len());
                    d[i] ^= 1 << rng.below(8);
                    "DELTA: bit flip"
                }
                3 => {
                    let token = rng.pick(&extreme_tokens(now));
                    d.truncate(2);
                    step_new(&mut d, b'w', token, now + 700_000, b"x");
                    must_refuse = out_of_range(token) || base.is_some();
                    "DELTA: new holder, extreme token"
                }
                4 => {
                    d.truncate(2);
                    step(
                        &mut d,
                        b'D',
                        None,
                        Some(h.token),
                        Some(rng.pick(&[-1, i64::MIN])),
                    );
                    must_refuse = true;
                    "DELTA: negative deadline"
                }
                5 => {
                    d[0] = rng.pick(&[0, 2, 255]);
                    must_refuse = true;
                    "DELTA: version"
                }
                6 => {
                    let other = codes.keys().copied().find(|c| *c as u8 != d[1]).unwrap();
                    d[1] = rng.pick(&[other as u8, 9, 255]);
                    must_refuse = base.is_some() || d[1] > 2;
                    "DELTA: kind"
                }
                7 => {
                    d.push(rng.pick(&[b'Z', 0, b'N']));
                    must_refuse = true;
                    "DELTA: trailing bytes"
                }
                _ => {
                    d.truncate(2);
                    step_new(&mut d, b'w', first + 9, now + 700_000, b"owner");
                    let len_at = d.len() - 5 - 4;
                    let lie = rng.pick(&[6u32, 1000, u32::MAX]);
                    d[len_at..len_at + 4].copy_from_slice(&lie.to_le_bytes());
                    must_refuse = true;
                    "DELTA: owner length lies"
                }
            };
            (
                vec![b"RLOCK.DELTA".to_vec(), key.clone().into_bytes(), d],
                label,
            )
        };
        out.push(Effect {
            key,
            base,
            mutated,
            label,
            must_refuse,
        });
    }
    out
}

/// Starts a server on an AOF made of `commands`.
fn server_on_aof(commands: &[&Vec<Vec<u8>>]) -> Server {
    let mut aof = resp(&[b"SELECT".to_vec(), b"0".to_vec()]);
    aof.extend(resp(&[b"SET".to_vec(), b"plain".to_vec(), b"v".to_vec()]));
    for c in commands {
        aof.extend(resp(c));
    }
    let mut s = Server::start_with(
        &[
            "--save",
            "",
            "--appendonly",
            "no",
            "--aof-use-rdb-preamble",
            "no",
        ],
        &[],
    );
    s.kill();
    std::fs::write(s.dir.join("appendonly.aof"), &aof).unwrap();
    s.start_again_with(&["--appendonly", "yes"]);
    s
}

fn digests(c: &mut Connection, keys: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    for chunk in keys.chunks(500) {
        let mut d = cmd("DEBUG");
        d.arg("DIGEST-VALUE").arg(chunk);
        out.extend(d.query::<Vec<String>>(c).unwrap());
    }
    out
}

#[test]
fn mutated_replicated_effects_leave_keys_unchanged_or_valid() {
    let started = Instant::now();
    let mut rng = Rng(seed("aof"));
    let codes = {
        let s = Server::start_with(
            &["--save", "", "--appendonly", "no", "--rdbcompression", "no"],
            &[],
        );
        kind_codes(&base_locks(&mut s.client()))
    };
    let now = now_ms();
    let effects = effects(&mut rng, &codes, 4000, now);
    let keys: Vec<String> = effects.iter().map(|e| e.key.clone()).collect();
    let reference = server_on_aof(
        &effects
            .iter()
            .filter_map(|e| e.base.as_ref())
            .collect::<Vec<_>>(),
    );
    let expected = digests(&mut reference.client(), &keys);
    drop(reference);

    // A third of the mutated deltas arrive as a KEEPALIVE tick sends its
    // renewals: `RLOCK.DELTAS key delta` (each change judged the same way).
    let batched: Vec<Vec<Vec<u8>>> = effects
        .iter()
        .map(|e| match &e.mutated[..] {
            [name, key, delta] if name == b"RLOCK.DELTA" && rng.chance(3) => {
                vec![b"RLOCK.DELTAS".to_vec(), key.clone(), delta.clone()]
            }
            _ => e.mutated.clone(),
        })
        .collect();
    let as_deltas = batched.iter().filter(|m| m[0] == b"RLOCK.DELTAS").count();
    assert!(as_deltas > 100, "{as_deltas} sent as RLOCK.DELTAS");
    let mut all = Vec::new();
    for (e, mutated) in effects.iter().zip(&batched) {
        all.extend(e.base.as_ref());
        all.push(mutated);
    }
    // And effects aimed at a key holding a string.
    let plain_delta = vec![b"RLOCK.DELTA".to_vec(), b"plain".to_vec(), vec![1, 0, b'F']];
    all.push(&plain_delta);
    let mut s = server_on_aof(&all);
    let mut c = s.client();
    assert_eq!(as_string(&call(&mut c, &["GET", "plain"]).unwrap()), "v");
    let got = digests(&mut c, &keys);
    let (mut unchanged, mut changed, mut gone) = (0, 0, 0);
    let mut max_token = 0u64;
    for (e, (before, after)) in effects.iter().zip(expected.iter().zip(&got)) {
        let what = format!("{} ({:?})", e.label, e.mutated);
        if before == after {
            unchanged += 1;
            continue;
        }
        assert!(!e.must_refuse, "{what}: changed the key");
        if after.bytes().all(|b| b == b'0') {
            gone += 1;
            continue;
        }
        let key = &e.key;
        match as_string(&call(&mut c, &["TYPE", key]).unwrap()).as_str() {
            "rlock-lck" => changed += 1,
            // Its last lease ended since the digest (the timer removed it).
            "none" => {
                gone += 1;
                continue;
            }
            other => panic!("{what}: {other}"),
        }
        let (family, info) = [Family::Rlock, Family::Fair, Family::Rw]
            .into_iter()
            .find_map(|f| {
                call(&mut c, &[&format!("{}.INFO", f.prefix()), key])
                    .ok()
                    .map(|v| (f, v))
            })
            .unwrap_or_else(|| panic!("{what}: no family answers"));
        let seen = parse_info(info)
            .map(|i| seen_holders(family, &i, token_bound(now_ms())))
            .unwrap_or_default();
        max_token = max_token.max(seen.iter().map(|s| s.token).max().unwrap_or(0));
        if !seen.is_empty() {
            let n = int(&mut c, &[&format!("{}.FORCERELEASE", family.prefix()), key]);
            assert_eq!(n, 1, "{what}");
        }
        let since = Instant::now();
        while int(&mut c, &["EXISTS", key]) == 1 {
            assert!(
                since.elapsed() < Duration::from_secs(1),
                "{what}: stays after release"
            );
            std::thread::sleep(Duration::from_millis(2));
        }
    }
    let refused = s.log().matches("refused a replicated change").count();
    let must = effects.iter().filter(|e| e.must_refuse).count();
    eprintln!(
        "aof: {} mutated effects replayed ({as_deltas} as RLOCK.DELTAS): {refused} refused (log), \
         {unchanged} keys unchanged, {changed} changed into valid locks, {gone} removed; \
         {must} had to be refused; {:?}",
        effects.len(),
        started.elapsed()
    );
    assert!(
        refused >= must,
        "{refused} refusals logged, {must} expected at least"
    );
    assert!(changed > 100 && unchanged > 1000);
    for e in &effects {
        for h in 0..e.base.as_ref().map_or(0, |b| (b.len() - 4) / 5) {
            let t: u64 = std::str::from_utf8(&e.base.as_ref().unwrap()[4 + 5 * h + 3])
                .unwrap()
                .parse()
                .unwrap();
            max_token = max_token.max(t);
        }
    }
    let t = int(&mut c, &["RLOCK.ACQUIRE", "fresh", "f"]) as u64;
    assert!(t > max_token, "fresh token {t} not above {max_token}");
    assert!(
        t < ((now_ms() + YEAR_MS) as u64) << 20,
        "fresh token {t} beyond the clock"
    );
    assert!(!crashed(&s.log()));
    assert!(s.is_running());
}

/// Semaphore values (kind 3: a limit after the kind byte, holdings of permits)
/// are not in the model above. Their DUMPs, mutated (bit flips, bytes set,
/// truncated, cut out or inserted; a valid CRC each time), must be refused
/// with `ERR Bad data format` and leave nothing, or restore as a value the
/// commands could have made: for a semaphore, a limit of at least 1 and
/// holdings of at least one permit (more than the limit after it was
/// lowered) under distinct owners and tokens; for a lock
/// (a mutated kind byte), one family answering. Whatever was restored can be
/// forced out, and the server stays up.
#[test]
fn mutated_semaphore_payloads_are_refused_or_restored_valid() {
    let mut rng = Rng(seed("restore-semaphore"));
    let s = Server::start_with(
        &["--save", "", "--appendonly", "no", "--rdbcompression", "no"],
        &[],
    );
    let mut c = s.client();
    let shapes: [&[(&str, u32, u32, &str)]; 3] = [
        &[("a", 5, 1, "600000")],
        &[
            ("0f8a3c1e-7b2d-4c9e-a1f0-3d5e7b9c2a41:1", 10, 3, "600000"),
            ("b", 10, 2, "900000"),
            ("c", 10, 1, "300000"),
        ],
        // A lowered limit: more permits in use than the limit in force.
        &[
            ("x", 4, 2, "600000"),
            ("y", 4, 2, "600000"),
            ("z", 3, 1, "600000"),
        ],
    ];
    let mut dumps = Vec::new();
    for (i, shape) in shapes.iter().enumerate() {
        let key = format!("base:{i}");
        for (owner, limit, permits, px) in shape.iter() {
            let _ = call(
                &mut c,
                &[
                    "SEMAPHORE.ACQUIRE",
                    &key,
                    owner,
                    "LIMIT",
                    &limit.to_string(),
                    "PERMITS",
                    &permits.to_string(),
                    "PX",
                    px,
                ],
            );
        }
        let dump: Vec<u8> = cmd("DUMP").arg(&key).query(&mut c).unwrap();
        dumps.push(dump);
        int(&mut c, &["SEMAPHORE.FORCERELEASE", &key]);
    }
    let (mut refused, mut restored, mut semaphores) = (0, 0, 0);
    for i in 0..3_000 {
        let dump = &dumps[rng.index(dumps.len())];
        let (body, version) = (
            &dump[..dump.len() - 10],
            [dump[dump.len() - 10], dump[dump.len() - 9]],
        );
        let mut body = body.to_vec();
        // Past the type byte and module id, where the module reads.
        let from = 10;
        let label = match rng.below(5) {
            0 | 1 => {
                for _ in 0..1 + rng.below(3) {
                    let at = from + rng.index(body.len() - from);
                    body[at] ^= 1 << rng.below(8);
                }
                "bit flips"
            }
            2 => {
                let at = from + rng.index(body.len() - from);
                body[at] = rng.pick(&[0, 1, 2, 3, 4, 0x7f, 0x80, 0xff]);
                "byte set"
            }
            3 => {
                let at = from + rng.index(body.len() - from);
                body.truncate(at);
                "truncated"
            }
            _ => {
                let at = from + rng.index(body.len() - from);
                if rng.chance(2) {
                    body.remove(at);
                    "byte cut out"
                } else {
                    body.insert(at, rng.below(256) as u8);
                    "byte inserted"
                }
            }
        };
        let payload = with_footer(&body, version);
        let key = format!("k:{i}");
        let what = format!("case {i} ({label})");
        match cmd("RESTORE")
            .arg(&key)
            .arg(0)
            .arg(&payload[..])
            .arg("REPLACE")
            .query::<()>(&mut c)
        {
            Err(e) => {
                refused += 1;
                assert_eq!(
                    (e.code(), e.detail()),
                    (Some("ERR"), Some("Bad data format")),
                    "{what}: {e}"
                );
                assert_eq!(int(&mut c, &["EXISTS", &key]), 0, "{what}");
                continue;
            }
            Ok(()) => restored += 1,
        }
        let as_semaphore = call(&mut c, &["SEMAPHORE.INFO", &key])
            .ok()
            .and_then(parse_info);
        if let Some(info) = as_semaphore {
            semaphores += 1;
            let limit = as_int(&field(&info, "limit"));
            assert!(
                (1..=u32::MAX as i64).contains(&limit),
                "{what}: limit {limit}"
            );
            let holders = match field(&info, "holders") {
                Value::Array(items) => items,
                other => panic!("{what}: holders {other:?}"),
            };
            let (mut owners, mut tokens) = (Vec::new(), Vec::new());
            for h in &holders {
                let h = parse_info(h.clone()).unwrap();
                // Any positive count: a lowered limit leaves holdings above it.
                let permits = as_int(&field(&h, "permits"));
                assert!(
                    (1..=u32::MAX as i64).contains(&permits),
                    "{what}: {permits} permits"
                );
                // As bytes: a bit flip can make two owners that differ only
                // in bytes a lossy UTF-8 reading maps to the same U+FFFD.
                owners.push(bulk(&field(&h, "owner")));
                tokens.push(as_int(&field(&h, "token")));
            }
            owners.sort();
            owners.dedup();
            tokens.sort();
            tokens.dedup();
            assert_eq!(owners.len(), holders.len(), "{what}: an owner twice");
            assert_eq!(tokens.len(), holders.len(), "{what}: a token twice");
            int(&mut c, &["SEMAPHORE.FORCERELEASE", &key]);
        } else {
            // A mutated kind byte made a lock of another family, or every
            // holding was already past its deadline: one family answers, or
            // the key is gone.
            let answering: Vec<&str> = ["RLOCK", "FAIRLOCK", "RWLOCK", "SEMAPHORE"]
                .into_iter()
                .filter(|f| call(&mut c, &[&format!("{f}.INFO"), &key]).is_ok())
                .collect();
            let key_type: String = cmd("TYPE").arg(&key).query(&mut c).unwrap();
            match key_type.as_str() {
                "rlock-lck" => {
                    assert_eq!(answering.len(), 1, "{what}: {answering:?}");
                    let _ = call(&mut c, &[&format!("{}.FORCERELEASE", answering[0]), &key]);
                }
                // Loaded with every holding past its deadline, and gone at the
                // first access: what Redis does with a key whose TTL passed.
                "none" => {}
                other => panic!("{what}: restored as {other}"),
            }
        }
        let _ = call(&mut c, &["DEL", &key]);
    }
    eprintln!(
        "semaphore payloads: {refused} refused, {restored} restored ({semaphores} as semaphores)"
    );
    assert!(
        refused > 1_000 && semaphores > 20,
        "the mutations reached too few paths"
    );
    let pong: String = cmd("PING").query(&mut c).unwrap();
    assert_eq!(pong, "PONG");
    assert!(!crashed(&s.log()), "{}", s.log());
}
