//! Argument parsing shared by every lock command. Pure: bytes in, typed
//! request or a Redis-style error out, so a malformed call never touches a key.

use crate::lock::Mode;

pub const SYNTAX_ERR: &str = "ERR syntax error";
pub const LEASE_ERR: &str = "ERR lease is not an integer or out of range";
pub const TIMEOUT_ERR: &str = "ERR timeout is not an integer or out of range";
pub const EMPTY_OWNER_ERR: &str = "ERR owner must not be empty";
pub const COUNT_ERR: &str = "ERR count is not an integer or out of range";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Options {
    /// Lease in milliseconds, when PX or EX was given.
    pub lease_ms: Option<i64>,
    /// BLOCK timeout in milliseconds (0: wait forever).
    pub block_ms: Option<i64>,
    /// KEEPALIVE: the server renews the holding while the connection is open.
    pub keepalive: bool,
}

fn integer(arg: &[u8]) -> Option<i64> {
    let s = std::str::from_utf8(arg).ok()?;
    if s.starts_with('+') || (s.len() > 1 && s.starts_with('0')) || s.starts_with("-0") {
        return None;
    }
    s.parse().ok()
}

/// The largest duration whose deadline still fits a signed 64-bit ms clock.
fn max_duration(now: i64) -> i64 {
    i64::MAX - now.max(0)
}

/// Parses `[PX ms | EX s]`, and for an acquisition `[BLOCK ms] [KEEPALIVE]`
/// (each at most once, any order, any case).
pub fn options<'a>(
    args: impl IntoIterator<Item = &'a [u8]>,
    acquire: bool,
    now: i64,
) -> Result<Options, &'static str> {
    let mut opts = Options {
        lease_ms: None,
        block_ms: None,
        keepalive: false,
    };
    let mut it = args.into_iter();
    while let Some(name) = it.next() {
        if acquire && name.eq_ignore_ascii_case(b"KEEPALIVE") {
            if opts.keepalive {
                return Err(SYNTAX_ERR);
            }
            opts.keepalive = true;
            continue;
        }
        let value = it.next().ok_or(SYNTAX_ERR)?;
        if name.eq_ignore_ascii_case(b"PX") || name.eq_ignore_ascii_case(b"EX") {
            if opts.lease_ms.is_some() {
                return Err(SYNTAX_ERR);
            }
            let n = integer(value).filter(|n| *n > 0).ok_or(LEASE_ERR)?;
            let ms = if name.eq_ignore_ascii_case(b"EX") {
                n.checked_mul(1000).ok_or(LEASE_ERR)?
            } else {
                n
            };
            if ms > max_duration(now) {
                return Err(LEASE_ERR);
            }
            opts.lease_ms = Some(ms);
        } else if acquire && name.eq_ignore_ascii_case(b"BLOCK") {
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

/// `COUNT n` of `*.INFO`: how many readers or queued owners to list (n >= 0).
pub fn count(word: &[u8], value: &[u8]) -> Result<usize, &'static str> {
    if !word.eq_ignore_ascii_case(b"COUNT") {
        return Err(SYNTAX_ERR);
    }
    integer(value)
        .filter(|n| *n >= 0)
        .map(|n| n as usize)
        .ok_or(COUNT_ERR)
}

pub fn mode(arg: &[u8]) -> Result<Mode, &'static str> {
    if arg.eq_ignore_ascii_case(b"READ") {
        Ok(Mode::Read)
    } else if arg.eq_ignore_ascii_case(b"WRITE") {
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
        options(v, true, NOW)
    }

    #[test]
    fn options_in_any_order_and_case() {
        assert_eq!(
            parse(&["block", "0", "Px", "250"]),
            Ok(Options {
                lease_ms: Some(250),
                block_ms: Some(0),
                keepalive: false,
            })
        );
        assert_eq!(parse(&["EX", "2"]).unwrap().lease_ms, Some(2000));
        assert_eq!(
            parse(&[]).unwrap(),
            Options {
                lease_ms: None,
                block_ms: None,
                keepalive: false,
            }
        );
    }

    #[test]
    fn keepalive_is_a_word_of_acquisitions_only() {
        assert!(parse(&["keepalive", "PX", "5"]).unwrap().keepalive);
        assert_eq!(parse(&["KEEPALIVE", "KEEPALIVE"]), Err(SYNTAX_ERR));
        let renew: Vec<&[u8]> = vec![b"KEEPALIVE"];
        assert_eq!(options(renew, false, NOW), Err(SYNTAX_ERR));
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
        assert_eq!(options(no_block, false, NOW), Err(SYNTAX_ERR));
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
