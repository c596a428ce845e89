//! What this server is right now, cached from server events so the hot path
//! does not ask Redis (RM_GetContextFlags computes many flags per call):
//! master or replica, loading or not, and whether effects have anywhere to go.
//!
//! Propagation: Redis drops a replicated effect when AOF is off and there is
//! neither a replica nor a replication backlog. Building `RLOCK.SETSTATE` for
//! nothing was half the cost of an acquire, so it is skipped until the first
//! sign of a listener, and then always made (the flag never clears):
//! - at load: AOF on, this server a replica, or replicas/backlog present;
//! - on every fork: a replica's full sync forks before any later command runs,
//!   and the commands before the fork are inside the snapshot it receives;
//! - on any replica or role change.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use redis_module::raw;

use crate::ffi::{api, ctx_flags, Ctx};

static MASTER: AtomicBool = AtomicBool::new(true);
static LOADING: AtomicBool = AtomicBool::new(false);
static PROPAGATE: AtomicBool = AtomicBool::new(false);

pub fn is_master() -> bool {
    MASTER.load(Ordering::Relaxed)
}

pub fn is_loading() -> bool {
    LOADING.load(Ordering::Relaxed)
}

/// Whether replicated effects can reach a replica or the AOF.
pub fn propagates() -> bool {
    PROPAGATE.load(Ordering::Relaxed)
}

pub fn set_loading(loading: bool) {
    LOADING.store(loading, Ordering::Relaxed);
}

/// A replica attached or left, or the role changed: effects go out from now on.
pub fn listener_seen() {
    PROPAGATE.store(true, Ordering::Relaxed);
}

/// Re-reads the role and looks for listeners (at load, on fork, on role change).
pub fn refresh(ctx: *mut Ctx) {
    let flags = ctx_flags(ctx);
    MASTER.store(
        flags & raw::REDISMODULE_CTX_FLAGS_MASTER != 0,
        Ordering::Relaxed,
    );
    LOADING.store(
        flags & raw::REDISMODULE_CTX_FLAGS_LOADING != 0,
        Ordering::Relaxed,
    );
    let aof_or_replica = raw::REDISMODULE_CTX_FLAGS_AOF | raw::REDISMODULE_CTX_FLAGS_SLAVE;
    if flags & aof_or_replica != 0 || replicas_or_backlog(ctx) {
        listener_seen();
    }
}

fn replicas_or_backlog(ctx: *mut Ctx) -> bool {
    unsafe {
        let info = api!(RedisModule_GetServerInfo)(ctx, c"replication".as_ptr());
        if info.is_null() {
            return true;
        }
        let field = |name: &std::ffi::CStr| {
            let mut err = 0;
            let v = api!(RedisModule_ServerInfoGetFieldSigned)(info, name.as_ptr(), &mut err);
            // An unknown field counts as "maybe": better to replicate for nothing.
            if err != 0 {
                1
            } else {
                v
            }
        };
        let found = field(c"connected_slaves") > 0 || field(c"repl_backlog_active") != 0;
        api!(RedisModule_FreeServerInfo)(ctx, info);
        found
    }
}

// ---------------------------------------------------------------------------
// Does the master accept writes right now? (min-replicas-to-write)
//
// Redis refuses a write command with NOREPLICAS while fewer than
// `min-replicas-to-write` replicas are online with a lag of at most
// `min-replicas-max-lag` seconds. A hand-over made inside a command was
// admitted by that check already; one made by the lease timer (a lease ended,
// a waiter left the head, Redis expired the key) was not, so it asks here.
//
// Redis recounts its "good replicas" only once a second (replicationCron) and
// when a replica attaches or leaves, with its cached clock. After the server
// was frozen (SIGSTOP, a long command) the count is stale until the cron runs:
// it still says "good" for replicas that have not acknowledged anything for the
// whole freeze. So the lag is recomputed here against the real clock:
// lag = (INFO lag) + (now - INFO server_time_usec), and the stricter of this
// and Redis's own count decides. Costs two INFO sections, paid only when
// min-replicas is configured and a waiter is about to be granted.

static MIN_TO_WRITE: AtomicI64 = AtomicI64::new(0);
static MAX_LAG: AtomicI64 = AtomicI64::new(0);

fn config_number(ctx: *mut Ctx, name: &str) -> Option<i64> {
    use redis_module::{Context, RedisValue};
    let reply = Context::new(ctx).call("CONFIG", &["GET", name][..]).ok()?;
    let RedisValue::Array(items) = reply else {
        return None;
    };
    match items.get(1)? {
        RedisValue::SimpleString(s) | RedisValue::BulkString(s) => s.parse().ok(),
        RedisValue::BulkRedisString(s) => s.try_as_str().ok()?.parse().ok(),
        RedisValue::StringBuffer(b) => std::str::from_utf8(b).ok()?.parse().ok(),
        RedisValue::Integer(i) => Some(*i),
        _ => None,
    }
}

/// Reads min-replicas-to-write and min-replicas-max-lag (at load, and after
/// every CONFIG SET: the config-change event).
pub fn read_min_replicas(ctx: *mut Ctx) {
    // Unreadable (never seen on 7.0): the strictest reading, one replica within 10 s.
    let to_write = config_number(ctx, "min-replicas-to-write").unwrap_or(1);
    let lag = config_number(ctx, "min-replicas-max-lag").unwrap_or(10);
    MIN_TO_WRITE.store(to_write, Ordering::Relaxed);
    MAX_LAG.store(lag, Ordering::Relaxed);
    replicas_changed();
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

/// One `slaveN:ip=..,port=..,state=online,offset=..,lag=..` line: (online, lag s).
fn replica_line(line: &str) -> (bool, Option<i64>) {
    let mut online = false;
    let mut lag = None;
    for kv in line.split(',') {
        match kv.split_once('=') {
            Some(("state", v)) => online = v == "online",
            Some(("lag", v)) => lag = v.trim().parse().ok(),
            _ => {}
        }
    }
    (online, lag)
}

/// Replicas that count as good at unix time `now_ms`: online, and whose last
/// acknowledgement is at most `max_lag` s old on the real clock. `lines` are
/// the INFO replica lines, taken when Redis's cached clock read `cached_ms`.
pub fn good_replicas<'a>(
    lines: impl Iterator<Item = &'a str>,
    now_ms: i64,
    cached_ms: i64,
    max_lag: i64,
) -> i64 {
    // Redis counts lag in whole seconds of its cached unix time.
    let stale_s = (now_ms / 1000 - cached_ms / 1000).max(0);
    lines
        .map(replica_line)
        .filter(|(online, lag)| *online && lag.is_some_and(|l| l + stale_s <= max_lag))
        .count() as i64
}

/// Whether this master would refuse a write now for lack of good replicas.
/// Never true on a replica, or when min-replicas-to-write is off (one atomic
/// load then). Otherwise the verdict is recomputed on every server cron tick
/// (`on_cron`) and whenever a replica attaches or leaves, and used while it is
/// at most `FRESH_MS` old; an older one (the server was frozen or busy) is
/// recomputed on the spot.
pub fn refuses_writes() -> bool {
    if !is_master() || !min_replicas_configured() {
        return false;
    }
    let now = crate::ffi::now_ms();
    let at = VERDICT_AT.load(Ordering::Relaxed);
    if at != 0 && now >= at && now - at <= FRESH_MS {
        return VERDICT.load(Ordering::Relaxed);
    }
    judge(now)
}

/// The server cron ticked (hz times a second): refresh the verdict.
pub fn on_cron() {
    if is_master() && min_replicas_configured() {
        judge(crate::ffi::now_ms());
    }
}

/// A replica attached or left: the verdict must be recomputed.
pub fn replicas_changed() {
    VERDICT_AT.store(0, Ordering::Relaxed);
}

/// The error a refused write gets (the text Redis uses).
pub const NOREPLICAS_ERR: &str = "NOREPLICAS Not enough good replicas to write.";

const FRESH_MS: i64 = 250;
static VERDICT: AtomicBool = AtomicBool::new(false);
static VERDICT_AT: AtomicI64 = AtomicI64::new(0);

fn min_replicas_configured() -> bool {
    MIN_TO_WRITE.load(Ordering::Relaxed) > 0 && MAX_LAG.load(Ordering::Relaxed) > 0
}

fn judge(now: i64) -> bool {
    let refused = count_refuses(now);
    VERDICT.store(refused, Ordering::Relaxed);
    VERDICT_AT.store(now, Ordering::Relaxed);
    refused
}

fn count_refuses(now: i64) -> bool {
    let to_write = MIN_TO_WRITE.load(Ordering::Relaxed);
    let max_lag = MAX_LAG.load(Ordering::Relaxed);
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
    let good = good_replicas(
        lines.iter().map(String::as_str),
        now,
        cached_us / 1000,
        max_lag,
    );
    good < to_write
}

#[cfg(test)]
mod tests {
    use super::good_replicas;

    #[test]
    fn replica_lag_counts_the_time_redis_has_not_seen() {
        let lines = [
            "ip=127.0.0.1,port=7001,state=online,offset=100,lag=0",
            "ip=127.0.0.1,port=7002,state=online,offset=90,lag=1",
            "ip=127.0.0.1,port=7003,state=wait_bgsave,offset=0,lag=0",
        ];
        let now = 1_700_000_010_000;
        // Fresh cached clock: both online replicas are within a 1 s lag.
        assert_eq!(good_replicas(lines.iter().copied(), now, now, 1), 2);
        // Redis's clock is 1 s stale (the server was frozen): the one with
        // lag 1 is really 2 s behind.
        assert_eq!(good_replicas(lines.iter().copied(), now, now - 1000, 1), 1);
        // Frozen for 6 s: nobody is good any more.
        assert_eq!(good_replicas(lines.iter().copied(), now, now - 6000, 1), 0);
        assert_eq!(good_replicas(lines.iter().copied(), now, now - 6000, 10), 2);
        assert_eq!(good_replicas(["garbage"].into_iter(), now, now, 10), 0);
    }
}
