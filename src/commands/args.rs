//! Argument parsing shared by every lock command. Pure: bytes in, typed
//! request or a Redis-style error out, so a malformed call never touches a key.

use crate::lock::Mode;

pub const SYNTAX_ERR: &str = "ERR syntax error";
pub const LEASE_ERR: &str = "ERR lease is not an integer or out of range";
pub const TIMEOUT_ERR: &str = "ERR timeout is not an integer or out of range";
pub const EMPTY_OWNER_ERR: &str = "ERR owner must not be empty";
pub const COUNT_ERR: &str = "ERR count is not an integer or out of range";
pub const LIMIT_ERR: &str = "ERR LIMIT is not a positive integer or out of range";
pub const PERMITS_ERR: &str = "ERR PERMITS is not a positive integer or out of range";
pub const NO_LIMIT_ERR: &str = "ERR LIMIT is required";
pub const PERMITS_OVER_LIMIT_ERR: &str = "ERR PERMITS is greater than LIMIT";

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Options {
    /// Lease in milliseconds, when PX or EX was given.
    pub lease_ms: Option<i64>,
    /// BLOCK timeout in milliseconds (0: wait forever).
    pub block_ms: Option<i64>,
    /// KEEPALIVE: the server renews the holding while the connection is open.
    pub keepalive: bool,
    /// A semaphore's `LIMIT n`.
    pub limit: Option<u32>,
    /// A semaphore's `PERMITS k`.
    pub permits: Option<u32>,
}

/// The option words a command takes (each at most once, in any order).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grammar {
    /// `PX ms | EX s`
    lease: bool,
    /// `BLOCK ms`, `KEEPALIVE`
    acquire: bool,
    /// `LIMIT n`
    limit: bool,
    /// `PERMITS k`
    permits: bool,
}

impl Grammar {
    pub const ACQUIRE: Grammar = Grammar {
        lease: true,
        acquire: true,
        limit: false,
        permits: false,
    };
    pub const RENEW: Grammar = Grammar {
        acquire: false,
        ..Grammar::ACQUIRE
    };
    pub const SEMAPHORE_ACQUIRE: Grammar = Grammar {
        limit: true,
        permits: true,
        ..Grammar::ACQUIRE
    };
    pub const SEMAPHORE_RELEASE: Grammar = Grammar {
        lease: false,
        acquire: false,
        limit: false,
        permits: true,
    };
}

/// A decimal integer as Redis writes one: an optional `-`, no `+`, no
/// leading zeros, no `-0`. Read digit by digit (every acquire has a lease to
/// read; `str::parse` with its UTF-8 check costs twice as much).
fn integer(arg: &[u8]) -> Option<i64> {
    let (negative, digits) = match arg {
        [b'-', rest @ ..] => (true, rest),
        _ => (false, arg),
    };
    match digits {
        [] => return None,
        [b'0', _, ..] => return None,
        [b'0'] if negative => return None,
        _ => {}
    }
    // The sign's range is checked once at the end, where i64::MIN has no
    // positive twin.
    let n = digits_u64(digits)?;
    match negative {
        false => i64::try_from(n).ok(),
        true if n <= i64::MIN.unsigned_abs() => Some((n as i64).wrapping_neg()),
        true => None,
    }
}

/// Whether `arg` is the option word `word` (ASCII letters) in any case. A
/// letter and only its other case give the lower-case letter once the case
/// bit (0x20) is set, so setting it on every byte and comparing is exact; a
/// word of up to eight letters is compared as one integer (the usual
/// acquire reads two or three words: `PX`, `LIMIT`, `READ`|`WRITE`).
#[inline(always)]
pub fn keyword(arg: &[u8], word: &[u8]) -> bool {
    debug_assert!(word.iter().all(u8::is_ascii_alphabetic));
    if arg.len() != word.len() {
        return false;
    }
    if word.len() > 8 {
        return arg.iter().zip(word).all(|(a, w)| a | 0x20 == w | 0x20);
    }
    let folded = |bytes: &[u8]| {
        let mut eight = [0u8; 8];
        eight[..bytes.len()].copy_from_slice(bytes);
        u64::from_le_bytes(eight) | u64::from_le_bytes([0x20; 8])
    };
    folded(arg) == folded(word)
}

/// The largest duration whose deadline still fits a signed 64-bit ms clock.
fn max_duration(now: i64) -> i64 {
    i64::MAX - now.max(0)
}

/// A count of permits: a positive integer that fits 32 bits.
fn positive_u32(arg: &[u8]) -> Option<u32> {
    plain_positive(arg).and_then(|n| u32::try_from(n).ok())
}

/// Parses the option words `grammar` allows: `[PX ms | EX s]`, for an
/// acquisition `[BLOCK ms] [KEEPALIVE]`, for a semaphore `[LIMIT n]`
/// `[PERMITS k]` (each at most once, any order, any case).
pub fn options<'a>(
    args: impl IntoIterator<Item = &'a [u8]>,
    grammar: Grammar,
    now: i64,
) -> Result<Options, &'static str> {
    let acquire = grammar.acquire;
    let mut opts = Options::default();
    let mut it = args.into_iter();
    while let Some(name) = it.next() {
        if acquire && keyword(name, b"KEEPALIVE") {
            if opts.keepalive {
                return Err(SYNTAX_ERR);
            }
            opts.keepalive = true;
            continue;
        }
        let value = it.next().ok_or(SYNTAX_ERR)?;
        let lease = keyword(name, b"PX") || keyword(name, b"EX");
        if grammar.limit && keyword(name, b"LIMIT") {
            if opts.limit.is_some() {
                return Err(SYNTAX_ERR);
            }
            opts.limit = Some(positive_u32(value).ok_or(LIMIT_ERR)?);
        } else if grammar.permits && keyword(name, b"PERMITS") {
            if opts.permits.is_some() {
                return Err(SYNTAX_ERR);
            }
            opts.permits = Some(positive_u32(value).ok_or(PERMITS_ERR)?);
        } else if grammar.lease && lease {
            if opts.lease_ms.is_some() {
                return Err(SYNTAX_ERR);
            }
            let n = plain_positive(value).ok_or(LEASE_ERR)?;
            let ms = if keyword(name, b"EX") {
                n.checked_mul(1000).ok_or(LEASE_ERR)?
            } else {
                n
            };
            if ms > max_duration(now) {
                return Err(LEASE_ERR);
            }
            opts.lease_ms = Some(ms);
        } else if acquire && keyword(name, b"BLOCK") {
            if opts.block_ms.is_some() {
                return Err(SYNTAX_ERR);
            }
            let ms = integer(value).filter(|n| *n >= 0).ok_or(TIMEOUT_ERR)?;
            if ms > max_duration(now) {
                return Err(TIMEOUT_ERR);
            }
            opts.block_ms = Some(ms);
        } else {
            return Err(SYNTAX_ERR);
        }
    }
    Ok(opts)
}

/// The options of most acquisitions, `PX ms` alone, read without the general
/// parser's loop (whose code was half of an uncontended acquire's parsing):
/// the lease, or `None` for anything else, which `options` reads (and
/// refuses, when it is wrong).
pub fn lease_alone(name: &[u8], value: &[u8], now: i64) -> Option<i64> {
    if !keyword(name, b"PX") {
        return None;
    }
    plain_positive(value).filter(|&ms| ms <= max_duration(now))
}

/// A positive integer written as Redis writes one (no sign, no leading
/// zero), or `None`: `integer` without its sign's branches, which every
/// acquire's lease would run through.
fn plain_positive(arg: &[u8]) -> Option<i64> {
    match arg {
        [b'1'..=b'9', ..] => i64::try_from(digits_u64(arg)?).ok(),
        _ => None,
    }
}

/// Up to 19 decimal digits (any more could overflow a u64; i64's limits
/// have 19), read without overflow checks.
#[inline(always)]
fn digits_u64(digits: &[u8]) -> Option<u64> {
    if digits.len() > 19 {
        return None;
    }
    let mut n: u64 = 0;
    for &d in digits {
        let d = d.wrapping_sub(b'0');
        if d > 9 {
            return None;
        }
        n = n * 10 + u64::from(d);
    }
    Some(n)
}

/// A semaphore's usual options, `LIMIT n PX ms`, read as `lease_alone` reads
/// `PX ms`: the limit and the lease, or `None` for anything else.
#[inline]
pub fn limit_and_lease(words: [&[u8]; 4], now: i64) -> Option<(u32, i64)> {
    let [name, limit, lease_name, lease] = words;
    if !keyword(name, b"LIMIT") {
        return None;
    }
    Some((positive_u32(limit)?, lease_alone(lease_name, lease, now)?))
}

/// `COUNT n` of `*.INFO`: how many readers or queued owners to list (n >= 0).
pub fn count(word: &[u8], value: &[u8]) -> Result<usize, &'static str> {
    if !keyword(word, b"COUNT") {
        return Err(SYNTAX_ERR);
    }
    integer(value)
        .filter(|n| *n >= 0)
        .map(|n| n as usize)
        .ok_or(COUNT_ERR)
}

/// `numkeys` of the multi-key commands: a positive integer, written as Redis
/// writes one (Redis reads it so for ACL and `COMMAND GETKEYS`).
pub fn numkeys(arg: &[u8]) -> Option<usize> {
    integer(arg).filter(|n| *n > 0).map(|n| n as usize)
}

#[inline]
pub fn mode(arg: &[u8]) -> Result<Mode, &'static str> {
    if keyword(arg, b"READ") {
        Ok(Mode::Read)
    } else if keyword(arg, b"WRITE") {
        Ok(Mode::Write)
    } else {
        Err(SYNTAX_ERR)
    }
}

pub fn owner(arg: &[u8]) -> Result<&[u8], &'static str> {
    if arg.is_empty() {
        Err(EMPTY_OWNER_ERR)
    } else {
        Ok(arg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i64 = 1_700_000_000_000;

    fn parse(args: &[&str]) -> Result<Options, &'static str> {
        let v: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        options(v, Grammar::ACQUIRE, NOW)
    }

    #[test]
    fn options_in_any_order_and_case() {
        assert_eq!(
            parse(&["block", "0", "Px", "250"]),
            Ok(Options {
                lease_ms: Some(250),
                block_ms: Some(0),
                ..Options::default()
            })
        );
        assert_eq!(parse(&["EX", "2"]).unwrap().lease_ms, Some(2000));
        assert_eq!(parse(&[]).unwrap(), Options::default());
    }

    /// `keyword` agrees with `eq_ignore_ascii_case` on every word the
    /// commands take, with any one byte replaced by any other, and on words
    /// one byte shorter or longer.
    #[test]
    fn keyword_is_case_insensitive_equality() {
        let words: [&[u8]; 10] = [
            b"PX",
            b"EX",
            b"LIMIT",
            b"PERMITS",
            b"BLOCK",
            b"COUNT",
            b"READ",
            b"WRITE",
            b"KEEPALIVE",
            b"X",
        ];
        for word in words {
            let lower = word.to_ascii_lowercase();
            let mut mixed = word.to_vec();
            mixed[0] = mixed[0].to_ascii_lowercase();
            for same in [word, &lower, &mixed] {
                assert!(keyword(same, word), "{:?}", String::from_utf8_lossy(same));
            }
            for at in 0..word.len() {
                for byte in 0..=255u8 {
                    let mut arg = word.to_vec();
                    arg[at] = byte;
                    assert_eq!(
                        keyword(&arg, word),
                        arg.eq_ignore_ascii_case(word),
                        "{arg:?}"
                    );
                }
            }
            let mut longer = word.to_vec();
            longer.push(word[0]);
            assert!(!keyword(&longer, word) && !keyword(&word[1..], word));
            assert!(!keyword(b"", word));
        }
    }

    #[test]
    fn keepalive_is_a_word_of_acquisitions_only() {
        assert!(parse(&["keepalive", "PX", "5"]).unwrap().keepalive);
        assert_eq!(parse(&["KEEPALIVE", "KEEPALIVE"]), Err(SYNTAX_ERR));
        let renew: Vec<&[u8]> = vec![b"KEEPALIVE"];
        assert_eq!(options(renew, Grammar::RENEW, NOW), Err(SYNTAX_ERR));
    }

    #[test]
    fn repeated_unknown_or_conflicting_options_are_syntax_errors() {
        for bad in [
            &["PX", "1", "PX", "2"][..],
            &["PX", "1", "EX", "2"],
            &["BLOCK", "1", "BLOCK", "2"],
            &["NX", "1"],
            &["PX"],
            &["BLOCK"],
        ] {
            assert_eq!(parse(bad), Err(SYNTAX_ERR), "{bad:?}");
        }
        let no_block: Vec<&[u8]> = vec![b"BLOCK", b"5"];
        assert_eq!(options(no_block, Grammar::RENEW, NOW), Err(SYNTAX_ERR));
    }

    #[test]
    fn ranges_are_checked() {
        for bad in [
            "0",
            "-1",
            "abc",
            "",
            "1.5",
            "+5",
            "01",
            "-0",
            "9223372036854775807",
            "99999999999999999999",
        ] {
            assert_eq!(parse(&["PX", bad]), Err(LEASE_ERR), "PX {bad}");
        }
        assert_eq!(parse(&["EX", "9223372036854775"]), Err(LEASE_ERR));
        assert_eq!(parse(&["BLOCK", "-1"]), Err(TIMEOUT_ERR));
        assert_eq!(parse(&["BLOCK", "9223372036854775807"]), Err(TIMEOUT_ERR));
        let max = (i64::MAX - NOW).to_string();
        assert_eq!(parse(&["PX", &max]).unwrap().lease_ms, Some(i64::MAX - NOW));
    }

    /// The usual options read without the loop mean what the loop reads;
    /// anything else is left to it.
    #[test]
    fn the_usual_options_read_as_the_general_parser_reads_them() {
        let words = [
            "PX",
            "px",
            "EX",
            "LIMIT",
            "limit",
            "PERMITS",
            "BLOCK",
            "0",
            "1",
            "5",
            "-1",
            "01",
            "30000",
            "4294967295",
            "4294967296",
            "9223372036854775807",
            "9223372036854775808",
            "1000000000000000000",
            "+5",
            "",
        ];
        for a in words {
            for b in words {
                let general = options([a.as_bytes(), b.as_bytes()], Grammar::ACQUIRE, NOW);
                match lease_alone(a.as_bytes(), b.as_bytes(), NOW) {
                    Some(ms) => assert_eq!(
                        general,
                        Ok(Options {
                            lease_ms: Some(ms),
                            ..Options::default()
                        }),
                        "{a} {b}"
                    ),
                    None => assert!(
                        !a.eq_ignore_ascii_case("PX") || general.is_err(),
                        "{a} {b}: {general:?}"
                    ),
                }
                for (c, d) in [("PX", "30000"), ("px", "0"), ("EX", "5"), (a, b)] {
                    let four = [a, b, c, d].map(str::as_bytes);
                    let general = options(four, Grammar::SEMAPHORE_ACQUIRE, NOW);
                    match limit_and_lease(four, NOW) {
                        Some((limit, ms)) => assert_eq!(
                            general,
                            Ok(Options {
                                lease_ms: Some(ms),
                                limit: Some(limit),
                                ..Options::default()
                            }),
                            "{a} {b} {c} {d}"
                        ),
                        None => assert!(
                            !(a.eq_ignore_ascii_case("LIMIT") && c.eq_ignore_ascii_case("PX"))
                                || general.is_err(),
                            "{a} {b} {c} {d}: {general:?}"
                        ),
                    }
                }
            }
        }
    }

    #[test]
    fn semaphore_words() {
        let sem = |args: &[&str], g| {
            let v: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
            options(v, g, NOW)
        };
        let o = sem(
            &["permits", "3", "LIMIT", "8", "PX", "5"],
            Grammar::SEMAPHORE_ACQUIRE,
        )
        .unwrap();
        assert_eq!(
            (o.limit, o.permits, o.lease_ms),
            (Some(8), Some(3), Some(5))
        );
        assert_eq!(
            sem(&["LIMIT", "4294967295"], Grammar::SEMAPHORE_ACQUIRE)
                .unwrap()
                .limit,
            Some(u32::MAX)
        );
        for bad in ["0", "-1", "-0", "+1", "01", "4294967296", "x", "1.5", ""] {
            assert_eq!(
                sem(&["LIMIT", bad], Grammar::SEMAPHORE_ACQUIRE),
                Err(LIMIT_ERR)
            );
            assert_eq!(
                sem(&["PERMITS", bad], Grammar::SEMAPHORE_RELEASE),
                Err(PERMITS_ERR)
            );
        }
        assert_eq!(
            sem(&["LIMIT", "1", "LIMIT", "1"], Grammar::SEMAPHORE_ACQUIRE),
            Err(SYNTAX_ERR)
        );
        assert_eq!(sem(&["LIMIT", "1"], Grammar::ACQUIRE), Err(SYNTAX_ERR));
        assert_eq!(
            sem(&["PX", "1"], Grammar::SEMAPHORE_RELEASE),
            Err(SYNTAX_ERR)
        );
        assert_eq!(sem(&["PERMITS", "2"], Grammar::RENEW), Err(SYNTAX_ERR));
    }

    /// The hand-written reader agrees with `str::parse` plus Redis's rules.
    #[test]
    fn integers_read_as_redis_writes_them() {
        let reference = |s: &str| -> Option<i64> {
            let odd =
                s.starts_with('+') || s.starts_with("-0") || (s.len() > 1 && s.starts_with('0'));
            s.parse().ok().filter(|_| !odd)
        };
        let mut cases: Vec<String> = [
            "",
            "-",
            "+",
            "0",
            "-0",
            "00",
            "01",
            "-01",
            "7",
            "-7",
            "+7",
            "1x",
            "x1",
            " 1",
            "1 ",
            "1.5",
            "9223372036854775807",
            "9223372036854775808",
            "-9223372036854775808",
            "-9223372036854775809",
            "99999999999999999999",
            "999999999999999999",
            "-999999999999999999",
            "1000000000000000000",
            "-1000000000000000000",
            "9999999999999999999",
            "-9999999999999999999",
            "18446744073709551615",
            "18446744073709551616",
            "3600000",
            "/",
            ":",
            "٣",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut seed = 0x9E3779B97F4A7C15u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let len = (seed % 21) as usize;
            let alphabet = b"-+0123456789/:x";
            let s: String = (0..len)
                .map(|i| alphabet[((seed >> (i * 3)) % alphabet.len() as u64) as usize] as char)
                .collect();
            cases.push(s);
        }
        for s in &cases {
            assert_eq!(integer(s.as_bytes()), reference(s), "{s:?}");
        }
    }

    #[test]
    fn numkeys_as_redis_reads_it() {
        assert_eq!(numkeys(b"2"), Some(2));
        for bad in [
            "0",
            "-1",
            "01",
            "+1",
            "1.0",
            "",
            "x",
            "99999999999999999999",
        ] {
            assert_eq!(numkeys(bad.as_bytes()), None, "{bad}");
        }
    }

    #[test]
    fn info_count() {
        assert_eq!(count(b"count", b"0"), Ok(0));
        assert_eq!(count(b"COUNT", b"25"), Ok(25));
        assert_eq!(count(b"LIMIT", b"5"), Err(SYNTAX_ERR));
        for bad in [&b"-1"[..], b"x", b"", b"1.5"] {
            assert_eq!(count(b"COUNT", bad), Err(COUNT_ERR));
        }
    }

    #[test]
    fn modes_and_owners() {
        assert_eq!(mode(b"read"), Ok(Mode::Read));
        assert_eq!(mode(b"WRITE"), Ok(Mode::Write));
        assert_eq!(mode(b"WRITER"), Err(SYNTAX_ERR));
        assert_eq!(owner(b""), Err(EMPTY_OWNER_ERR));
        assert_eq!(owner(b"\0x"), Ok(&b"\0x"[..]));
    }
}
