//! Malformed input, generated: a seeded xorshift PRNG builds well over 10,000
//! argument vectors for every command (RLOCK/FAIRLOCK/RWLOCK x ACQUIRE/RELEASE/
//! RENEW/FORCERELEASE/INFO, and the internal RLOCK.SETSTATE) and sends them over
//! a raw RESP connection, so every reply is seen byte for byte. Acquisitions
//! carry `PX`/`EX`, `BLOCK` and `KEEPALIVE` in any order, case and number.
//!
//! A small model of the SPEC's argument rules says, for each vector, whether it
//! must be rejected (`Reject`), must get past argument checking (`Accept`; the
//! reply may still be WRONGTYPE, NOTOWNER or the RWLOCK upgrade error, which
//! depend on the keyspace), or may go either way (`Either`: a lease or timeout
//! within a few seconds of the 64-bit clock bound). Checked for every vector:
//! - the server answers PING afterwards;
//! - the reply is a value of the command's shape or an error of the form
//!   `CODE message` (uppercase code, non-empty message);
//! - a vector the model rejects gets `ERR ...`, never a value;
//! - every rejected call (any error reply) leaves `DEBUG DIGEST` unchanged.
//!
//! The seed is fixed (override with RLOCK_FUZZ_SEED=<n>) and printed on failure
//! together with the last vectors sent.

mod common;

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;

const DEFAULT_SEED: u64 = 0x0bad_1e55_5eed_2024;
const VECTORS: usize = 12_000;
/// The server's default lease for this test: nothing acquired without PX/EX
/// expires while the test runs, so `DEBUG DIGEST` only changes by our calls.
const DEFAULT_LEASE_MS: i128 = 3_600_000;
/// Acquisitions and renewals with a shorter lease are force-released right
/// after (an expiry between two digests would look like a changed keyspace).
const SHORT_LEASE_MS: i128 = 600_000;

// ---------------------------------------------------------------- PRNG

struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(if seed == 0 {
            0x9e37_79b9_7f4a_7c15
        } else {
            seed
        })
    }

    /// xorshift64*
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }
}

// ---------------------------------------------------------------- raw RESP

#[derive(Debug, Clone, PartialEq)]
enum Resp {
    Simple(Vec<u8>),
    Error(Vec<u8>),
    Int(i64),
    Bulk(Vec<u8>),
    Nil,
    Array(Vec<Resp>),
}

struct Raw {
    reader: BufReader<TcpStream>,
    writer: TcpStream,
}

impl Raw {
    fn connect(port: u16) -> Raw {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Raw {
            reader: BufReader::new(stream.try_clone().unwrap()),
            writer: stream,
        }
    }

    fn call(&mut self, argv: &[Vec<u8>]) -> std::io::Result<Resp> {
        let mut buf = format!("*{}\r\n", argv.len()).into_bytes();
        for a in argv {
            buf.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            buf.extend_from_slice(a);
            buf.extend_from_slice(b"\r\n");
        }
        self.writer.write_all(&buf)?;
        self.read()
    }

    fn call_str(&mut self, argv: &[&str]) -> std::io::Result<Resp> {
        let v: Vec<Vec<u8>> = argv.iter().map(|s| s.as_bytes().to_vec()).collect();
        self.call(&v)
    }

    fn line(&mut self) -> std::io::Result<Vec<u8>> {
        let mut line = Vec::new();
        self.reader.read_until(b'\n', &mut line)?;
        if !line.ends_with(b"\r\n") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("reply line not CRLF-terminated: {:?}", show(&line)),
            ));
        }
        line.truncate(line.len() - 2);
        Ok(line)
    }

    fn read(&mut self) -> std::io::Result<Resp> {
        let line = self.line()?;
        let bad = |what: &str| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("{what}: {}", show(&line)),
            )
        };
        let (ty, rest) = line.split_first().ok_or_else(|| bad("empty reply line"))?;
        let number = || -> std::io::Result<i64> {
            std::str::from_utf8(rest)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| bad("bad number"))
        };
        Ok(match ty {
            b'+' => Resp::Simple(rest.to_vec()),
            b'-' => Resp::Error(rest.to_vec()),
            b':' => Resp::Int(number()?),
            b'$' => {
                let n = number()?;
                if n < 0 {
                    Resp::Nil
                } else {
                    let mut data = vec![0u8; n as usize + 2];
                    self.reader.read_exact(&mut data)?;
                    data.truncate(n as usize);
                    Resp::Bulk(data)
                }
            }
            b'*' => {
                let n = number()?;
                if n < 0 {
                    Resp::Nil
                } else {
                    let mut items = Vec::with_capacity(n as usize);
                    for _ in 0..n {
                        items.push(self.read()?);
                    }
                    Resp::Array(items)
                }
            }
            _ => return Err(bad("unknown reply type")),
        })
    }
}

/// A printable, length-capped rendering of an argument.
fn show(a: &[u8]) -> String {
    let head = &a[..a.len().min(48)];
    let mut s: String = head.escape_ascii().to_string();
    if a.len() > head.len() {
        s.push_str(&format!("...({} bytes)", a.len()));
    }
    s
}

fn show_argv(argv: &[Vec<u8>]) -> String {
    argv.iter()
        .map(|a| format!("\"{}\"", show(a)))
        .collect::<Vec<_>>()
        .join(" ")
}

// ---------------------------------------------------------------- the model

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// Malformed: must get `ERR ...` and change nothing.
    Reject,
    /// Well-formed: a value, or WRONGTYPE / NOTOWNER / upgrade ERR.
    Accept,
    /// At a clock-dependent bound: anything well-shaped.
    Either,
}

fn worst(a: Expect, b: Expect) -> Expect {
    use Expect::*;
    match (a, b) {
        (Reject, _) | (_, Reject) => Reject,
        (Either, _) | (_, Either) => Either,
        _ => Accept,
    }
}

const FAMILIES: [&str; 3] = ["RLOCK", "FAIRLOCK", "RWLOCK"];
const OPS: [&str; 5] = ["ACQUIRE", "RELEASE", "RENEW", "FORCERELEASE", "INFO"];

fn unix_ms() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i128
}

/// An integer as Redis parses one (string2ll): optional '-', no '+', no
/// leading zeros, no "-0", no spaces, within i64.
fn redis_int(v: &[u8]) -> Option<i128> {
    let s = std::str::from_utf8(v).ok()?;
    let digits = s.strip_prefix('-').unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if digits.len() > 1 && digits.starts_with('0') || s == "-0" || digits.len() > 30 {
        return None;
    }
    let n: i128 = s.parse().ok()?;
    (i64::MIN as i128..=i64::MAX as i128)
        .contains(&n)
        .then_some(n)
}

/// A duration whose deadline (now + ms) must fit a signed 64-bit ms clock.
/// Within 30 s of the bound the client's clock cannot decide.
fn duration_class(ms: i128) -> Expect {
    let room = i64::MAX as i128 - unix_ms();
    if ms <= room - 30_000 {
        Expect::Accept
    } else if ms > room + 30_000 {
        Expect::Reject
    } else {
        Expect::Either
    }
}

struct Parsed {
    expect: Expect,
    lease_ms: Option<i128>,
    /// An acquisition the server renews while this connection is open.
    keepalive: bool,
}

/// `[PX ms | EX s]`, for an acquisition also `[BLOCK ms] [KEEPALIVE]`, each
/// at most once, any order and case.
fn model_options(args: &[Vec<u8>], acquire: bool) -> Parsed {
    let mut out = Parsed {
        expect: Expect::Accept,
        lease_ms: None,
        keepalive: false,
    };
    let (mut seen_lease, mut seen_block) = (false, false);
    let mut words = args.iter();
    while let Some(name) = words.next() {
        if acquire && name.eq_ignore_ascii_case(b"KEEPALIVE") {
            if out.keepalive {
                out.expect = Expect::Reject;
                return out;
            }
            out.keepalive = true;
            continue;
        }
        let Some(value) = words.next() else {
            out.expect = Expect::Reject;
            return out;
        };
        let px = name.eq_ignore_ascii_case(b"PX");
        let ex = name.eq_ignore_ascii_case(b"EX");
        if px || ex {
            if seen_lease {
                out.expect = Expect::Reject;
                return out;
            }
            seen_lease = true;
            let class = match redis_int(value) {
                Some(n) if n > 0 => {
                    let ms = if ex { n * 1000 } else { n };
                    out.lease_ms = Some(ms);
                    duration_class(ms)
                }
                _ => Expect::Reject,
            };
            out.expect = worst(out.expect, class);
        } else if acquire && name.eq_ignore_ascii_case(b"BLOCK") {
            if seen_block {
                out.expect = Expect::Reject;
                return out;
            }
            seen_block = true;
            let class = match redis_int(value) {
                Some(n) if n >= 0 => duration_class(n),
                _ => Expect::Reject,
            };
            out.expect = worst(out.expect, class);
        } else {
            out.expect = Expect::Reject;
            return out;
        }
    }
    out
}

fn is_mode(v: &[u8]) -> bool {
    v.eq_ignore_ascii_case(b"READ") || v.eq_ignore_ascii_case(b"WRITE")
}

/// What the SPEC says about `argv` (name first), before looking at any key.
fn model(family: &str, op: &str, argv: &[Vec<u8>]) -> Parsed {
    let args = &argv[1..];
    let reject = Parsed {
        expect: Expect::Reject,
        lease_ms: None,
        keepalive: false,
    };
    let rw = family == "RWLOCK";
    match op {
        "SETSTATE" => reject,
        "INFO" | "FORCERELEASE" => Parsed {
            expect: if args.len() == 1 {
                Expect::Accept
            } else {
                Expect::Reject
            },
            lease_ms: None,
            keepalive: false,
        },
        "ACQUIRE" | "RELEASE" | "RENEW" => {
            let with_mode = rw && op != "RENEW";
            let first_opt = if with_mode { 3 } else { 2 };
            if args.len() < first_opt
                || (op == "RELEASE" && args.len() != first_opt)
                || (with_mode && !is_mode(&args[1]))
                || args[first_opt - 1].is_empty()
            {
                return reject;
            }
            model_options(&args[first_opt..], op == "ACQUIRE")
        }
        _ => unreachable!("{op}"),
    }
}

// ---------------------------------------------------------------- generation

struct Pools {
    numbers: Vec<Vec<u8>>,
    option_names: Vec<Vec<u8>>,
    modes: Vec<Vec<u8>>,
    owners: Vec<Vec<u8>>,
    keys: Vec<Vec<u8>>,
    mib_owner: Vec<u8>,
    mib_binary: Vec<u8>,
    mib_key: Vec<u8>,
}

fn b(s: &str) -> Vec<u8> {
    s.as_bytes().to_vec()
}

impl Pools {
    fn new() -> Pools {
        let room = i64::MAX as i128 - unix_ms();
        let mut numbers: Vec<Vec<u8>> = [
            "0",
            "-0",
            "1",
            "-1",
            "2",
            "5",
            "20",
            "100",
            "1000",
            "60000",
            "3600000",
            "86400000",
            "9223372036854775807",
            "9223372036854775806",
            "-9223372036854775808",
            "-9223372036854775807",
            "9223372036854775808",
            "-9223372036854775809",
            "18446744073709551615",
            "18446744073709551616",
            "99999999999999999999999999",
            "999999999999999999999999999999999999999999999999999",
            "4611686018427387904",
            "9223372036854775",
            "9223372036854776",
            "9223372036854",
            "4611686018427387",
            "18446744073709552",
            // Redis arms a timer at now + delay * 1000 us: these wrap it
            // (alone, or as a third of a lease, a KEEPALIVE's renewal).
            "18446744073709551",
            "55340232221128653",
            "55340232221128656",
            "00",
            "01",
            "007",
            "+5",
            "+0",
            " 5",
            "5 ",
            " ",
            "1 0",
            "1\t0",
            "1.5",
            "1.0",
            "1e3",
            "0x10",
            "5ms",
            "abc",
            "",
            "-",
            "--1",
            "NaN",
            "inf",
            "-inf",
            "\u{0665}",
            "\u{ff15}",
        ]
        .iter()
        .map(|s| b(s))
        .collect();
        numbers.push(b"\0".to_vec());
        numbers.push(b"5\0".to_vec());
        numbers.push(b"\x005".to_vec());
        numbers.push(b"\xff\xfe".to_vec());
        numbers.push(b"5\r\n6".to_vec());
        // Right at the 64-bit clock bound, a day inside and a day outside.
        for ms in [room - 86_400_000, room + 86_400_000] {
            numbers.push(ms.to_string().into_bytes());
            numbers.push((ms / 1000).to_string().into_bytes());
        }
        let option_names = [
            "NX", "XX", "KEEPTTL", "GET", "PXAT", "EXAT", "READ", "WRITE", "", "PXX", "BLOCKS",
            "P X", "TIMEOUT", "LEASE", "-PX", "PX ", " BLOCK", "0",
        ]
        .iter()
        .map(|s| b(s))
        .chain([b"PX\0".to_vec(), b"\0BLOCK".to_vec(), b"\xff".to_vec()])
        .collect();
        let modes = [
            "REA",
            "READS",
            "WRITER",
            "WRIT",
            "",
            " READ",
            "READ ",
            "R",
            "W",
            "SHARED",
            "EXCLUSIVE",
            "READWRITE",
            "READ WRITE",
            "1",
            "\u{0280}EAD",
        ]
        .iter()
        .map(|s| b(s))
        .chain([b"READ\0".to_vec(), b"\0WRITE".to_vec()])
        .collect();
        let owners = [
            "",
            " ",
            "READ",
            "WRITE",
            "PX",
            "BLOCK",
            "-1",
            "0",
            "\r\n",
            "\u{1f512}owner",
            "o1 ",
            "*1\r\n$4\r\nPING\r\n",
        ]
        .iter()
        .map(|s| b(s))
        .chain([
            b"\0".to_vec(),
            b"a\0b".to_vec(),
            b"\xff\xfe\xfd".to_vec(),
            vec![b'y'; 4096],
        ])
        .collect();
        let keys = ["", "str", "hash", "{t}k", " "]
            .iter()
            .map(|s| b(s))
            .chain([b"\0".to_vec(), b"bin\xff\x00\r\nkey".to_vec()])
            .collect();
        let mib_binary: Vec<u8> = (0..1 << 20).map(|i: u32| (i * 7 % 256) as u8).collect();
        Pools {
            numbers,
            option_names,
            modes,
            owners,
            keys,
            mib_owner: vec![b'x'; 1 << 20],
            mib_binary,
            mib_key: vec![b'K'; 1 << 20],
        }
    }

    fn key(&self, rng: &mut Rng) -> Vec<u8> {
        if rng.below(1000) < 3 {
            return self.mib_key.clone();
        }
        if rng.chance(80) {
            rng.pick(&["k1", "k2", "k3", "k4"]).as_bytes().to_vec()
        } else {
            rng.pick(&self.keys).clone()
        }
    }

    fn owner(&self, rng: &mut Rng) -> Vec<u8> {
        if rng.below(1000) < 8 {
            return if rng.chance(50) {
                self.mib_owner.clone()
            } else {
                self.mib_binary.clone()
            };
        }
        if rng.chance(70) {
            rng.pick(&["o1", "o2", "o3"]).as_bytes().to_vec()
        } else {
            rng.pick(&self.owners).clone()
        }
    }

    fn mode(&self, rng: &mut Rng) -> Vec<u8> {
        if rng.chance(80) {
            let word = rng_word(rng, &["READ", "WRITE"]);
            mangle_case(rng, word)
        } else {
            rng.pick(&self.modes).clone()
        }
    }

    fn any(&self, rng: &mut Rng) -> Vec<u8> {
        match rng.below(6) {
            0 => rng.pick(&self.numbers).clone(),
            1 => rng.pick(&self.option_names).clone(),
            2 => rng.pick(&self.modes).clone(),
            3 => self.owner(rng),
            4 => self.key(rng),
            _ => {
                let word = rng_word(rng, &["PX", "EX", "BLOCK", "KEEPALIVE", "READ", "WRITE"]);
                mangle_case(rng, word)
            }
        }
    }

    fn options(&self, rng: &mut Rng, allow_block: bool) -> Vec<Vec<u8>> {
        let n = *rng.pick(&[0, 0, 0, 1, 1, 1, 1, 2, 2, 3]);
        let mut out = Vec::new();
        for i in 0..n {
            let name = if rng.chance(75) {
                let words: &[&str] = if allow_block {
                    &["PX", "EX", "BLOCK"]
                } else {
                    &["PX", "EX"]
                };
                rng_word(rng, words)
            } else if rng.chance(30) {
                "BLOCK"
            } else {
                ""
            };
            let name_bytes = if name.is_empty() {
                rng.pick(&self.option_names).clone()
            } else {
                mangle_case(rng, name)
            };
            let sane = rng.chance(60);
            let value = match name {
                "PX" if sane => b(rng_word(
                    rng,
                    &[
                        "60000",
                        "3600000",
                        "1000",
                        "1",
                        "86400000",
                        // A third of it wraps Redis's timer clock.
                        "55340232221128653",
                    ],
                )),
                "EX" if sane => b(rng_word(rng, &["60", "3600", "1", "86400"])),
                "BLOCK" if sane => b(rng_word(rng, &["1", "2", "5", "10", "20"])),
                _ => rng.pick(&self.numbers).clone(),
            };
            out.push(name_bytes);
            if i + 1 < n || !rng.chance(8) {
                out.push(value);
            }
        }
        if allow_block && rng.chance(25) {
            let word = rng_word(rng, &["KEEPALIVE", "KEEPALIVE", "KEEPALIVES", "KEEP"]);
            out.insert(rng.below(out.len() + 1), mangle_case(rng, word));
            if rng.chance(25) {
                // A lease a third of which wraps Redis's timer clock.
                out.push(mangle_case(rng, "PX"));
                out.push(b("55340232221128653"));
            }
        }
        out
    }
}

fn rng_word<'a>(rng: &mut Rng, words: &[&'a str]) -> &'a str {
    rng.pick::<&str>(words)
}

/// Flips the case of some letters.
fn mangle_case(rng: &mut Rng, word: &str) -> Vec<u8> {
    if rng.chance(50) {
        return word.as_bytes().to_vec();
    }
    word.bytes()
        .map(|c| {
            if rng.chance(50) {
                c.to_ascii_lowercase()
            } else {
                c
            }
        })
        .collect()
}

/// One argument vector: (family, op, argv with the command name first).
fn generate(rng: &mut Rng, pools: &Pools) -> (&'static str, &'static str, Vec<Vec<u8>>) {
    let (family, op) = if rng.below(100) < 4 {
        ("RLOCK", "SETSTATE")
    } else {
        (*rng.pick(&FAMILIES), *rng.pick(&OPS))
    };
    let name = mangle_case(rng, &format!("{family}.{op}"));
    let mut argv = vec![name];
    if rng.chance(5) {
        // Noise: anything, any length.
        for _ in 0..rng.below(7) {
            argv.push(pools.any(rng));
        }
        return (family, op, argv);
    }
    let rw = family == "RWLOCK";
    argv.push(pools.key(rng));
    match op {
        "ACQUIRE" | "RELEASE" => {
            if rw {
                argv.push(pools.mode(rng));
            }
            argv.push(pools.owner(rng));
            if op == "ACQUIRE" {
                argv.extend(pools.options(rng, true));
            }
        }
        "RENEW" => {
            argv.push(pools.owner(rng));
            argv.extend(pools.options(rng, false));
        }
        "SETSTATE" => {
            // Looks like what a master sends; refused from a normal client anyway.
            let far = (unix_ms() + 3_600_000).to_string();
            let kind = rng_word(rng, &["rlock", "fairlock", "rwlock", "bogus"]);
            argv.extend([b(kind), b("1"), pools.owner(rng), b("0"), b("1")]);
            argv.push(b(rng_word(rng, &["1", "99999999999999999", "-1"])));
            argv.push(far.into_bytes());
        }
        _ => {}
    }
    if rng.chance(30) {
        mutate(rng, pools, &mut argv);
    }
    (family, op, argv)
}

fn mutate(rng: &mut Rng, pools: &Pools, argv: &mut Vec<Vec<u8>>) {
    for _ in 0..1 + rng.below(2) {
        let len = argv.len();
        match rng.below(8) {
            0 if len > 1 => {
                argv.remove(1 + rng.below(len - 1));
            }
            1 => {
                let at = 1 + rng.below(len);
                argv.insert(at, pools.any(rng));
            }
            2 if len >= 3 => {
                // Repeat the last pair (a repeated option).
                let pair = argv[len - 2..].to_vec();
                argv.extend(pair);
            }
            3 if len > 1 => {
                let at = 1 + rng.below(len - 1);
                argv[at] = pools.any(rng);
            }
            4 => argv.truncate(1 + rng.below(len)),
            5 => {
                let word = rng_word(rng, &["PX", "EX", "BLOCK"]);
                argv.push(mangle_case(rng, word));
                argv.push(rng.pick(&pools.numbers).clone());
            }
            6 if len > 2 => {
                let (i, j) = (1 + rng.below(len - 1), 1 + rng.below(len - 1));
                argv.swap(i, j);
            }
            _ => argv.push(pools.any(rng)),
        }
    }
}

// ---------------------------------------------------------------- checks

/// `CODE message`: an uppercase code, a space, a non-empty message.
fn error_code(e: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(e).ok()?;
    let (code, message) = text.split_once(' ')?;
    let well_formed = !code.is_empty()
        && code.as_bytes()[0].is_ascii_uppercase()
        && code
            .bytes()
            .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == b'_' || c == b'-')
        && !message.trim().is_empty();
    well_formed.then(|| code.to_string())
}

/// Whether a successful reply has the shape the SPEC gives the command.
fn value_shape_ok(family: &str, op: &str, reply: &Resp) -> bool {
    match (op, reply) {
        ("ACQUIRE", Resp::Int(t)) => *t > 0,
        ("ACQUIRE", Resp::Nil) => true,
        ("RELEASE", Resp::Int(n)) => *n >= 0,
        ("RENEW", Resp::Int(n)) => *n == 1,
        ("FORCERELEASE", Resp::Int(n)) => *n == 0 || *n == 1,
        ("INFO", Resp::Nil) => true,
        ("INFO", Resp::Array(items)) => {
            items.len() % 2 == 0
                && items.chunks(2).any(|kv| {
                    kv[0] == Resp::Bulk(b("kind"))
                        && kv[1] == Resp::Bulk(family.to_ascii_lowercase().into_bytes())
                })
        }
        _ => false,
    }
}

struct Fuzz {
    seed: u64,
    port: u16,
    raw: Raw,
    recent: VecDeque<String>,
    /// Reply classes seen ("ERR", "NOTOWNER", "int", "nil", ...), for the summary.
    outcomes: BTreeMap<String, usize>,
    /// KEEPALIVE acquisitions granted.
    keepalive_grants: usize,
}

impl Fuzz {
    fn fail(&self, what: String) -> ! {
        panic!(
            "bad_input: {what}\n  seed {} (rerun: RLOCK_FUZZ_SEED={} cargo test --release --test bad_input)\n  last vectors, newest last:\n    {}",
            self.seed,
            self.seed,
            self.recent.iter().cloned().collect::<Vec<_>>().join("\n    ")
        )
    }

    fn must(&mut self, argv: &[Vec<u8>], why: &str) -> Resp {
        match self.raw.call(argv) {
            Ok(r) => r,
            Err(e) => self.fail(format!(
                "{why}: no reply to {} ({e}): the server hung or died",
                show_argv(argv)
            )),
        }
    }

    fn digest(&mut self) -> Resp {
        let r = self.must(&[b("DEBUG"), b("DIGEST")], "DEBUG DIGEST");
        if !matches!(r, Resp::Simple(_) | Resp::Bulk(_)) {
            self.fail(format!("DEBUG DIGEST replied {r:?}"));
        }
        r
    }

    fn ping(&mut self) {
        let r = self.must(&[b("PING")], "PING after the vector");
        if r != Resp::Simple(b("PONG")) {
            self.fail(format!("PING replied {r:?}"));
        }
    }

    fn force(&mut self, family: &str, key: &[u8]) {
        let argv = vec![format!("{family}.FORCERELEASE").into_bytes(), key.to_vec()];
        self.must(&argv, "cleanup FORCERELEASE");
    }

    fn run_one(&mut self, family: &str, op: &str, argv: &[Vec<u8>]) {
        let parsed = model(family, op, argv);
        self.recent
            .push_back(format!("{:?}: {}", parsed.expect, show_argv(argv)));
        if self.recent.len() > 6 {
            self.recent.pop_front();
        }
        // A valid-looking BLOCK of 0 (forever) or more than 20 ms must not
        // park this connection: free the key first, so it is granted at once.
        if op == "ACQUIRE" && argv.len() > 1 {
            let long_block = argv.windows(2).skip(1).any(|w| {
                w[0].eq_ignore_ascii_case(b"BLOCK")
                    && redis_int(&w[1]).is_some_and(|n| n == 0 || n > 20)
            });
            if long_block {
                self.force(family, &argv[1]);
            }
        }
        let before = self.digest();
        let started = Instant::now();
        let reply = match self.raw.call(argv) {
            Ok(r) => r,
            Err(e) => self.fail(format!(
                "no reply ({e}) after {:?}: the server hung or died",
                started.elapsed()
            )),
        };
        let class = match &reply {
            Resp::Error(e) => error_code(e).unwrap_or_else(|| "malformed error".into()),
            Resp::Int(_) => "integer".into(),
            Resp::Nil => "nil".into(),
            other => format!("{other:?}").chars().take(5).collect(),
        };
        *self.outcomes.entry(class).or_default() += 1;
        match &reply {
            Resp::Error(e) => {
                let Some(code) = error_code(e) else {
                    self.fail(format!("error reply is not `CODE message`: -{}", show(e)))
                };
                let text = String::from_utf8_lossy(e).into_owned();
                if text.contains("internal error") {
                    self.fail(format!("the module hit an internal error: {text}"));
                }
                let allowed = match parsed.expect {
                    Expect::Reject => code == "ERR",
                    Expect::Accept => {
                        code == "WRONGTYPE"
                            || (code == "NOTOWNER" && matches!(op, "RELEASE" | "RENEW"))
                            || (code == "ERR"
                                && family == "RWLOCK"
                                && op == "ACQUIRE"
                                && text.to_ascii_lowercase().contains("upgrad"))
                    }
                    Expect::Either => true,
                };
                if !allowed {
                    self.fail(format!(
                        "model says {:?}, got error {text:?}",
                        parsed.expect
                    ));
                }
                let after = self.digest();
                if after != before {
                    self.fail(format!(
                        "rejected call ({text}) changed the keyspace: DEBUG DIGEST {before:?} -> {after:?}"
                    ));
                }
            }
            value => {
                if parsed.expect == Expect::Reject {
                    self.fail(format!("malformed call accepted with {value:?}"));
                }
                if !value_shape_ok(family, op, value) {
                    self.fail(format!(
                        "reply {value:?} is not a valid {family}.{op} reply"
                    ));
                }
                let granted = matches!(value, Resp::Int(_)) && matches!(op, "ACQUIRE" | "RENEW");
                let lease = parsed.lease_ms.unwrap_or(DEFAULT_LEASE_MS);
                // A lock left holding a 1 MiB owner or key would make every
                // later DEBUG DIGEST hash it: release those at once too.
                let huge = argv.iter().any(|a| a.len() > 64 << 10);
                // The server renews a KEEPALIVE holding on its own, which
                // would change DEBUG DIGEST between two calls: end it at once.
                if granted && parsed.keepalive {
                    self.keepalive_grants += 1;
                }
                if granted && (lease < SHORT_LEASE_MS || huge || parsed.keepalive) {
                    self.force(family, &argv[1]);
                }
            }
        }
        self.ping();
    }
}

fn seed() -> u64 {
    std::env::var("RLOCK_FUZZ_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED)
}

#[test]
fn random_malformed_vectors_are_refused_without_side_effects() {
    let started = Instant::now();
    let seed = seed();
    let server = Server::start_with(
        &["--save", "", "--appendonly", "no"],
        &["default-lease-ms", &DEFAULT_LEASE_MS.to_string()],
    );
    let mut c = server.client();
    let _: () = cmd("SET").arg("str").arg("v").query(&mut c).unwrap();
    let _: () = cmd("HSET")
        .arg("hash")
        .arg("f")
        .arg("v")
        .query(&mut c)
        .unwrap();
    let baseline = used_memory(&mut c);

    let pools = Pools::new();
    let mut rng = Rng::new(seed);
    let mut fuzz = Fuzz {
        seed,
        port: server.port,
        raw: Raw::connect(server.port),
        recent: VecDeque::new(),
        outcomes: BTreeMap::new(),
        keepalive_grants: 0,
    };
    let (mut rejected, mut accepted, mut per_op) = (0usize, 0usize, [0usize; 16]);
    for _ in 0..VECTORS {
        let (family, op, argv) = generate(&mut rng, &pools);
        let fi = FAMILIES.iter().position(|f| *f == family).unwrap();
        let oi = OPS.iter().position(|o| *o == op).unwrap_or(5);
        per_op[if oi == 5 { 15 } else { fi * 5 + oi }] += 1;
        if model(family, op, &argv).expect == Expect::Reject {
            rejected += 1;
        } else {
            accepted += 1;
        }
        fuzz.run_one(family, op, &argv);
    }
    eprintln!(
        "bad_input: seed {seed}: {VECTORS} vectors ({rejected} malformed, {accepted} well-formed) in {:?}; per command {per_op:?}; replies {:?}; KEEPALIVE granted {}",
        started.elapsed(),
        fuzz.outcomes,
        fuzz.keepalive_grants
    );
    assert!(
        fuzz.keepalive_grants >= 20,
        "too few KEEPALIVE grants to be a useful run: {}",
        fuzz.keepalive_grants
    );
    for class in ["ERR", "WRONGTYPE", "NOTOWNER", "integer", "nil"] {
        assert!(
            fuzz.outcomes.get(class).copied().unwrap_or(0) >= 50,
            "too few {class} replies to be a useful run: {:?}",
            fuzz.outcomes
        );
    }
    assert!(
        per_op.iter().all(|n| *n >= 100),
        "every command gets vectors: {per_op:?}"
    );
    assert!(
        rejected > 3000 && accepted > 3000,
        "{rejected} / {accepted}"
    );

    // Nothing parked, nothing leaked: a fresh connection after the fuzzing one
    // is gone, an empty keyspace, and memory back near where it started.
    let port = fuzz.port;
    drop(fuzz);
    let mut c = server.client();
    assert_eq!(stat(&mut c, "waiters"), 0, "no client left parked");
    let _: () = cmd("FLUSHALL").arg("SYNC").query(&mut c).unwrap();
    let _: () = cmd("SET").arg("str").arg("v").query(&mut c).unwrap();
    let _: () = cmd("HSET")
        .arg("hash")
        .arg("f")
        .arg("v")
        .query(&mut c)
        .unwrap();
    let mut last = 0;
    let settled = (0..50).any(|_| {
        std::thread::sleep(Duration::from_millis(100));
        last = used_memory(&mut c);
        last < baseline + (32 << 20)
    });
    assert!(
        settled,
        "used_memory {last} vs {baseline} at the start (seed {seed}, port {port})"
    );
    assert!(
        !server.log().contains("internal error"),
        "module logged an internal error:\n{}",
        server.log()
    );
}

/// Every command gets its arity checked, also with no arguments at all.
#[test]
fn every_command_checks_arity_and_setstate_is_internal() {
    let server = Server::start();
    let mut raw = Raw::connect(server.port);
    for family in FAMILIES {
        for op in OPS {
            let name = format!("{family}.{op}");
            let r = raw.call_str(&[&name]).unwrap();
            let Resp::Error(e) = r else {
                panic!("{name} without arguments: {r:?}")
            };
            let e = String::from_utf8_lossy(&e).into_owned();
            assert!(
                e.starts_with("ERR wrong number of arguments"),
                "{name}: {e}"
            );
        }
    }
    for argv in [
        &["RLOCK.SETSTATE"][..],
        &["RLOCK.SETSTATE", "k"],
        &["RLOCK.SETSTATE", "k", "rlock", "0"],
        &[
            "RLOCK.SETSTATE",
            "k",
            "rlock",
            "1",
            "o",
            "0",
            "1",
            "1",
            "99999999999999",
        ],
        &["RLOCK.DELTAS"],
        &["RLOCK.DELTAS", "k"],
        &["RLOCK.DELTAS", "k", "d", "k2"],
        &["RLOCK.DELTAS", "k", "\x01\x00garbage", "k2", ""],
    ] {
        let r = raw.call_str(argv).unwrap();
        assert!(
            matches!(&r, Resp::Error(e) if e.starts_with(b"ERR ")),
            "{argv:?} from a normal client: {r:?}"
        );
    }
    assert_eq!(raw.call_str(&["DBSIZE"]).unwrap(), Resp::Int(0));
}

/// Leases far in the future (but inside the 64-bit ms clock) are accepted and
/// must not stall the server: the lease timer has to cope with deadlines
/// hundreds of millions of years away.
#[test]
fn huge_valid_leases_do_not_stall_the_server() {
    for (args, label) in [
        (&["PX", "4611686018427387904"][..], "PX 2^62"),
        (&["EX", "4611686018427387"], "EX 2^62/1000"),
        (&["PX", "18446744073709552"], "PX ~2^64/1000"),
        (&["PX", "9223372036854775"], "PX i64::MAX/1000"),
        (&["PX", "1000000000000000000"], "PX 10^18"),
    ] {
        let server = Server::start();
        let mut raw = Raw::connect(server.port);
        raw.writer
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        let mut argv = vec!["RLOCK.ACQUIRE", "k", "o"];
        argv.extend_from_slice(args);
        let r = raw.call_str(&argv).unwrap();
        assert!(matches!(r, Resp::Int(_)), "{label}: {r:?}");
        for round in 0..5 {
            std::thread::sleep(Duration::from_millis(20));
            let pong = raw.call_str(&["PING"]);
            assert!(
                matches!(&pong, Ok(Resp::Simple(p)) if p == b"PONG"),
                "RLOCK.ACQUIRE k o {} then PING (round {round}): {pong:?} -- the server stopped answering",
                args.join(" ")
            );
        }
        let r = raw.call_str(&["RLOCK.RELEASE", "k", "o"]).unwrap();
        assert_eq!(r, Resp::Int(0), "{label}");
    }
}
