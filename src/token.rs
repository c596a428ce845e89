//! Fencing tokens: module-wide, strictly increasing, never below `unix_ms << 20`.
//!
//! The clock floor is what keeps tokens increasing across a restart that lost
//! the newest grants (nothing persisted, or an AOF without the RDB preamble):
//! any later millisecond starts above every token issued before it, as long as
//! fewer than 2^20 tokens are issued in one millisecond.

use std::sync::atomic::{AtomicU64, Ordering};

const CLOCK_SHIFT: u32 = 20;

/// The largest valid token: tokens travel as RESP integers, which are signed.
pub const MAX: u64 = i64::MAX as u64;

/// How far a token from elsewhere (a master, an RDB file, RESTORE) may run
/// ahead of this server's clock floor before it counts as invalid input: one
/// year, far more than any clock skew, far less than the range left (the clock
/// floor reaches `MAX` in the year 2248).
const AHEAD_MS: i64 = 365 * 24 * 3600 * 1000;

static LAST: AtomicU64 = AtomicU64::new(0);

/// The next token after `last` at unix time `now_ms`.
pub fn next(last: u64, now_ms: i64) -> u64 {
    let floor = (now_ms.max(0) as u64) << CLOCK_SHIFT;
    last.saturating_add(1).max(floor)
}

/// Issues a token, or none once the range is used up (a grant is then refused
/// rather than handing out a token that wraps or goes negative).
/// Main thread only (commands, timers), like every grant.
pub fn issue(now_ms: i64) -> Option<u64> {
    let token = next(LAST.load(Ordering::Relaxed), now_ms);
    if token > MAX {
        return None;
    }
    LAST.store(token, Ordering::Relaxed);
    crate::stats::bump(&crate::stats::TOKENS_ISSUED, 1);
    Some(token)
}

/// The largest token a loader or a replicated change may carry at `now_ms`.
pub fn max_accepted(now_ms: i64) -> u64 {
    let ms = now_ms.clamp(0, i64::MAX - AHEAD_MS) + AHEAD_MS;
    ((ms as u64).saturating_mul(1 << CLOCK_SHIFT)).min(MAX)
}

/// Records a token issued elsewhere (by the master, or found in RDB/AOF) so
/// this server never issues it or anything below it.
pub fn observe(token: u64) {
    LAST.fetch_max(token, Ordering::Relaxed);
}

pub fn last() -> u64 {
    LAST.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_is_a_floor_and_tokens_strictly_increase() {
        let now = 1_700_000_000_000;
        let t1 = next(0, now);
        assert_eq!(t1, (now as u64) << 20);
        let t2 = next(t1, now);
        assert_eq!(t2, t1 + 1);
        // A restart that forgot t2 still issues above it one millisecond later.
        assert!(next(0, now + 1) > t2);
        // A clock that went backwards cannot lower tokens.
        assert_eq!(next(t2, now - 10_000), t2 + 1);
        assert_eq!(next(u64::MAX, now), u64::MAX);
    }

    #[test]
    fn accepted_tokens_stay_near_the_clock_and_in_range() {
        let now = 1_700_000_000_000;
        let max = max_accepted(now);
        assert!(max > next(0, now) && max < (((now + AHEAD_MS + 1) as u64) << 20));
        assert_eq!(max_accepted(i64::MAX), MAX);
        assert!(max_accepted(-5) > 0);
    }
}
