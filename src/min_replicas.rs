//! Does this master accept writes right now? (`min-replicas-to-write`)
//!
//! Redis refuses a write command with NOREPLICAS while fewer than
//! `min-replicas-to-write` replicas are online with a lag of at most
//! `min-replicas-max-lag` seconds. A hand-over made inside a command was
//! admitted by that check already; one made by the lease timer (a lease ended,
//! a waiter left the head, Redis expired the key) was not, so it asks here.
//!
//! Redis's own answer can be wrong after the server was frozen (SIGSTOP, a
//! long command), which is exactly when a deposed master wakes up:
//! - it recounts its "good replicas" only once a second (replicationCron) and
//!   when a replica attaches or leaves, so the count is stale until then;
//! - its lag is measured with its cached clock, stale until it ticks;
//! - it stamps a replica's REPLCONF ACK with the time it *reads* it. Acks a
//!   replica sent during the freeze (before it was promoted elsewhere and
//!   hung up) are read on waking and look brand new.
//!
//! So the verdict is recomputed here: a replica is good if its last ack, on
//! the real clock, is at most max-lag seconds old, where an ack read in the
//! second the server woke from a stall counts as sent when the stall began.
//! A live replica acks once a second, so it is good again a second or two
//! after the wake. Costs two INFO sections, paid only when min-replicas is
//! configured: on each cron tick and when a hand-over finds the verdict old.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use redis_module::raw;

use crate::ffi::{api, config_number, Ctx};
use crate::role::is_master;

/// The error a refused write gets (the text Redis uses).
pub const NOREPLICAS_ERR: &str = "NOREPLICAS Not enough good replicas to write.";

/// How long a verdict is used before it is recomputed.
const FRESH_MS: i64 = 250;
/// A gap this long between two sightings of the running event loop (its cron
/// ticks every 1000/hz ms) is a stall: acks read right after it are suspect.
const STALL_MS: i64 = 500;

static MIN_TO_WRITE: AtomicI64 = AtomicI64::new(0);
static MAX_LAG: AtomicI64 = AtomicI64::new(0);
static VERDICT: AtomicBool = AtomicBool::new(false);
static VERDICT_AT: AtomicI64 = AtomicI64::new(0);
/// The last time the event loop was seen running (unix ms).
static LAST_SEEN: AtomicI64 = AtomicI64::new(0);
/// The last stall: when it began and when the server woke (unix ms).
static STALL_FROM: AtomicI64 = AtomicI64::new(0);
static STALL_WOKE: AtomicI64 = AtomicI64::new(0);

/// Whether this master would refuse a write now for lack of good replicas.
/// Never true on a replica, or when min-replicas-to-write is off (one atomic
/// load then). Otherwise the verdict is recomputed on every cron tick and
/// whenever a replica attaches or leaves, and used while it is at most
/// `FRESH_MS` old; an older one (the server was frozen or busy) is recomputed
/// on the spot.
pub fn refuses_writes() -> bool {
    is_master() && configured() && judged_refusing()
}

/// `refuses_writes` once min-replicas-to-write is on: out of the line of
/// code of every write, which runs where it is off.
#[cold]
#[inline(never)]
fn judged_refusing() -> bool {
    let now = crate::ffi::now_ms();
    let at = VERDICT_AT.load(Ordering::Relaxed);
    if at != 0 && now >= at && now - at <= FRESH_MS {
        return VERDICT.load(Ordering::Relaxed);
    }
    judge(now)
}

/// The server cron ticked (hz times a second): note that the loop runs, and
/// refresh the verdict.
pub fn on_cron() {
    let now = crate::ffi::now_ms();
    if is_master() && configured() {
        judge(now);
    } else {
        LAST_SEEN.store(now, Ordering::Relaxed);
    }
}

/// A replica attached or left: the verdict must be recomputed.
pub fn replicas_changed() {
    VERDICT_AT.store(0, Ordering::Relaxed);
}

/// Reads min-replicas-to-write and min-replicas-max-lag (at load, and after
/// every CONFIG SET: the config-change event).
pub fn read_config(ctx: *mut Ctx) {
    // Unreadable (never seen on 7.0): the strictest reading, one replica within 10 s.
    let to_write = config_number(ctx, "min-replicas-to-write").unwrap_or(1);
    let lag = config_number(ctx, "min-replicas-max-lag").unwrap_or(10);
    MIN_TO_WRITE.store(to_write, Ordering::Relaxed);
    MAX_LAG.store(lag, Ordering::Relaxed);
    LAST_SEEN.store(crate::ffi::now_ms(), Ordering::Relaxed);
    replicas_changed();
}

fn configured() -> bool {
    MIN_TO_WRITE.load(Ordering::Relaxed) > 0 && MAX_LAG.load(Ordering::Relaxed) > 0
}

fn judge(now: i64) -> bool {
    observe(now);
    let refused = count_refuses(now);
    VERDICT.store(refused, Ordering::Relaxed);
    VERDICT_AT.store(now, Ordering::Relaxed);
    refused
}

/// Records a stall when the loop was not seen running for `STALL_MS`.
fn observe(now: i64) {
    let last = LAST_SEEN.swap(now, Ordering::Relaxed);
    if last == 0 || now - last <= STALL_MS {
        return;
    }
    // Stalls in a row (no second in between for a fresh ack) merge.
    let woke = STALL_WOKE.load(Ordering::Relaxed);
    if woke == 0 || last > woke + 1000 {
        STALL_FROM.store(last, Ordering::Relaxed);
    }
    STALL_WOKE.store(now, Ordering::Relaxed);
}

fn count_refuses(now: i64) -> bool {
    let to_write = MIN_TO_WRITE.load(Ordering::Relaxed);
    let Some(repl) = Info::get(c"replication") else {
        return true;
    };
    // Redis's own count first: it refuses while this is short.
    match repl.number("min_slaves_good_slaves") {
        Some(good) if good >= to_write => {}
        _ => return true,
    }
    let Some(cached_us) = Info::get(c"server").and_then(|s| s.number("server_time_usec")) else {
        return true;
    };
    let connected = repl.number("connected_slaves").unwrap_or(0).max(0);
    let lines: Vec<String> = (0..connected)
        .filter_map(|i| repl.text(&format!("slave{i}")))
        .collect();
    let clock = Clock {
        now_ms: now,
        cached_ms: cached_us / 1000,
        stall: Some((
            STALL_FROM.load(Ordering::Relaxed),
            STALL_WOKE.load(Ordering::Relaxed),
        ))
        .filter(|&(_, woke)| woke != 0),
    };
    let good = good_replicas(
        lines.iter().map(String::as_str),
        &clock,
        MAX_LAG.load(Ordering::Relaxed),
    );
    good < to_write
}

/// What the verdict knows about time: the real clock, Redis's cached clock
/// when INFO was taken, and the last stall (began, woke), all unix ms.
pub struct Clock {
    pub now_ms: i64,
    pub cached_ms: i64,
    pub stall: Option<(i64, i64)>,
}

/// Replicas that count as good: online, and whose last acknowledgement is at
/// most `max_lag` s old on the real clock. `lines` are the INFO replica lines.
pub fn good_replicas<'a>(lines: impl Iterator<Item = &'a str>, clock: &Clock, max_lag: i64) -> i64 {
    let now_s = clock.now_ms / 1000;
    lines
        .filter_map(replica_line)
        .filter(|&lag| {
            // Redis counts lag in whole seconds of its cached unix time.
            let mut ack_s = clock.cached_ms / 1000 - lag;
            if let Some((from, woke)) = clock.stall {
                if ack_s <= woke / 1000 {
                    ack_s = ack_s.min(from / 1000);
                }
            }
            now_s - ack_s <= max_lag
        })
        .count() as i64
}

/// One `slaveN:ip=..,port=..,state=online,offset=..,lag=..` line: the lag in
/// seconds of an online replica, None for any other.
fn replica_line(line: &str) -> Option<i64> {
    let mut online = false;
    let mut lag = None;
    for kv in line.split(',') {
        match kv.split_once('=') {
            Some(("state", v)) => online = v == "online",
            Some(("lag", v)) => lag = v.trim().parse().ok(),
            _ => {}
        }
    }
    lag.filter(|_| online)
}

struct Info(*mut raw::RedisModuleServerInfoData);

impl Info {
    fn get(section: &std::ffi::CStr) -> Option<Info> {
        let p = unsafe { api!(RedisModule_GetServerInfo)(std::ptr::null_mut(), section.as_ptr()) };
        (!p.is_null()).then_some(Info(p))
    }

    fn text(&self, field: &str) -> Option<String> {
        let name = std::ffi::CString::new(field).ok()?;
        let p = unsafe { api!(RedisModule_ServerInfoGetFieldC)(self.0, name.as_ptr()) };
        if p.is_null() {
            return None;
        }
        Some(
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    fn number(&self, field: &str) -> Option<i64> {
        self.text(field)?.trim().parse().ok()
    }
}

impl Drop for Info {
    fn drop(&mut self) {
        unsafe { api!(RedisModule_FreeServerInfo)(std::ptr::null_mut(), self.0) };
    }
}

#[cfg(test)]
mod tests {
    use super::{good_replicas, Clock};

    const LINES: [&str; 3] = [
        "ip=127.0.0.1,port=7001,state=online,offset=100,lag=0",
        "ip=127.0.0.1,port=7002,state=online,offset=90,lag=1",
        "ip=127.0.0.1,port=7003,state=wait_bgsave,offset=0,lag=0",
    ];
    const NOW: i64 = 1_700_000_010_000;

    fn good(cached_ms: i64, stall: Option<(i64, i64)>, max_lag: i64) -> i64 {
        let clock = Clock {
            now_ms: NOW,
            cached_ms,
            stall,
        };
        good_replicas(LINES.iter().copied(), &clock, max_lag)
    }

    #[test]
    fn replica_lag_counts_the_time_redis_has_not_seen() {
        // Fresh cached clock: both online replicas are within a 1 s lag.
        assert_eq!(good(NOW, None, 1), 2);
        // Redis's clock is 1 s stale (the server was frozen): the one with
        // lag 1 is really 2 s behind.
        assert_eq!(good(NOW - 1000, None, 1), 1);
        // Frozen for 6 s: nobody is good any more.
        assert_eq!(good(NOW - 6000, None, 1), 0);
        assert_eq!(good(NOW - 6000, None, 10), 2);
        let clock = Clock {
            now_ms: NOW,
            cached_ms: NOW,
            stall: None,
        };
        assert_eq!(good_replicas(["garbage"].into_iter(), &clock, 10), 0);
    }

    #[test]
    fn acks_read_on_waking_from_a_stall_date_from_its_start() {
        // Woke just now from a 3 s stall: "lag 0" means the ack was read on
        // waking, so it may have been sent 3 s ago.
        let woke_now = Some((NOW - 3000, NOW));
        assert_eq!(good(NOW, woke_now, 1), 0);
        assert_eq!(good(NOW, woke_now, 3), 2);
        // A second after that wake, a fresh ack (lag 0) counts again; the
        // replica with lag 1 was read in the wake second and still does not.
        let woke_before = Some((NOW - 4000, NOW - 1000));
        assert_eq!(good(NOW, woke_before, 1), 1);
        // A short stall long ago changes nothing.
        assert_eq!(good(NOW, Some((NOW - 60_600, NOW - 60_000)), 1), 2);
    }
}
