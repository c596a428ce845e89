//! Fencing tokens: module-wide, strictly increasing, ordered by epoch.
//!
//! An *epoch* is one stretch of this server's life as a token source: it
//! starts when the module loads, when loading a dataset ends (restart, full
//! sync, `DEBUG RELOAD`) and when the server is promoted to master. At an
//! epoch start the clock is applied once, as a floor: the next token is at
//! least `unix_ms << 20` of that moment. Within an epoch tokens count up by one
//! per grant, whatever the clock does afterwards.
//!
//! Why the clock only at epoch starts: tokens are then ordered by when their
//! epoch began, not by when they were issued. A master deposed in a split brain
//! keeps counting from its own (older) epoch start, so every token it issues
//! after the promotion stays below `promotion_ms << 20`, where the new master's
//! tokens start; the two never meet. This holds while a master issues on
//! average fewer than 2^20 tokens per millisecond of its epoch (its count
//! cannot catch up with the clock), and while clocks of the nodes differ by
//! less than the age of the deposed master's epoch. The same floor keeps a
//! restart that lost the newest grants (nothing persisted) from repeating a
//! token: the new epoch starts above everything the previous one counted to.
//! A replica records the tokens it receives (`observe`), so a promoted replica
//! also starts above every grant that reached it.

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

/// The clock floor of an epoch starting at unix time `now_ms`.
pub fn floor(now_ms: i64) -> u64 {
    (now_ms.max(0) as u64) << CLOCK_SHIFT
}

/// `last` after an epoch starts at `now_ms`: the next token is at least the floor.
pub fn epoch_start(last: u64, now_ms: i64) -> u64 {
    last.max(floor(now_ms).saturating_sub(1))
}

/// The next token after `last` within an epoch.
pub fn next(last: u64) -> u64 {
    last.saturating_add(1)
}

/// Starts a new epoch now (module load, end of loading, promotion).
pub fn start_epoch(now_ms: i64) {
    let last = LAST.load(Ordering::Relaxed);
    LAST.store(epoch_start(last, now_ms), Ordering::Relaxed);
}

/// Issues a token, or none once the range is used up (a grant is then refused
/// rather than handing out a token that wraps or goes negative).
/// Main thread only (commands, timers), like every grant.
/// The clock is not read here: it applies only when an epoch starts.
pub fn issue(_now_ms: i64) -> Option<u64> {
    let token = next(LAST.load(Ordering::Relaxed));
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
    // A load observes millions of tokens, few of them a new maximum: the
    // locked read-modify-write only for those (it took 40% of `rdb_load`'s
    // own samples in a perf of an RDB load).
    if token > LAST.load(Ordering::Relaxed) {
        LAST.fetch_max(token, Ordering::Relaxed);
    }
}

pub fn last() -> u64 {
    LAST.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server's token source: (last token) with the epoch rule applied.
    struct Source(u64);

    impl Source {
        fn boot(now: i64) -> Self {
            Source(epoch_start(0, now))
        }
        fn issue(&mut self) -> u64 {
            self.0 = next(self.0);
            self.0
        }
        fn observe(&mut self, t: u64) {
            self.0 = self.0.max(t);
        }
        fn promote(&mut self, now: i64) {
            self.0 = epoch_start(self.0, now);
        }
    }

    #[test]
    fn epoch_starts_at_the_clock_floor_then_counts() {
        let now = 1_700_000_000_000;
        let mut s = Source::boot(now);
        let t1 = s.issue();
        assert_eq!(t1, floor(now));
        // Later grants count by one, whatever the clock says.
        assert_eq!(s.issue(), t1 + 1);
        assert_eq!(s.issue(), t1 + 2);
        // An epoch start never lowers tokens (a clock that went backwards).
        s.promote(now - 10_000);
        assert_eq!(s.issue(), t1 + 3);
        assert_eq!(next(u64::MAX), u64::MAX);
        assert_eq!(epoch_start(u64::MAX, now), u64::MAX);
    }

    #[test]
    fn restart_without_persistence_never_repeats() {
        let boot = 1_700_000_000_000;
        let mut s = Source::boot(boot);
        // Up to 2^20 - 1 grants per ms on average over a 5 ms epoch.
        let mut last = 0;
        for _ in 0..(5 << 20) - 1 {
            last = s.issue();
        }
        // Restarted 5 ms after boot with nothing persisted.
        let mut restarted = Source::boot(boot + 5);
        assert!(restarted.issue() > last);
    }

    #[test]
    fn promoted_replica_outranks_the_deposed_master_forever_after() {
        let boot = 1_700_000_000_000;
        let mut old = Source::boot(boot);
        let mut replica = Source::boot(boot + 1);
        for _ in 0..1000 {
            let t = old.issue();
            replica.observe(t);
        }
        // Split brain: the replica is promoted 2 ms after the old master's
        // epoch began, and the old master keeps granting as fast as the rule
        // allows (2^20 - 1 tokens per ms of its epoch, on average).
        let promotion = boot + 2;
        replica.promote(promotion);
        let first_new = replica.issue();
        assert_eq!(first_new, floor(promotion));
        let budget = (((promotion - boot) as u64) << 20) - 1000 - 1;
        let old_tokens: Vec<u64> = (0..budget).map(|_| old.issue()).collect();
        let new_tokens: Vec<u64> = (0..1000).map(|_| replica.issue()).collect();
        let max_old = *old_tokens.last().unwrap();
        assert!(max_old < first_new, "{max_old} >= {first_new}");
        assert!(new_tokens.iter().all(|t| *t > max_old));
        // And no token is issued by both.
        assert!(new_tokens
            .iter()
            .all(|t| old_tokens.binary_search(t).is_err()));
    }

    #[test]
    fn replica_promoted_before_the_clock_catches_up_stays_above_what_it_saw() {
        // The old master issued far ahead of the clock (a burst): the promoted
        // replica starts above every token it received, not at the clock.
        let boot = 1_700_000_000_000;
        let mut replica = Source::boot(boot);
        let seen = floor(boot + 50);
        replica.observe(seen);
        replica.promote(boot + 10);
        assert_eq!(replica.issue(), seen + 1);
    }

    #[test]
    fn accepted_tokens_stay_near_the_clock_and_in_range() {
        let now = 1_700_000_000_000;
        let max = max_accepted(now);
        assert!(max > floor(now) && max < (((now + AHEAD_MS + 1) as u64) << 20));
        assert_eq!(max_accepted(i64::MAX), MAX);
        assert!(max_accepted(-5) > 0);
    }
}
