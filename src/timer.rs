//! The Redis module timers of the lease schedule, the BLOCK deadlines and the
//! KEEPALIVE renewals: each keeps one timer armed for its earliest work, and
//! every one of them is armed here, never more than `MAX_DELAY_MS` ahead (a
//! timer that fires before its work is due finds nothing to do and is armed
//! again), for two limits of Redis's own:
//! - Redis arms a module timer at `now + delay * 1000` microseconds: a delay
//!   near 2^64 / 1000 ms (a KEEPALIVE renewal is a third of a lease a client
//!   may ask for) wraps into the past, and a timer in the past fires again as
//!   soon as its callback re-arms it: the server never leaves its timer loop.
//! - Redis 7.0 reschedules the event-loop timer that serves every module timer
//!   in a C `int` of microseconds (`ae.c`, the time proc's return value times
//!   1000): when the next module timer is more than 2,147,483 ms (35.8
//!   minutes) ahead, that overflows into the past and the event loop spins at
//!   full CPU until the timer comes within range. Redis 8.2 and Valkey 8.1
//!   compute it in 64 bits.

use std::os::raw::c_void;

use redis_module::raw;

use crate::ffi::{api, Ctx};

/// Longest single wait of a Redis timer (20 minutes, clear of Redis 7.0's
/// 35.8).
pub const MAX_DELAY_MS: i64 = 1_200_000;
const _: () = assert!(MAX_DELAY_MS * 1000 <= i32::MAX as i64);

pub type Callback = unsafe extern "C" fn(*mut Ctx, *mut c_void);

/// A Redis timer as armed.
#[derive(Clone, Copy, Debug)]
pub struct Armed {
    pub id: raw::RedisModuleTimerID,
    /// The unix millisecond of the work it is for.
    pub due: i64,
    /// The delay Redis was given (0: it fires on this turn of the event loop).
    pub delay_ms: i64,
    /// The unix microsecond Redis was asked to fire it at.
    pub fires_at_us: i64,
}

/// For work due at the millisecond `due`: `None` when the armed timer already
/// fires for it or earlier; otherwise the timer to replace, taken out of
/// `armed` (`Some(None)` when none is armed).
pub fn take_for(armed: &mut Option<Armed>, due: i64) -> Option<Option<Armed>> {
    match armed {
        Some(a) if a.due <= due => None,
        _ => Some(armed.take()),
    }
}

/// Stops `old` and arms `on_fire` for the work due at the unix millisecond
/// `due`: at its first microsecond or after (the delay is rounded up), at once
/// if it has begun, in `MAX_DELAY_MS` at most.
pub fn arm(ctx: *mut Ctx, old: Option<Armed>, due: i64, on_fire: Callback) -> Armed {
    stop(ctx, old);
    let now_us = crate::ffi::micros();
    let delay_ms = capped(delay_until(due, now_us));
    let id = unsafe {
        api!(RedisModule_CreateTimer)(ctx, delay_ms, Some(on_fire), std::ptr::null_mut())
    };
    Armed {
        id,
        due,
        delay_ms,
        fires_at_us: now_us + delay_ms * 1000,
    }
}

/// Stops `armed`, if it is a timer.
pub fn stop(ctx: *mut Ctx, armed: Option<Armed>) {
    if let Some(a) = armed {
        unsafe { api!(RedisModule_StopTimer)(ctx, a.id, std::ptr::null_mut()) };
    }
}

/// Whole milliseconds from the unix microsecond `now_us` until the millisecond
/// `due` begins, rounded up.
fn delay_until(due: i64, now_us: i64) -> i64 {
    let ahead_us = due.saturating_mul(1000).saturating_sub(now_us);
    ahead_us / 1000 + i64::from(ahead_us % 1000 > 0)
}

fn capped(delay_ms: i64) -> i64 {
    delay_ms.clamp(0, MAX_DELAY_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn armed(due: i64) -> Option<Armed> {
        Some(Armed {
            id: 7,
            due,
            delay_ms: 1,
            fires_at_us: due * 1000,
        })
    }

    #[test]
    fn a_timer_is_replaced_only_for_earlier_work() {
        let mut t = armed(100);
        assert!(take_for(&mut t, 100).is_none());
        assert!(take_for(&mut t, 150).is_none());
        assert_eq!(t.unwrap().due, 100);
        assert_eq!(take_for(&mut t, 99).unwrap().unwrap().due, 100);
        assert!(t.is_none());
        assert!(matches!(take_for(&mut t, 5), Some(None)));
    }

    #[test]
    fn the_delay_reaches_the_first_microsecond_of_the_due_millisecond() {
        assert_eq!(delay_until(1_000, 999_000), 1);
        assert_eq!(delay_until(1_000, 999_001), 1);
        assert_eq!(delay_until(1_000, 998_999), 2);
        assert_eq!(delay_until(1_000, 1_000_000), 0);
        assert_eq!(delay_until(1_000, 1_000_500), 0);
        assert_eq!(delay_until(1_000, 2_000_000), -1000);
        assert!(delay_until(i64::MAX, 1_800_000_000_000_000) > 0);
    }

    #[test]
    fn no_delay_reaches_the_range_where_redis_wraps_it() {
        assert_eq!(capped(-5), 0);
        assert_eq!(capped(250), 250);
        for huge in [
            MAX_DELAY_MS + 1,
            3_600_000,
            (u64::MAX / 1000) as i64,
            i64::MAX / 3,
            i64::MAX,
        ] {
            let d = capped(huge);
            assert_eq!(d, MAX_DELAY_MS);
            assert!(d.checked_mul(1000).is_some());
        }
    }
}
